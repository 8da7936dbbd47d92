"""A plan: which block (device) every node runs on, with its costs, bound and status.

The status is honest by construction: :func:`make_plan` evaluates the assignment with the one
evaluator and applies the one status rule, :func:`solver.core.result.certify`: OPTIMAL is
downgraded to FEASIBLE unless the lower bound is within 1e-6 (relative) of the re-evaluated
objective, and a bound above the objective (beyond float rounding) is a bug in the solver that
produced it and raises :class:`InvalidBoundError`; it is never clipped silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from solver.core.cluster import MAX_DEVICES, Cluster
from solver.core.cost import Evaluation, check_placement, evaluate, validate
from solver.core.errors import MtppError
from solver.core.files import read_json, shown, write_json_atomic
from solver.core.graph import Graph
from solver.core.result import (  # noqa: F401  re-exported for the importers of this module
    ALL_PLACEMENTS,
    BOUND_ABS_TOL,
    BOUND_TOL,
    ERROR,
    FEASIBLE,
    INFEASIBLE,
    INVALID,
    MAX_RESOLUTION,
    OPTIMAL,
    OPTIMALITY_TOL,
    UNKNOWN,
    InvalidBoundError,
    bound_exceeds,
    certify,
    meets_target,
    optimal_within,
    relative_gap,
)
from solver.core.training import TrainingCost, TrainingSpec, training_cost

ITERATION_TIME = "iteration_time"  # "objective_kind" of a training plan (T, docs/training.md)
PLAN_FORMAT = "mtpp-plan"
PLAN_VERSION = 1
# a command that takes pipeline plans only (mtpp run, read_plan_assignment), given a joint plan
JOINT_PLAN_REFUSED = (
    "a joint plan, and this command takes pipeline plans; check a joint plan with mtpp "
    "evaluate, mtpp simulate or mtpp export --verify"
)


@dataclass
class Plan:
    """An assignment of nodes to blocks plus everything a user needs to trust it."""

    kind: ClassVar[str] = "pipeline"  # a solver.core.result.Result of the pipeline planner
    graph_name: str
    fingerprint: str
    node_names: tuple[str, ...]
    assignment: np.ndarray
    cluster: Cluster
    method: str
    status: str
    evaluation: Evaluation
    lower_bound: float | None = None
    wall_seconds: float = 0.0
    stats: dict = field(default_factory=dict)
    placement: np.ndarray | None = None  # device of each block; None: block b on device b
    # a training plan's stages and iteration time T (its objective); None: an inference plan
    training: TrainingCost | None = None

    @property
    def k(self) -> int:
        return self.evaluation.k

    @property
    def objective(self) -> float:
        """max f (inference), or the iteration time T of a training plan."""
        if self.training is not None:
            return self.training.iteration_time
        return self.evaluation.objective

    @property
    def gap(self) -> float | None:
        """Relative gap (objective - lower bound) / objective, or None without a bound."""
        return relative_gap(self.objective, self.lower_bound)

    def to_dict(self) -> dict:
        ev = self.evaluation
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "graph": {
                "name": self.graph_name,
                "nodes": len(self.node_names),
                "fingerprint": self.fingerprint,
            },
            "cluster": self.cluster.to_dict(),
            "devices": self.k,
            "method": self.method,
            "status": self.status,
            "objective": self.objective,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            # OPTIMAL with a gap above 1e-6: proven at this rounding resolution (seconds)
            "optimal_within": self.stats.get("optimal_within"),
            "throughput": ev.throughput if math.isfinite(ev.throughput) else None,
            "latency": ev.latency,
            "bottleneck_block": ev.bottleneck,
            "wall_seconds": self.wall_seconds,
            "blocks": ev.blocks(),
            "stats": self.stats,
            "assignment": {
                n: int(b) for n, b in zip(self.node_names, self.assignment, strict=True)
            },
        } | ({} if self.placement is None else {"placement": self.placement.tolist()}) | (
            {}
            if self.training is None
            else {"objective_kind": ITERATION_TIME, "training": self.training.to_dict()}
        )


def make_plan(
    g: Graph,
    cluster: Cluster,
    assignment: np.ndarray,
    method: str,
    *,
    lower_bound: float | None = None,
    status: str = FEASIBLE,
    wall_seconds: float = 0.0,
    stats: dict | None = None,
    check: bool = True,
    resolution: float = 0.0,
    placement: object = None,
    training: TrainingSpec | None = None,
) -> Plan:
    """Evaluate ``assignment`` and wrap it as a :class:`Plan`.

    With ``check`` (the default) an invalid assignment raises: a solver must never return one.
    OPTIMAL is kept only when ``lower_bound`` proves it within 1e-6 relative. A bound above the
    objective by more than float rounding raises :class:`InvalidBoundError`; within rounding it
    is reported as the objective, and the bound as given stays in ``stats["raw_lower_bound"]``.

    ``resolution`` (seconds, absolute) is the worst-case rounding error of an exact model whose
    integer optimum was proven: OPTIMAL is then also kept when objective - bound is at most
    that, and ``stats["optimal_within"]`` states it (see :func:`optimal_within`).

    ``placement[b]`` is the device running block b (see :func:`solver.core.cost.check_placement`;
    default b); the plan keeps it and writes it to JSON when one was given.

    With ``training`` the plan is a training plan: priced by
    :func:`solver.core.training.training_cost` (its validity is the training
    memory's), its objective and the status rule are on the iteration time T, and
    ``lower_bound`` must be a bound on T.
    """
    a = np.asarray(assignment, dtype=np.int64)
    dev = None if placement is None else check_placement(cluster, cluster.devices, placement)
    cost = None if training is None else training_cost(g, cluster, a, training, placement=dev)
    if check:
        bad = [str(v) for v in validate(g, cluster, a, placement=dev)]
        bad = bad if cost is None else list(cost.violations)
        if bad:
            raise AssertionError(f"{method} produced an invalid plan: {bad[0]}")
    ev = evaluate(g, cluster, a, placement=dev)
    verdict = certify(
        method,
        ev.objective if cost is None else cost.iteration_time,
        [lower_bound],
        proven=status == OPTIMAL,
        resolution=resolution,
        source=None,
        scope=None,
    )
    return Plan(
        graph_name=g.name,
        fingerprint=g.fingerprint,
        node_names=g.names,
        assignment=a,
        cluster=cluster,
        method=method,
        status=verdict.status if status == OPTIMAL else status,
        evaluation=ev,
        lower_bound=verdict.lower_bound,
        wall_seconds=float(wall_seconds),
        stats=dict(stats or {}) | verdict.stats_view(),
        placement=dev,
        training=cost,
    )


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write a plan as JSON (atomically)."""
    write_json_atomic(path, plan.to_dict())


def read_plan_assignment(g: Graph, path: str | Path) -> tuple[np.ndarray, dict]:
    """Read a plan file for graph ``g``: the block of every node, and the raw JSON.

    Refuses plans that name unknown nodes, miss nodes, or were made for another graph.
    """
    path = Path(path)
    data = read_json(path, "plan file")
    if isinstance(data, dict) and data.get("format") == "mtpp-joint-plan":
        raise MtppError(f"{path}: {JOINT_PLAN_REFUSED}")
    return plan_assignment_from_data(g, data, path)


def plan_assignment_from_data(g: Graph, data: object, path: str | Path) -> tuple[np.ndarray, dict]:
    """:func:`read_plan_assignment` on the parsed content ``data`` of the plan file ``path``
    (named in errors)."""
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise MtppError(f'{path}: not an mtpp plan (expected "format": "{PLAN_FORMAT}")')
    if data.get("version") != PLAN_VERSION:
        raise MtppError(f"{path}: plan version {data.get('version')!r} is not supported")
    graph = data.get("graph") or {}
    if not isinstance(graph, dict):
        raise MtppError(f"{path}: 'graph' must be a mapping with the graph's name and fingerprint")
    fp = graph.get("fingerprint")
    if fp is not None and not isinstance(fp, str):
        raise MtppError(f"{path}: 'graph.fingerprint' must be a string, got {shown(fp)}")
    assign = data.get("assignment")
    if not isinstance(assign, dict):
        raise MtppError(f"{path}: 'assignment' must map node names to block numbers")
    unknown = [x for x in assign if x not in g.index]
    if unknown:
        raise MtppError(
            f"{path}: the plan names {len(unknown)} node(s) not in graph {g.name!r} (first: "
            f"{unknown[0]!r}); was it made for another graph?"
        )
    missing = [x for x in g.names if x not in assign]
    if missing:
        raise MtppError(
            f"{path}: the plan does not assign {len(missing)} node(s) of graph {g.name!r} "
            f"(first: {missing[0]!r})"
        )
    if fp is not None and fp != g.fingerprint:
        raise MtppError(
            f"{path}: the plan was made for a graph with other edges (fingerprint {fp}, this "
            f"graph has {g.fingerprint}); solve again for this graph"
        )
    a = np.empty(g.n, dtype=np.int64)
    for name, b in assign.items():
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < MAX_DEVICES:
            text = repr(b) if len(repr(b)) < 40 else repr(b)[:37] + "..."
            raise MtppError(
                f"{path}: block of node {name!r} must be a whole number from 0 to "
                f"{MAX_DEVICES - 1}, got {text}"
            )
        a[g.index[name]] = b
    return a, data


def read_plan_placement(data: dict, path: str | Path, cluster: Cluster) -> np.ndarray | None:
    """The ``placement`` of a plan file read by :func:`read_plan_assignment` (the device of
    each block, checked against ``cluster``), or None when the file has none (older plans:
    block b runs on device b) or the cluster is homogeneous (where it changes nothing)."""
    raw = data.get("placement")
    if raw is None or cluster.homogeneous:  # alike devices and links: the placement is moot
        return None
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in raw
    ):
        raise MtppError(f"{path}: 'placement' must list one whole device number per block")
    if len(raw) != cluster.devices:
        raise MtppError(
            f"{path}: 'placement' lists {len(raw)} devices but the cluster has "
            f"{cluster.devices}; one device per block"
        )
    bad = [d for d in raw if not 0 <= d < cluster.devices]
    if bad:
        raise MtppError(
            f"{path}: 'placement' names device {shown(bad[0])}, but devices are "
            f"0..{cluster.devices - 1}"
        )
    try:
        return check_placement(cluster, cluster.devices, np.array(raw, dtype=np.int64))
    except MtppError as e:
        raise MtppError(f"{path}: {e}") from None


def read_plan_training(data: dict, path: str | Path) -> TrainingSpec | None:
    """The training spec a plan file records (its ``"training"`` section: schedule,
    microbatches, virtual_stages, optimizer_state), or None for an inference plan; a section
    that names no valid spec is refused naming the file."""
    raw = data.get("training")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise MtppError(f"{path}: 'training' must be a mapping (schedule, microbatches, ...)")
    default = TrainingSpec()
    try:
        return TrainingSpec(
            schedule=raw.get("schedule", default.schedule),
            microbatches=raw.get("microbatches", default.microbatches),
            virtual_stages=raw.get("virtual_stages", default.virtual_stages),
            optimizer_state=raw.get("optimizer_state", default.optimizer_state),
        )
    except MtppError as e:
        raise MtppError(f"{path}: 'training': {e}") from None
