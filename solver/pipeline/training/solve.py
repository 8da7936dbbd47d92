"""The training solve: the plan of least iteration time T under the schedule's per-stage memory,
with its certificate (docs/training.md, "Solving a training plan").

:func:`solve_training` is what :func:`solver.pipeline.registry.solve` runs when
``SolveOptions.training`` is set. Its stages:

1. one block (k = 1): the one plan there is on each device, priced; optimal by enumeration;
2. a method other than cpsat: its plan (planned for max f, as always) priced as a training plan,
   refused when it breaks the training memory, with the certified bound below;
3. cpsat: the warm starts, every quick heuristic plan (time, params and uniform splits, the
   slicings of two topological orders, the bottleneck DP's plan) and the practitioners' splits
   (uniform layers, fewer layers at the ends, DeepSpeed's by parameters), each re-priced by the
   training model; the best valid one is the incumbent;
4. the certified bound: :func:`training_lower_bound` strengthened by the certified bottleneck
   bound of :mod:`solver.pipeline.bounds` (max t_i >= max f_i);
5. the exact training DP over ideals (:func:`exact_training_plan`) where it applies, else the
   one over the separator chain's ideals (:func:`chain_training_plan`: Llama-shaped decoders;
   on a cluster whose links differ, a bound over every placement and a placed plan); when it
   proves its plan, nothing else runs;
6. otherwise CP-SAT's training model (``solver.pipeline.exact.cpsat_training``), from the
   incumbent, when that module is installed;
7. the best plan with lower = max(every proven bound), the binding one named, and the status by
   the one rule (:func:`solver.core.result.certify`, through :func:`make_plan`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.core.training import TrainingCost, TrainingSpec, training_cost
from solver.pipeline.dp.warmstart import FIRST_SHARE, hint_of, ideals_first
from solver.pipeline.heuristics.baselines import contiguous_split
from solver.pipeline.options import SolveOptions
from solver.pipeline.placement import planning_cluster
from solver.pipeline.plan import FEASIBLE, OPTIMAL, Plan, make_plan
from solver.pipeline.runners import WARM_START_SHARE, quick_assignment
from solver.pipeline.topology import run_method
from solver.pipeline.training.certificate import (
    BOUND_MAX_SECONDS,
    BOUND_SHARE,
    Certificate,
    certified_training_bound,
)
from solver.pipeline.training.chain_dp import chain_training_plan
from solver.pipeline.training.exact import (
    TrainingDPDoesNotApply,
    TrainingSolution,
    exact_training_plan,
    layer_training_plan,
)
from solver.pipeline.training.splits import practitioner_splits, read_layers

DP_SHARE = 0.5  # of what is left for the exact training DP when CP-SAT may follow
# the names of the bounds (stats["bound"]["binding"])
DP_BOUND = "training ideal DP"
CHAIN_BOUND = "training chain DP"  # the DP over the separator chain's ideals
CHAIN_DP_SHARE = 0.95  # of what is left for it: CP-SAT proves little at its scale
CPSAT_BOUND = "cpsat"
ONE_BLOCK = "one block: every device tried"
LAYER_DP = "best whole-layer split"  # the training DP over layer prefixes (a warm start)
LAYER_DP_SHARE = 0.1  # of the time limit, at least, for it


@dataclass(frozen=True)
class Candidate:
    """A training plan found by one source (a heuristic, a split, the DP, CP-SAT), priced."""

    source: str
    assignment: np.ndarray
    cost: TrainingCost
    placement: np.ndarray | None = None


def solve_training(g: Graph, cluster: Cluster, method: str, fn, opts: SolveOptions) -> Plan | None:
    """The training plan of ``method`` (``fn``, its runner) for ``opts.training``; None when
    it is proven that no plan fits the training memory (module docstring)."""
    t0 = time.perf_counter()
    spec = opts.training
    cg, _ = coarse_view(g)
    k = min(cluster.devices, cg.n)
    if k == 1 and method != "manual":
        return _one_block(g, cluster, method, spec, t0)
    seconds = min(BOUND_MAX_SECONDS, BOUND_SHARE * opts.time_limit)
    cert = certified_training_bound(g, cluster, k, spec, seconds)
    if method != "cpsat":
        return _method_plan(g, cluster, k, method, fn, opts, cert, t0)
    starts = _warm_starts(g, cluster, k, spec, opts)
    best = _best(starts)
    dp = _training_dp(g, cluster, k, spec, opts, best, cert, t0)
    best = _best([*starts, *dp])
    if not _proven(best, cert):
        best = _best([best, *_cpsat(g, cluster, k, spec, opts, best, cert, t0)])
    if best is None:
        if cert.infeasible:
            return None
        raise MtppError(_nothing_fits(g, cluster, spec, starts))
    return _finish(g, cluster, method, best, cert, starts, t0)


def _one_block(
    g: Graph, cluster: Cluster, method: str, spec: TrainingSpec, t0: float
) -> Plan | None:
    """k = 1: the one block on each device (the devices differ only on a heterogeneous
    cluster); the least T among those that fit is optimal by enumeration."""
    a = np.zeros(g.n, dtype=np.int64)
    n = cluster.devices
    tries = [None] if cluster.homogeneous else [np.roll(np.arange(n), -d) for d in range(n)]
    priced = [
        Candidate(ONE_BLOCK, a, training_cost(g, cluster, a, spec, placement=p), p) for p in tries
    ]
    best = _best(priced)
    if best is None:
        return None
    cert = Certificate({ONE_BLOCK: best.cost.iteration_time})
    return _finish(g, cluster, method, best, cert, priced, t0)


def _method_plan(
    g: Graph, cluster: Cluster, k: int, method: str, fn, opts: SolveOptions, cert, t0: float
) -> Plan | None:
    """A heuristic's (or manual) plan, planned for max f, priced as a training plan."""
    if cert.infeasible:
        return None
    plan = run_method(fn, g, cluster, k, replace(opts, training=None), method)
    if plan is None:
        return None
    cost = training_cost(g, cluster, plan.assignment, opts.training, placement=plan.placement)
    if not cost.valid:
        raise MtppError(
            f"{method}'s plan does not fit the training memory ({cost.violations[0]}); use "
            "--method cpsat, which searches training plans, or more devices"
        )
    found = Candidate(method, plan.assignment, cost, plan.placement)
    return _finish(g, cluster, method, found, cert, [found], t0)


