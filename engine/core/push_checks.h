// What every front door's pack and unpack hooks share: which tensors are
// never offloaded (SPEC §1.2), the checks on a tensor a group would copy,
// and pushing and popping a composite component by component.

#ifndef OFFLOAD_ENGINE_CORE_PUSH_CHECKS_H_
#define OFFLOAD_ENGINE_CORE_PUSH_CHECKS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/core/handle_maker.h"
#include "engine/offload_stats.h"
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

// How a front door pushes one tensor into the group open now.
using PushOneFn = std::function<StatusOr<SavedTensor>(const Tensor&)>;

// A composite push: where it goes and how its front door pushes and
// takes back a component.
struct CompositePush {
  int slot = -1;           // the layer or group slot pushed in (-1: none)
  bool offloaded = false;  // components go to push_one; else kept as pushed
  int64_t min_elements = 0;
  WhereFn where;           // "Push in layer 3", for check errors
  PushOneFn push_one;
  // Optional: runs once the checks passed, before the first component is
  // pushed (a front door's notes and its snapshot for undo).
  std::function<void()> before_push;
  // Takes back what push_one did for the components pushed so far.
  std::function<void()> undo;
};

// The pack hook of a composite, all or nothing (SPEC §1.4): absent
// components stay absent; when `push.offloaded`, every present component is
// first checked (CheckOffloadable against `backend`; errors "<where()> of
// composite 'NAME' component I", nothing done), then pushed by push_one in
// order (push.before_push, if set, runs between the checks and the first
// push); otherwise each is kept as pushed. If a component's push fails,
// push.undo takes the earlier ones back and `stats` is restored.
// Errors: a failed check; a failed push, with the context "Push of
// composite 'NAME' (no component was pushed)".
StatusOr<SavedTensor> PushComposite(const CompositeTensor& tensor,
                                    const CompositePush& push,
                                    const HandleMaker& handles,
                                    const Backend& backend,
                                    OffloaderStats& stats);

using PopOneFn = std::function<StatusOr<Tensor>(const SavedTensor&)>;

// The unpack hooks of a front door whose handles were checked
// (CheckHandle), given how it pops one plain handle: Pop refuses a
// composite, PopComposite a plain handle (kInvalidArgument) and rebuilds a
// composite component by component. Errors: also the first that `pop_one`
// returns; kFailedPrecondition naming the tensor when what it returns has
// bytes but no memory (released): Pop never hands back a tensor without
// memory.
StatusOr<Tensor> PopPlain(const SavedTensor& saved, const PopOneFn& pop_one);
StatusOr<CompositeTensor> PopComposite(const SavedTensor& saved,
                                       const PopOneFn& pop_one);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_CORE_PUSH_CHECKS_H_
