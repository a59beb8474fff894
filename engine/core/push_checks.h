// What both front doors' pack and unpack hooks share: which tensors are
// never offloaded (SPEC §1.2), the checks on a tensor a group would copy,
// and popping a composite component by component.

#ifndef OFFLOAD_ENGINE_CORE_PUSH_CHECKS_H_
#define OFFLOAD_ENGINE_CORE_PUSH_CHECKS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "engine/backend.h"
#include "engine/saved_tensor.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace offload {

// Parameters, weights, tensors marked do-not-offload, tensors not in device
// memory and tensors of fewer than `min_elements` elements.
// REQUIRES: tensor.storage is set.
bool NeverOffloaded(const Tensor& tensor, int64_t min_elements);

// OK if `tensor` is well-formed (ValidateTensor) and, unless it is never
// offloaded, its memory and ready event belong to `backend` (a foreign
// storage would be read through another backend's address space: silent
// corruption). Errors: kInvalidArgument prefixed by `where`.
Status CheckOffloadable(const Tensor& tensor, const Backend& backend,
                        int64_t min_elements, const std::string& where);

// OK if `saved` came from a Push of the front door `owner` (named
// `front_door` in messages) in `iteration` (any iteration unless
// `check_iteration`). Errors: kInvalidArgument prefixed by `call`: an empty
// handle, another front door's, or another iteration's.
Status CheckHandle(const SavedTensor& saved, uint64_t owner,
                   uint64_t iteration, bool check_iteration,
                   const std::string& call, const std::string& front_door);

// Rebuilds a composite from its components' handles with `pop_one`.
// Errors: the first that `pop_one` returns.
StatusOr<CompositeTensor> PopComponents(
    const SavedTensor::Composite& composite,
    const std::function<StatusOr<Tensor>(const SavedTensor&)>& pop_one);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_PUSH_CHECKS_H_
