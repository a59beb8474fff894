// The limit of the joint plan (SPEC §4.8; issue 30, item 4): the least step
// time that ANY keep / offload / recompute / selective / selective-offload
// choice of a JointProblem's units
// can have under its budget, by ANY schedule of copies. PlanJoint's
// predicted step (engine/plan/joint_plan.h) can never beat it; the gap between
// the two is what a better planner could still win. Pure C++, no solver.
//
// The physical model it bounds (the planner's assumptions, without the
// planner's rules): one compute stream runs the forward of units 0..n-1,
// then the backward of n-1..0; a recomputed unit's backward takes
// recompute_ns longer and holds recompute_bytes more while it runs, a
// selective one's selective_ns longer and saved_bytes - selective_bytes
// more. A unit's saved bytes (input_bytes when recomputed, selective_bytes
// when selective) arrive evenly during its forward, are needed whole during
// its backward and are freed when it ends. A unit's transients
// (joint_plan.h) are held at the peak of its forward and of its backward (a
// recomputed or selective unit's re-run: the larger of its two), as
// PlanJoint counts them.
// An offloaded unit's bytes all go to host and all come back before its
// backward (a selective-offload one's selective bytes but its input:
// HostBytes, joint_model.h); copies are fluid (any rate up to d2h_gbps / h2d_gbps, GB/s =
// 1e9 B/s = 1 B/ns, one engine each way, overlapping compute and each
// other); a byte is copied out only once produced, and back only once out.
// At every instant the bytes on device (kept, recomputed inputs, offloaded
// bytes not yet out or already back, the running recompute's bytes) must
// be within the budget. Compute may stall for copies: step = compute +
// stalls.
//
// The bound of one choice is the least step meeting these necessary
// conditions — a relaxation: every real schedule of the choice meets them,
// so none is faster. With F_i the end of unit i's forward (F_-1 = 0), S_u
// and E_u the start and end of unit u's backward (E_n = F_n-1), and P_k the
// offloaded bytes of units 0..k:
//  - Memory is checked only at unit boundaries: at F_i (all of units 0..i
//    produced, with unit i's forward transient on top, as at its peak) and
//    at each E_u (what u's backward holds whole at its peak, transient
//    included, plus the bytes already back of offloaded units below u).
//    Instants between are not checked.
//  - At F_i, offloaded bytes already copied back are not counted; in the
//    backward, offloaded bytes not yet copied out are not counted.
//  - D2H runs at full bandwidth from the moment bytes exist: by F_i at most
//    P_k + d2h * (F_i - F_k) bytes are out, for every k < i (later units'
//    bytes do not exist before F_k), and at least the excess of units
//    0..i's bytes over the budget must be.
//  - A byte may come back the moment it went out (out-and-back costs the
//    slower rate, not the sum of both): the offloaded bytes of units u..n-1
//    did not exist before F_u-1 and are out and back by S_u, so
//    S_u >= F_u-1 + bytes / min(d2h, h2d).
//  - By E_w, the bytes back of offloaded units below w are at most the room
//    w's backward leaves in the budget; whatever of units u..w-1 exceeds it
//    comes back after E_w: S_u >= E_w + (bytes - room) / h2d.
//  - What w's backward holds beyond the budget, were every offloaded byte
//    of the units below it on device, is off device by E_w, so out: by E_w
//    at most P_k + d2h * (E_w - F_k) bytes are, for every k < w-1 (as in
//    the forward). Without it, a unit offloaded early whose bytes only the
//    backward's peak needs gone counted as gone however long its copy took
//    (session 27: eager Llama h2048 at 0.8, its first layer's 2 GB at
//    40 GB/s).
//  - Ignored: copy latency and per-copy cost, whole-tensor (non-fluid)
//    copies and frees, interference of copies with compute or each other,
//    allocator rounding.
// These are difference constraints between event times in stream order;
// their least solution (a longest path, one pass) gives the bound.
//
// The limit is the exact minimum of that bound over every allowed choice
// (3^n of them, 4 per unit that may be selective, 5 where it may be
// offloaded too): a depth-first search
// over units in forward order that skips a prefix whose forward already
// cannot fit, or whose forward end plus the least remaining compute is
// above the best step found. At most kJointLimitMaxUnits units and
// kJointLimitMaxChoices choices.

#ifndef OFFLOAD_ENGINE_PLAN_JOINT_LIMIT_H_
#define OFFLOAD_ENGINE_PLAN_JOINT_LIMIT_H_

#include <vector>

#include "engine/plan/joint_plan.h"
#include "engine/status.h"

namespace offload {

// The most units JointLimit searches (3^14, about 4.8 million choices),
// and the most choices (the product over units of the choices each
// allows: 14 units without selective, 11 all selective, 9 all
// selective-offload).
inline constexpr int kJointLimitMaxUnits = 14;
inline constexpr int64_t kJointLimitMaxChoices = 4782969;  // 3^14

struct JointLimitResult {
  double step_ns = 0;              // the limit: compute_ns + least stalls
  std::vector<UnitChoice> choice;  // per unit, a choice attaining it
  double compute_ns = 0;  // forward + backward + re-runs (full, selective)
};

// The least bound (above) over every keep / offload / recompute /
// selective choice the problem allows. Ties go to fewer re-run units
// (recomputed or selective), then to fewer offloaded bytes, then to the
// choice with the earlier units kept (then offloaded, recomputed).
// Errors: kInvalidArgument for a malformed problem (ValidateJointProblem),
//   more than kJointLimitMaxUnits units or kJointLimitMaxChoices choices,
//   naming the count;
//   kResourceExhausted naming the budget when no choice fits it.
StatusOr<JointLimitResult> JointLimit(const JointProblem& problem);

// The bound of one choice: no schedule of `choice` has a shorter step.
// Errors: kInvalidArgument for a malformed problem, a choice vector of
//   another size, or a choice the problem does not allow (naming the
//   unit); kResourceExhausted naming the unit and the bytes, when the
//   choice cannot fit the budget at some unit boundary.
StatusOr<double> JointChoiceBound(const JointProblem& problem,
                                  const std::vector<UnitChoice>& choice);

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PLAN_JOINT_LIMIT_H_