def _warm_starts(
    g: Graph, cluster: Cluster, k: int, spec: TrainingSpec, opts: SolveOptions
) -> list[Candidate]:
    """Every quick heuristic plan and practitioners' split, priced by the training model."""
    prog = opts.watcher()
    prog.note("warm starts (heuristic plans and practitioners' splits, priced for training)")
    deadline = time.perf_counter() + WARM_START_SHARE * opts.time_limit
    kc = cluster.with_devices(k) if cluster.homogeneous else cluster
    cg, labels = coarse_view(g)
    plans = {
        f"{what} split": contiguous_split(cg, k, what)[labels]
        for what in ("time", "params", "uniform")
    }
    _, plans["slicing"] = quick_assignment(g, kc, deadline=deadline)
    _, plans["bottleneck DP"] = hint_of(ideals_first(g, kc, FIRST_SHARE * opts.time_limit), g)
    out = [
        Candidate(name, a, training_cost(g, cluster, a, spec))
        for name, a in plans.items()
        if a is not None
    ]
    try:
        splits = practitioner_splits(g, cluster, k, spec)
    except MtppError:  # no layers to split (no numbered modules, no separators)
        return out
    out += [Candidate(s.name, s.assignment, s.cost) for s in splits]
    # its own share: the slicings may have spent the warm-start share on a large graph
    seconds = max(deadline - time.perf_counter(), LAYER_DP_SHARE * opts.time_limit)
    return out + _best_layer_split(g, cluster, k, spec, out, seconds)


def _best_layer_split(g, cluster, k, spec, known, seconds: float) -> list[Candidate]:
    """The least-T plan whose stages are runs of whole layers, each fitting its memory (the
    training DP over layer prefixes; a warm start only: its bound is over a restricted
    problem). On a cluster whose devices or links differ it runs on the flat planning view
    (reference speed, the smallest capacity) and its plan is priced on the real devices."""
    try:
        sol = layer_training_plan(
            g,
            planning_cluster(cluster).with_devices(k),
            k,
            spec,
            read_layers(g).of_node,
            time_limit=seconds,
            upper=_value(_best(known)),
        )
    except TrainingDPDoesNotApply:
        return []
    if sol.assignment is None:
        return []
    return [Candidate(LAYER_DP, sol.assignment, training_cost(g, cluster, sol.assignment, spec))]


def _best(candidates: list[Candidate | None]) -> Candidate | None:
    """The valid candidate of least T (the first among equals), None when none is valid."""
    valid = [c for c in candidates if c is not None and c.cost.valid]
    return min(valid, key=lambda c: c.cost.iteration_time, default=None)


def _value(best: Candidate | None) -> float:
    return math.inf if best is None else best.cost.iteration_time


def _proven(best: Candidate | None, cert: Certificate) -> bool:
    """True when the bounds so far meet the best plan (or prove that none exists)."""
    if best is None:
        return cert.infeasible
    return best.cost.iteration_time <= cert.value * (1 + 1e-6)


def _left(opts: SolveOptions, t0: float) -> float:
    return max(0.05, opts.time_limit - (time.perf_counter() - t0))


def _training_dp(
    g: Graph, cluster: Cluster, k: int, spec, opts, best, cert: Certificate, t0: float
) -> list[Candidate]:
    """The exact training DP: over every ideal (homogeneous clusters, graphs of few ideals),
    else over the separator chain's ideals; its bound joins the certificate, and
    ``cert.infeasible`` is set when it proves that no plan fits."""
    if _proven(best, cert):
        return []
    opts.watcher().note("exact training DP over ideals")
    try:
        sol = exact_training_plan(
            g,
            cluster.with_devices(k),
            k,
            spec,
            time_limit=DP_SHARE * _left(opts, t0),
            upper=_value(best),
        )
    except TrainingDPDoesNotApply as e:
        cert.notes[DP_BOUND] = str(e)
        return _chain_dp(g, cluster, k, spec, opts, best, cert, t0)
    return _dp_outcome(DP_BOUND, sol, cert)


