"""The SPMD result and the small facts every sharding method shares: :class:`ShardResult`, the
least-compute bound, the heuristic plans, the configured pins, and how memory is described.

``solve_sharding`` (spmd/solve.py) returns a :class:`ShardResult`; the exact search
(spmd/search.py) builds one from the same pieces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from solver.core.errors import MtppError
from solver.core.result import relative_gap
from solver.core.units import format_bytes
from solver.spmd.config import from_attributes, read_config
from solver.spmd.patterns import data_parallel_plan, megatron_plan
from solver.spmd.program import Planner, Program
from solver.spmd.propagate import propagate
from solver.spmd.report import plan_dict
from solver.spmd.strategy import Strategy, parse_strategy

METHODS = {
    "propagate": "sharding propagation (MindSpore, seed 002) from the configured operators",
    "dp": "data parallel: every operator splits its batch dim over all devices when it can",
    "megatron": "Megatron-LM: weight MatMuls alternate column and row splits, then propagation",
    "cpsat": "exact: CP-SAT over every strategy of every operator, warm-started by the others",
}


@dataclass
class ShardResult:
    """A sharding plan with its cost, status and a lower bound on every plan's time."""

    kind: ClassVar[str] = "spmd"
    method: str
    status: str
    strategies: dict[str, Strategy]
    program: Program
    planner: Planner
    configured: dict[str, Strategy]
    memory_limit: float | None
    lower_bound: float | None
    wall_seconds: float
    stats: dict = field(default_factory=dict)

    @property
    def objective(self) -> float:
        return self.program.objective

    @property
    def gap(self) -> float | None:
        """(objective - bound) / objective, None without a bound."""
        return relative_gap(self.objective, self.lower_bound)

    def to_dict(self) -> dict:
        """The JSON object of ``mtpp shard --json``: :func:`solver.spmd.report.plan_dict`, then
        the cluster, the configured operators, the bound, gap, time and stats."""
        planner = self.planner
        return {
            **plan_dict(planner, self.program, self.method, self.status),
            "cluster": planner.cluster.to_dict(),
            "configured": sorted(self.configured),
            "memory_limit": self.memory_limit,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            "wall_seconds": self.wall_seconds,
            "stats": self.stats,
        }


@dataclass(frozen=True)
class SearchOptions:
    """What the exact search takes besides the problem: its time, CP-SAT's settings and the
    progress display (``progress``: a :class:`solver.cli.progress.SolveProgress` or None)."""

    time_limit: float
    workers: int = 0
    seed: int = 0
    progress: object | None = None
    log: bool = False
    encoding: str = "cuts"


def check_method(method: str) -> None:
    if method not in METHODS:
        raise MtppError(f"unknown sharding method {method!r}; use one of {', '.join(METHODS)}")


def compute_bound(planner: Planner, pins: dict[str, Strategy]) -> float:
    """Sum over operators of their least own time (compute; in training also backward compute
    and gradient synchronisation): edge communication is never negative."""
    total = 0.0
    for i, op in enumerate(planner.sm.ops):
        if op.name in pins:
            total += planner.unary_time(i, planner.sharding(i, pins[op.name]))
        else:
            total += min(planner.unary_time(i, sh) for sh in planner.candidates(i))
    return total


def heuristic(planner: Planner, method: str, pins: dict[str, Strategy]) -> dict[str, Strategy]:
    """The strategies of one heuristic method (pins kept)."""
    if method == "propagate":
        return propagate(planner, pins)
    if method == "dp":
        return data_parallel_plan(planner, pins)
    if method == "megatron":
        return megatron_plan(planner, pins)
    raise MtppError(f"unknown sharding method {method!r}; use one of {', '.join(METHODS)}")


def describe_memory(program: Program) -> str:
    return (
        f"{format_bytes(program.memory_per_device)} per device (weights "
        f"{format_bytes(program.weight_memory)} + activation peak "
        f"{format_bytes(program.peak_activation_memory)})"
    )


def fits(program: Program, limit: float | None) -> bool:
    return limit is None or program.memory_per_device <= limit


def fmt_limit(limit: float | None) -> str:
    """A memory limit in words and bytes ("none" without one)."""
    return "none" if limit is None else f"{format_bytes(limit)} ({limit:.0f} bytes)"


def fmt_floor(nbytes: float) -> str:
    """Bytes rounded down (a lower bound stays one)."""
    return fmt_limit(float(math.floor(nbytes)))


def load_pins(planner: Planner, config, where: str) -> dict[str, Strategy]:
    """The model's annotations, then ``config`` (a YAML path or a dict), each checked."""
    sm = planner.sm
    pins = from_attributes(sm)
    if isinstance(config, (str, Path)):
        pins.update(read_config(config, sm))
        where = str(config)
    elif config:
        for name, value in config.items():
            if sm.op_by_name(name) is None:
                raise MtppError(f"{where}: no node named {name!r} in the model")
            pins[name] = parse_strategy(value, f"node {name!r}")
    for name, strategy in pins.items():
        try:
            planner.sharding(sm.op_by_name(name).index, strategy)
        except MtppError as e:
            raise MtppError(f"{where}: {e}") from None
    return pins
