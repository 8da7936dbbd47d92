"""The universal lower bound on the period of every joint plan (proof: docs/joint.md, "The
universal bound"): each operator's least work over every loop split it can run with, spread
over all devices, and no less than the heaviest operator on the fastest device."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.spmd.mesh import Mesh
from solver.spmd.program import Planner
from solver.spmd.redistribute import local_bytes
from solver.spmd.rules import StrategyError, shard, strategy_of
from solver.spmd.training import backward_factor, gradient_flow


def split_tuples(spec, k: int) -> list[tuple[int, ...]]:
    """Every loop split an operator can run with on some mesh of at most ``k`` devices: each
    split divides its loop (1 on a fixed loop) and their product is at most ``k``. This is the
    union of :func:`solver.spmd.rules.candidates` over 1..k devices, enumerated directly
    (the product never exceeds ``k``, so big clusters stay cheap)."""
    out: list[tuple[tuple[int, ...], int]] = [((), 1)]
    for lp, size in enumerate(spec.loops):
        opts = [1] if lp in spec.fixed else [n for n in range(1, k + 1) if size % n == 0]
        out = [(s + (n,), p * n) for s, p in out for n in opts if p * n <= k]
    return [s for s, _ in out]


def op_work(sm, spec, i: int, k: int) -> np.ndarray:
    """Rows (devices used, local FLOPs, local bytes moved) of operator ``i`` under every split
    it can run with on <= ``k`` devices: what ``Planner.compute_time`` prices, per device."""
    op = sm.ops[i]
    tensors = [*op.data_inputs, *op.outputs]
    rows = set()
    for s in split_tuples(spec, k):
        try:
            sh = shard(op, sm, spec, strategy_of(spec, s), math.prod(s))
        except StrategyError:
            continue
        moved = sum(
            local_bytes(lay, sm.itemsize(t))
            for t, lay in zip(tensors, [*sh.in_layouts, *sh.out_layouts], strict=True)
        )
        rows.add((math.prod(sh.loop_splits), sh.local_flops, moved))
    return np.asarray(sorted(rows), dtype=float).reshape(-1, 3)


def universal_bound(sm, cluster: Cluster) -> float:
    """A lower bound on the period of every joint plan (any stages, devices, meshes and
    strategies), proven in docs/joint.md ("The universal bound"): the largest of

    - for each distinct device compute c: sum over operators of min over splits of
      p * max(F / c, M / b), divided by sum over devices of max(1, c_d / c);
    - sum over operators of min over splits of p * F, divided by the total compute;
    - the heaviest operator's least time on any split, at the fastest device.

    p, F, M: devices used, local FLOPs and bytes of one split (:func:`op_work`); b the
    memory bandwidth. Operators are priced once per signature."""
    if not sm.ops:
        return 0.0
    k = cluster.devices
    planner = Planner(sm, Mesh((1,), (math.inf,), (0.0,)), cluster)
    first: dict = {}
    count: dict = {}
    for i, sig in enumerate(planner.signature):
        first.setdefault(sig, i)
        count[sig] = count.get(sig, 0) + 1
    works = [(count[sig], op_work(sm, planner.specs[i], i, k)) for sig, i in first.items()]
    _, _, compute = cluster.device_arrays()
    b = cluster.memory_bandwidth
    best = 0.0
    for c in np.unique(compute):
        need = sum(
            n * float((w[:, 0] * np.maximum(w[:, 1] / c, w[:, 2] / b)).min()) for n, w in works
        )
        best = max(best, need / float(np.maximum(1.0, compute / c).sum()))
    flops = sum(n * float((w[:, 0] * w[:, 1]).min()) for n, w in works)
    best = max(best, flops / float(compute.sum()))
    fastest = float(compute.max())
    heaviest = max(float(np.maximum(w[:, 1] / fastest, w[:, 2] / b).min()) for _, w in works)
    return max(best, heaviest)


@dataclass(frozen=True)
class TrainingWork:
    """Per operator at the fastest compute c (docs/training.md, "The universal training
    bound"): ``least`` = min over splits of t(o, L) = (1 + beta_o) max(F / c, M / b), and
    ``spread`` = min over splits of p(L) t(o, L) (device-seconds)."""

    least: np.ndarray
    spread: np.ndarray


def training_work(sm, cluster: Cluster) -> TrainingWork:
    """:class:`TrainingWork` of every operator (each signature priced once)."""
    n = len(sm.ops)
    least, spread = np.zeros(n), np.zeros(n)
    if not n:
        return TrainingWork(least, spread)
    k = cluster.devices
    planner = Planner(sm, Mesh((1,), (math.inf,), (0.0,)), cluster)
    flow = gradient_flow(sm)
    _, _, compute = cluster.device_arrays()
    c, b = float(compute.max()), cluster.memory_bandwidth
    priced: dict = {}
    for i, sig in enumerate(planner.signature):
        beta = backward_factor(sm.ops[i], flow.needs_grad) if flow.has_backward[i] else 0.0
        key = (sig, beta)
        if key not in priced:
            w = op_work(sm, planner.specs[i], i, k)
            t = (1.0 + beta) * np.maximum(w[:, 1] / c, w[:, 2] / b)
            priced[key] = (float(t.min()), float((w[:, 0] * t).min()))
        least[i], spread[i] = priced[key]
    return TrainingWork(least, spread)


def universal_training_bound(
    sm, cluster: Cluster, time_weights: tuple[float, float], work: TrainingWork | None = None
) -> float:
    """A lower bound on the iteration time T = a sum t + b max t (+ max sync >= 0) of every
    joint training plan (any stages, devices, meshes, strategies and memory), proven in
    docs/training.md ("Joint training plans"): sum t >= sum over operators of their least
    time, max t >= the sum of their least device-seconds over the devices
    (:class:`TrainingWork`; ``work``: already computed for ``sm`` on ``cluster``)."""
    w = training_work(sm, cluster) if work is None else work
    a, b = time_weights
    return a * math.fsum(w.least) + b * math.fsum(w.spread) / cluster.devices
