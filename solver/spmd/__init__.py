"""Operator-level (SPMD) sharding: strategies, tensor layouts, redistribution, sharding
propagation, the cost of the sharded program, and its execution on emulated devices.

The pipeline is a chain of pure functions (docs/sharding.md):
strategy per operator -> layouts (``rules.shard``) -> redistribution per edge
(``redistribute.plan_redistribution``) -> program cost (``program.evaluate``).
This package reads the ONNX model and never imports the pipeline solvers.
"""

from solver.spmd.mesh import Layout, Mesh, make_mesh, parse_mesh
from solver.spmd.model import ShardModel, load_model
from solver.spmd.plan import ShardResult
from solver.spmd.program import Planner, Program, evaluate
from solver.spmd.propagate import propagate
from solver.spmd.redistribute import Redistribution, Step, plan_redistribution
from solver.spmd.rules import OpSharding, Spec, StrategyError
from solver.spmd.solve import solve_sharding

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
