"""The training model: the iteration time T and the per-stage memory of a pipeline plan.

A training plan's stages are its non-empty blocks in order, p of them, with m microbatches
(docs/training.md). For stage i (0-based) holding the nodes S:

    F_i = f(S)                                   (core.cost: io in + work + overflow + io out)
    B_i = work_backward(S) + io_in(S) + io_out(S)  (the gradients cross the same cuts back)
    t_i = F_i + B_i
    T   = sum_i t_i + (m - 1) * max_i t_i                     (GPipe, 1F1B; Alpa's stage DP)
    T   = sum_i t_i / v + (m - 1 / v) * max_i t_i             (interleaved 1F1B, v chunks)
    memory_i = state * params(S) + peak(S) + inflight_i * stash(S)   (<= capacity C)

with inflight_i = m (GPipe), min(m, p - i) (1F1B) and, interleaved, the chunks Megatron's
schedule keeps in flight on rank i, min(m v, (v - 1) p + 2 (p - i - 1) + 1) (m v when m = p:
then every forward runs first), each holding 1/v of the stage's stash. ``state`` is the bytes
of training state per byte of weights (weights, gradients and optimizer state; 4 = fp32 Adam).
Every f(S) comes from :func:`core.cost.evaluate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound, node_bounds, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view

SCHEDULES = ("gpipe", "1f1b", "interleaved")
MAX_MICROBATCHES = 1_000_000
CAPACITY_SLACK = 1e-12  # relative slack of the capacity test (as core.cost.validate)


@dataclass(frozen=True)
class TrainingSpec:
    """The schedule, microbatches m, virtual stages v (interleaved only) and the bytes of
    training state per byte of weights."""

    schedule: str = "1f1b"
    microbatches: int = 1
    virtual_stages: int = 1
    optimizer_state: float = 4.0

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise MtppError(
                f"unknown schedule {self.schedule!r}; use one of {', '.join(SCHEDULES)}"
            )
        _whole("microbatches", self.microbatches, MAX_MICROBATCHES)
        _whole("virtual stages", self.virtual_stages, 1024)
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise MtppError("virtual stages > 1 need the interleaved schedule")
        s = self.optimizer_state
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < float("inf"):
            raise MtppError(f"the optimizer state factor must be a number > 0, got {s!r}")

    @property
    def time_weights(self) -> tuple[float, float]:
        """(a, b) with T = a * sum t_i + b * max t_i."""
        m, v = self.microbatches, self.virtual_stages
        if self.schedule == "interleaved":
            return 1.0 / v, m - 1.0 / v
        return 1.0, float(m - 1)

    def iteration_time(self, stage_times: np.ndarray) -> float:
        """T of stages with these times t_i (0 for no stage)."""
        t = np.asarray(stage_times, dtype=float)
        if not len(t):
            return 0.0
        a, b = self.time_weights
        return float(a * t.sum() + b * t.max())

    def inflight(self, p: int) -> np.ndarray:
        """Microbatches' stashes (in units of a whole stage's stash) alive at once on each of
        p stages."""
        m, v = self.microbatches, self.virtual_stages
        i = np.arange(p)
        if self.schedule == "gpipe":
            return np.full(p, float(m))
        if self.schedule == "1f1b" or v == 1:
            return np.minimum(m, p - i).astype(float)
        if m == p:  # Megatron runs every forward first then (all_warmup_microbatches)
            return np.full(p, float(m))
        chunks = np.minimum(m * v, (v - 1) * p + 2 * (p - i - 1) + 1)
        return chunks / v


def _whole(what: str, value: object, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise MtppError(f"the number of {what} must be a whole number, got {value!r}")
    if not 1 <= value <= most:
        raise MtppError(f"the number of {what} must be from 1 to {most:,}, got {value}")


@dataclass(frozen=True)
class StageCost:
    """One stage of a training plan (times in seconds, memory in bytes)."""

    stage: int
    block: int
    nodes: int
    forward: float
    backward: float
    time: float
    params: float
    peak: float
    stash: float
    inflight: float
    memory: float
    capacity: float | None

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.memory <= self.capacity * (1 + CAPACITY_SLACK)

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "block": self.block,
            "nodes": self.nodes,
            "forward": self.forward,
            "backward": self.backward,
            "time": self.time,
            "param_bytes": self.params,
            "peak_bytes": self.peak,
            "stash_bytes": self.stash,
            "inflight": self.inflight,
            "memory_bytes": self.memory,
            "capacity_bytes": self.capacity,
        }


@dataclass(frozen=True)
class TrainingCost:
    """T of a plan, its stages and why it is invalid (empty when valid)."""

    spec: TrainingSpec
    iteration_time: float
    stages: tuple[StageCost, ...]
    violations: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.violations

    @property
    def max_stage_time(self) -> float:
        return max((s.time for s in self.stages), default=0.0)

    def to_dict(self) -> dict:
        return {
            "schedule": self.spec.schedule,
            "microbatches": self.spec.microbatches,
            "virtual_stages": self.spec.virtual_stages,
            "optimizer_state": self.spec.optimizer_state,
            "iteration_time": self.iteration_time,
            "max_stage_time": self.max_stage_time,
            "valid": self.valid,
            "violations": list(self.violations),
            "stages": [s.to_dict() for s in self.stages],
        }


def training_cost(
    g: Graph,
    cluster: Cluster,
    assignment: np.ndarray,
    spec: TrainingSpec,
    k: int | None = None,
    placement: object = None,
) -> TrainingCost:
    """T, the stages and the validity of a plan (``assignment[v]`` = block of v, 0..k-1)."""
    k = cluster.devices if k is None else k
    ev = evaluate(g, cluster, assignment, k, placement)
    a = np.asarray(assignment, dtype=np.int64)
    device = np.arange(k) if ev.placement is None else ev.placement
    backward = np.bincount(a, weights=g.backward_work, minlength=k) * _slowdown(cluster, device)
    backward = backward + ev.io_in + ev.io_out
    stash = np.bincount(a, weights=g.stash_bytes, minlength=k)
    blocks = np.flatnonzero(ev.nodes > 0)
    p = len(blocks)
    inflight = spec.inflight(p)
    memory = spec.optimizer_state * ev.params[blocks] + ev.peak[blocks]
    memory = memory + inflight * stash[blocks]
    capacity = _capacities(cluster, device[blocks])
    stages = tuple(
        StageCost(
            stage=i,
            block=int(b),
            nodes=int(ev.nodes[b]),
            forward=float(ev.f[b]),
            backward=float(backward[b]),
            time=float(ev.f[b] + backward[b]),
            params=float(ev.params[b]),
            peak=float(ev.peak[b]),
            stash=float(stash[b]),
            inflight=float(inflight[i]),
            memory=float(memory[i]),
            capacity=capacity[i],
        )
        for i, b in enumerate(blocks.tolist())
    )
    T = spec.iteration_time(np.array([s.time for s in stages]))
    return TrainingCost(spec, T, stages, _violations(g, cluster, a, k, ev.placement, stages))


def _slowdown(cluster: Cluster, device: np.ndarray) -> np.ndarray:
    """Per block: seconds on its device per second on the reference device."""
    if cluster.homogeneous:
        return np.ones(len(device))
    _, _, compute = cluster.device_arrays()
    return cluster.compute / compute[device]


def _capacities(cluster: Cluster, device: np.ndarray) -> list[float | None]:
    """The hard capacity of each stage's device (None: no limit)."""
    if cluster.homogeneous:
        return [cluster.capacity] * len(device)
    _, capacity, _ = cluster.device_arrays()
    return [None if np.isinf(c) else float(c) for c in capacity[device]]