def _chain_dp(
    g: Graph, cluster: Cluster, k: int, spec, opts, best, cert: Certificate, t0: float
) -> list[Candidate]:
    """The training DP over the separator chain's ideals, where it applies."""
    opts.watcher().note("exact training DP over the separator chain's ideals")
    try:
        sol = chain_training_plan(
            g,
            cluster.with_devices(k) if cluster.homogeneous else cluster,
            k,
            spec,
            time_limit=CHAIN_DP_SHARE * _left(opts, t0),
            upper=_value(best),
        )
    except TrainingDPDoesNotApply as e:
        cert.notes[CHAIN_BOUND] = str(e)
        return []
    return _dp_outcome(CHAIN_BOUND, sol, cert)


def _dp_outcome(name: str, sol: TrainingSolution, cert: Certificate) -> list[Candidate]:
    """A DP's bound into the certificate (or its proof that no plan fits) and its plan."""
    if math.isinf(sol.lower):
        cert.infeasible = True
        cert.notes[name] = sol.note or "no plan fits the memory"
        return []
    cert.bounds[name] = sol.lower
    cert.notes[name] = f"{sol.ideals} ideals, {sol.blocks} blocks, {sol.candidates} candidates" + (
        f"; {sol.note}" if sol.note else ""
    )
    if sol.assignment is None:
        return []
    return [Candidate(name, sol.assignment, sol.cost, sol.placement)]


def _cpsat(
    g: Graph, cluster: Cluster, k: int, spec, opts, best, cert: Certificate, t0: float
) -> list[Candidate]:
    """CP-SAT's training model from the incumbent, when it is installed; its proven bound
    joins the certificate (with its rounding resolution when it proved its optimum)."""
    try:
        # heavy: ortools (and the module exists only once the CP-SAT training model is built)
        from solver.pipeline.exact.cpsat_training import solve_training_cpsat  # noqa: PLC0415
    except ImportError:
        cert.notes[CPSAT_BOUND] = "the CP-SAT training model is not available"
        return []
    opts.watcher().note("CP-SAT training model")
    res = solve_training_cpsat(
        g,
        cluster.with_devices(k) if cluster.homogeneous else cluster,
        spec,
        time_limit=_left(opts, t0),
        hint=None if best is None else best.assignment,
        upper=_value(best),
        workers=opts.workers,
        seed=opts.seed,
        progress=opts.watcher(),
    )
    cert.notes[CPSAT_BOUND] = f"status {res.status}, {res.seconds:.2f} s"
    if res.infeasible:
        cert.infeasible = True
        return []
    cert.bounds[CPSAT_BOUND] = res.lower
    if res.optimal:
        cert.resolution = float(res.resolution)
    if res.assignment is None:
        return []
    cost = training_cost(g, cluster, res.assignment, spec, placement=res.placement)
    return [Candidate(CPSAT_BOUND, res.assignment, cost, res.placement)]


def _finish(
    g: Graph, cluster: Cluster, method: str, best: Candidate, cert: Certificate, tried, t0
) -> Plan:
    """The plan of ``best`` with the certificate; OPTIMAL only when the bound meets T (the one
    rule, applied by make_plan)."""
    T = best.cost.iteration_time
    lower = min(cert.value, T) if cert.bounds else None
    stats = {
        "bound": {
            "binding": cert.binding if cert.bounds else None,
            "value": lower,
            "certified": dict(cert.bounds),
        },
        "training_solve": {
            "source": best.source,
            "tried": {c.source: _row(c) for c in tried},
            "notes": dict(cert.notes),
        },
    }
    return make_plan(
        g,
        cluster,
        best.assignment,
        method,
        lower_bound=cert.value if cert.bounds else None,
        status=OPTIMAL if cert.bounds else FEASIBLE,
        wall_seconds=time.perf_counter() - t0,
        stats=stats,
        resolution=cert.resolution,
        placement=best.placement,
        training=best.cost.spec,
    )


def _row(c: Candidate) -> dict:
    """What stats record of one plan tried: its T, or why it is not valid."""
    return {
        "iteration_time": c.cost.iteration_time,
        "valid": c.cost.valid,
        "violation": c.cost.violations[0] if c.cost.violations else None,
    }


def _nothing_fits(g: Graph, cluster: Cluster, spec: TrainingSpec, starts) -> str:
    """Why no training plan was found (nothing proved that none exists)."""
    first = next((c.cost.violations[0] for c in starts if c.cost.violations), None)
    return (
        f"no training plan of {g.name!r} found that fits the memory of {cluster.devices} "
        f"device(s) with {spec.schedule}, m = {spec.microbatches}"
        + (f" (e.g. {first})" if first else "")
        + "; use more devices, fewer microbatches or a smaller --optimizer-state"
    )
