"""A joint plan file checked against its model: every stage priced again by the cost function
the planner used, and every number of the file compared with the recomputed one.

An inference plan is priced by :func:`solver.joint.plan.price_stages`
(:func:`solver.joint.plan.check_against_model`); a training plan (its ``training`` section) by
:func:`solver.joint.training.price_training_stages` under the file's schedule, microbatches and
optimizer state, which also gives T and each stage's F, B, t, sync, in-flight count and memory.
A number that differs beyond rounding (a tampered or stale file) is refused in one line naming
it, as is a stage over its memory limit.
"""

from __future__ import annotations

from solver.core.errors import MtppError
from solver.core.training import TrainingSpec
from solver.joint.plan import (
    TRAINING_STAGE_KEYS,
    JointPlan,
    JointTraining,
    check_against_model,
    compare_stages,
    differs,
    stage_specs,
)
from solver.joint.training import price_training_stages
from solver.spmd.model import ShardModel


def check_joint_plan(plan: JointPlan, sm: ShardModel, where: str = "plan") -> None:
    """Price ``plan`` again on ``sm`` by its kind's cost function and refuse a number that
    differs. A training plan's ``training`` is then the recomputed one (equal to the file's,
    with the capacity of the memory limit in force)."""
    if plan.training is None:
        check_against_model(plan, sm, where)
        return
    plan.training = check_training_plan(plan, sm, where)


def check_training_plan(plan: JointPlan, sm: ShardModel, where: str) -> JointTraining:
    """The training terms of ``plan`` recomputed by :func:`price_training_stages` (the one
    cost function of a joint training stage), after the stages' and the training section's
    numbers were found equal to them."""
    tr = plan.training
    spec = TrainingSpec(tr.schedule, tr.microbatches, 1, tr.optimizer_state)
    specs = stage_specs(plan, sm, where)
    try:
        priced = price_training_stages(sm, plan.cluster, specs, plan.memory_limit, spec)
    except MtppError as e:
        raise MtppError(f"{where}: {e}") from None
    if priced.over is not None:
        raise MtppError(f"{where}: {priced.over}")
    compare_stages(plan.stages, priced.stages, where)
    for i, (old, new) in enumerate(zip(tr.stages, priced.training.stages, strict=True)):
        for key in TRAINING_STAGE_KEYS:
            a, b = old.to_dict()[key], new.to_dict()[key]
            if differs(a, b):
                raise MtppError(
                    f"{where}: training: stage {i}: {key} is {a!r} in the file but the model "
                    f"gives {b!r}"
                )
    a, b = tr.iteration_time, priced.training.iteration_time
    if differs(a, b):
        raise MtppError(
            f"{where}: the iteration time T is {a!r} in the file but the model gives {b!r}"
        )
    return priced.training
