"""What the budget (budget.py) reports of its plan: the model's step for a
choice, the plan's limit (the least step any choice of the same units can
have) and the plan as a table. Each takes the JointBudget."""

from . import _common


def predicted_step(budget, plan):
    """The model's step for the plan's choice, in ns, with the copy
    bandwidths in force (fitted after a plan that offloads ran)."""
    d2h, h2d = budget.bandwidths
    again = _common.ext().evaluate_joint(
        budget.model_units, d2h, h2d, budget._units_budget,
        list(plan["choice"]), True)
    return plan["step_ns"] if again is None else again["step_ns"]


def limit(budget):
    """The plan's limit (_C.joint_limit, engine/plan/joint_limit.h): the least
    step, in ns, any keep / offload / recompute choice of the same units
    can have within the units' budget, from the same profile and the
    excesses the race measured (`model_units`); None
    before the plan or beyond the limit's reach (14 units, 3**14
    choices: kJointLimitMaxChoices)."""
    if budget.plan is None or len(budget.profile["units"]) > 14:
        return None
    choices = 1
    for u in budget.profile["units"]:
        offload = budget.allow_offload and u.get("offloadable", True)
        selective = budget.allow_recompute and u.get("selective", False)
        choices *= (1 + offload + (budget.allow_recompute and u["recomputable"])
                    + selective + (selective and offload))
    if choices > 3 ** 14:
        return None
    d2h, h2d = budget.bandwidths
    result = _common.ext().joint_limit(
        budget.model_units, d2h, h2d, budget._units_budget,
        budget.allow_offload, budget.allow_recompute)
    return None if result is None else result["step_ns"]


def describe(budget):
    """The plan as a table, with the profile's figures and the budget."""
    if budget.plan is None:
        return ""
    return (f"budget {budget.budget_bytes} bytes: {budget.profile['outside']} beside "
            f"the units throughout, {budget._units_budget} for them and the head "
            f"(the last unit, {budget.profile['head']} bytes at its peak); copies "
            f"{budget.bandwidths[0]:.1f} GB/s to host, {budget.bandwidths[1]:.1f} back; "
            f"measured above the profile: {budget.excess[0]} bytes per recomputed "
            f"unit, {budget.excess[1]} per selective one\n"
            + budget.plan["text"])
