"""Operator-level (SPMD) sharding: strategies, tensor layouts, redistribution, sharding
propagation, the cost of the sharded program, and its execution on emulated devices.

The pipeline is a chain of pure functions (docs/sharding.md):
strategy per operator -> layouts (``rules.shard``) -> redistribution per edge
(``redistribute.plan_redistribution``) -> program cost (``program.evaluate``).
This package reads the ONNX model and never imports the pipeline solvers.
"""

from solver.sharding.mesh import Layout, Mesh, make_mesh, parse_mesh
from solver.sharding.model import ShardModel, load_model
from solver.sharding.program import Planner, Program, evaluate
from solver.sharding.propagate import propagate
from solver.sharding.redistribute import Redistribution, Step, plan_redistribution
from solver.sharding.rules import OpSharding, Spec, StrategyError
from solver.sharding.solve import ShardResult, solve_sharding

__all__ = [
    "Layout",
    "Mesh",
    "OpSharding",
    "Planner",
    "Program",
    "Redistribution",
    "ShardModel",
    "ShardResult",
    "Spec",
    "Step",
    "StrategyError",
    "evaluate",
    "load_model",
    "make_mesh",
    "parse_mesh",
    "plan_redistribution",
    "propagate",
    "solve_sharding",
]
