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

// Where a check happens, for its error message; called only on failure
// (Push's hot path builds no message).
using WhereFn = std::function<std::string()>;

// OK if `tensor` is well-formed (ValidateTensor) and, unless it is never
// offloaded, its memory and ready event belong to `backend` (a foreign
// storage would be read through another backend's address space: silent
// corruption). Errors: kInvalidArgument prefixed by `where()`.
Status CheckOffloadable(const Tensor& tensor, const Backend& backend,
                        int64_t min_elements, const WhereFn& where);
Status CheckOffloadable(const Tensor& tensor, const Backend& backend,
                        int64_t min_elements, const std::string& where);

// OK if `saved` came from a Push of the front door `owner` (named
// `front_door` in messages) in `iteration` (any iteration unless
// `check_iteration`). Errors: kInvalidArgument prefixed by `call`: an empty
// handle, another front door's, or another iteration's.
Status CheckHandle(const SavedTensor& saved, uint64_t owner,
                   uint64_t iteration, bool check_iteration,
                   const std::string& call, const std::string& front_door);

using PopOneFn = std::function<StatusOr<Tensor>(const SavedTensor&)>;

// The unpack hooks of a front door whose handles were checked
// (CheckHandle), given how it pops one plain handle: Pop refuses a
// composite, PopComposite a plain handle (kInvalidArgument) and rebuilds a
// composite component by component. Errors: also the first that `pop_one`
// returns.
StatusOr<Tensor> PopPlain(const SavedTensor& saved, const PopOneFn& pop_one);
StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved,
                                       const PopOneFn& pop_one);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_PUSH_CHECKS_H_
