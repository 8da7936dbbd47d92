"""Joint plans: pipeline stages, each on a sub-mesh of the cluster sharding its operators
(issue 14). The planner sits above the pipeline and the sharding solvers (docs/joint.md)."""

from solver.joint.plan import (
    JointPlan,
    Stage,
    StageSpec,
    load_joint_plan,
    price_stages,
    save_joint_plan,
)
from solver.joint.planner import plan_joint
from solver.joint.training import plan_joint_training

__all__ = [
    "JointPlan",
    "Stage",
    "StageSpec",
    "load_joint_plan",
    "plan_joint",
    "plan_joint_training",
    "price_stages",
    "save_joint_plan",
]