def _violations(g, cluster, a, k, placement, stages: tuple[StageCost, ...]) -> tuple[str, ...]:
    """Order and co-location violations (core.cost.validate) and the training memory test
    (it replaces validate's params + peak test, which training memory includes)."""
    found = [
        str(v) for v in validate(g, cluster, a, k, placement=placement) if v.kind != "capacity"
    ]
    for s in stages:
        if not s.fits:
            found.append(
                f"stage {s.stage} (block {s.block}) needs {s.memory:.6g} bytes (state x params "
                f"{s.memory - s.peak - s.inflight * s.stash:.6g} + peak {s.peak:.6g} + "
                f"{s.inflight:g} x stash {s.stash:.6g}) but the capacity is {s.capacity:.6g} bytes"
            )
    return tuple(found)


def training_lower_bound(
    g: Graph, cluster: Cluster, k: int, spec: TrainingSpec, max_f_bound: float = 0.0
) -> float:
    """A lower bound on T for every plan of at most k blocks (memory ignored: a relaxation).

    With W2 = total work + backward work: sum_i t_i >= W2 (plus the overflow no k devices
    avoid, on a homogeneous cluster); max_i t_i >= sum_i t_i / k, >= core.cost.lower_bound
    (t_i >= F_i), >= ``max_f_bound`` (a proven lower bound on max f over the plans of at most
    k blocks, e.g. the certified bounds of solver.pipeline.bounds), and >= every coarse node's
    neighbourhood bound plus its backward work. Then T = a * sum + b * max >= a * (sum bound)
    + b * (max bound). Proof in docs/training.md.
    """
    a, b = spec.time_weights
    cg, _ = coarse_view(g)
    w2 = float(g.work.sum() + g.backward_work.sum())
    if cluster.homogeneous:
        M, Bm = cluster.fast_memory, cluster.slow_memory_bandwidth
        spill = 0.0
        if math.isfinite(M):
            spill = max(0.0, g.param_bytes_total + float(g.act.max()) - k * M) / Bm
        total = w2 + spill
        per_stage = max(total / k, float((node_bounds(cg, cluster) + cg.backward_work).max()))
    else:
        _, _, compute = cluster.device_arrays()
        speed = np.sort(compute / cluster.compute)[::-1]
        total = w2 / float(speed[0])
        per_stage = w2 / float(speed[: min(k, len(speed))].sum())
    per_stage = max(per_stage, lower_bound(g, cluster, k), max_f_bound)
    return a * total + b * per_stage
