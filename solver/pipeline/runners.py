"""The pipeline methods, each ``run_X(g, cluster, opts) -> Plan | None`` on a given number of
blocks (the cluster's devices). Heuristics work on the coarse graph (co-location groups merged)
and map back; each heuristic plan is priced by the one evaluator and carries the universal
lower bound of :func:`solver.core.cost.lower_bound`. A heuristic with a device-aware variant
has it as ``run_X.on_devices`` (used on a cluster whose devices or links differ)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.core.progress import NULL_PROGRESS, Progress
from solver.core.result import WARM_START_MET, meets_target
from solver.pipeline.dp.chain_ideals import IDEALS_MIN_NODES, ChainResult, chain_ideal_dp
from solver.pipeline.dp.ideals import IdealTimeout, ideal_dp, too_many_ideals
from solver.pipeline.dp.warmstart import chain_warm_start, hint_of, proven_plan, skips_search
from solver.pipeline.exact.brute import brute_force
from solver.pipeline.heuristics.baselines import contiguous_split, device_scale
from solver.pipeline.heuristics.brkga import BrkgaOptions, brkga
from solver.pipeline.heuristics.manual import manual_assignment, read_sharding, stages_are_devices
from solver.pipeline.heuristics.orders import depth_first_order
from solver.pipeline.heuristics.poprt import PoprtOptions, poprt
from solver.pipeline.heuristics.refine import refine_plan
from solver.pipeline.heuristics.slicing import SliceTimeout, slice_order
from solver.pipeline.options import Incumbent, SolveOptions
from solver.pipeline.placement import (
    best_placement,
    candidate_sequences,
    full_placement,
    group_clusters,
    planning_cluster,
)
from solver.pipeline.plan import FEASIBLE, OPTIMAL, Plan, make_plan
from solver.pipeline.topology import flat_then_place

LARGE_GRAPH = 2000  # coarse nodes above which cpsat first runs SliceGraph for its hint
WARM_START_SHARE = 0.25  # share of the time limit cpsat may spend on its warm start
# the chain DP's tie-break at a met warm start gets as long as the bounds and warm start took,
# at least this (CP-SAT's tie-break, loaded and built, would take about as long); past it,
# CP-SAT's tie-break runs as before
MET_DP_MIN_SECONDS = 0.5
# local search (solver.pipeline.heuristics.refine) on cpsat's warm start before the search, at
# most this share of the time limit, on graphs of at least REFINE_MIN_NODES coarse nodes whose
# warm start is more than REFINE_HINT_GAP above the certified bound (on smaller graphs, and
# within 1%, CP-SAT usually proves in seconds: the dnn-partitioning graphs, up to 326 coarse
# nodes, pay nothing)
REFINE_HINT_SHARE = 0.1
REFINE_HINT_GAP = 0.01
REFINE_MIN_NODES = 500


def _members(labels: np.ndarray, L: int) -> np.ndarray:
    return np.bincount(labels, minlength=L)


def _finish(
    g: Graph,
    cluster: Cluster,
    a: np.ndarray,
    method: str,
    t0: float,
    stats: dict | None = None,
    placement: np.ndarray | None = None,
) -> Plan:
    """Wrap a heuristic assignment (block b on device ``placement[b]``, default b): order and
    co-location errors are bugs; a plan that breaks the device capacity is refused with the
    reason, as the exact methods refuse it."""
    bad = validate(g, cluster, a, placement=placement)
    hard = [v for v in bad if v.kind != "capacity"]
    if hard:
        raise AssertionError(f"{method} produced an invalid plan: {hard[0]}")
    if bad:
        raise MtppError(
            f"{method} found no plan of {g.name!r} within the device capacity ({len(bad)} "
            f"block(s) over; {bad[0]}); use more devices (--devices) or --method cpsat, "
            "which proves whether any plan fits"
        )
    return make_plan(
        g,
        cluster,
        a,
        method,
        lower_bound=lower_bound(g, cluster),
        status=FEASIBLE,
        wall_seconds=time.perf_counter() - t0,
        stats=stats,
        check=False,
        placement=placement,
    )


def run_baseline(what: str) -> Callable[[Graph, Cluster, SolveOptions], Plan]:
    def run(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
        t0 = time.perf_counter()
        cg, labels = coarse_view(g)
        ca = contiguous_split(cg, cluster.devices, what, members=_members(labels, cg.n))
        return _finish(g, cluster, ca[labels], what, t0)

    def on_devices(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
        """The split in proportion to the devices of each candidate sequence (the best valid
        one; with equal shares placed by best_placement), or as before (flat view, then
        placed) when none fits."""
        t0 = time.perf_counter()
        k = cluster.devices
        cg, labels = coarse_view(g)
        best = None
        for seq in candidate_sequences(cluster, k):
            scale = device_scale(cluster, seq, what)
            a = contiguous_split(cg, k, what, members=_members(labels, cg.n), scale=scale)[labels]
            if scale is None:  # equal shares: any placement keeps them, take the best one
                moved = best_placement(g, cluster, a)
                if moved.devices is not None:
                    seq = moved.devices
            if validate(g, cluster, a, placement=seq):
                continue
            val = evaluate(g, cluster, a, placement=seq).objective
            if best is None or val < best[0]:
                best = (val, a, seq)
        if best is None:
            return flat_then_place(run, g, cluster, k, opts)
        stats = {"planned_on": "device sequence"}
        return _finish(g, cluster, best[1], what, t0, stats, np.asarray(best[2], dtype=np.int64))

    run.__doc__ = f"Contiguous split of a topological order balanced by {what}."
    run.on_devices = on_devices
    return run


def quick_assignment(
    g: Graph, cluster: Cluster, deadline: float = math.inf
) -> tuple[float, np.ndarray | None]:
    """Best plan of the fast deterministic slicings (breadth- and depth-first orders) and the
    time-balanced baseline, as (objective, assignment on the original graph). The slicings
    stop at ``deadline`` (``time.perf_counter()``); the baseline is always there first.

    On a cluster whose devices or links differ, the blocks are found on the flat planning
    views (:func:`solver.pipeline.placement.planning_cluster`) and the objective is that of their
    best
    placement (:func:`solver.pipeline.placement.best_placement`)."""
    if not cluster.homogeneous:
        return _quick_placed(g, cluster, deadline)
    cg, labels = coarse_view(g)
    best, best_a = math.inf, None
    base = contiguous_split(cg, cluster.devices, "time")
    if not any(v.kind == "capacity" for v in validate(cg, cluster, base)):
        best, best_a = evaluate(cg, cluster, base).objective, base
    try:
        for order in (cg.topo_order, depth_first_order(cg)):
            val, a = slice_order(cg, cluster, order, deadline=deadline)
            if a is not None and val < best:
                best, best_a = val, a
    except SliceTimeout:
        pass
    if best_a is None:
        return math.inf, None
    return best, best_a[labels]


def _quick_placed(g: Graph, cluster: Cluster, deadline: float) -> tuple[float, np.ndarray | None]:
    """:func:`quick_assignment` on a heterogeneous cluster (see there); with two or more
    groups also on each distinct group alone, its blocks on that group's devices."""
    best, best_a = math.inf, None
    for biggest in (False, True):
        _, a = quick_assignment(g, planning_cluster(cluster, biggest), deadline)
        if a is not None:
            val = best_placement(g, cluster, a).objective
            if val < best:
                best, best_a = val, a
    kmax = coarse_view(g)[0].n
    for grp in group_clusters(cluster):
        sub = grp.cluster.with_devices(min(grp.cluster.devices, kmax))
        _, a = quick_assignment(g, sub, deadline)
        if a is None:
            continue
        used = grp.devices[: sub.devices]
        if not sub.homogeneous:  # the group's devices differ: its blocks on their best ones
            moved = best_placement(g, sub, a)
            if moved.devices is None:
                continue
            used = grp.devices[moved.devices]
        placement = full_placement(cluster, used)
        if validate(g, cluster, a, placement=placement):
            continue
        val = evaluate(g, cluster, a, placement=placement).objective
        if val < best:
            best, best_a = val, a
    return best, best_a


def _brkga_options(opts: SolveOptions):
    """The BRKGA options of a slicegraph run (``opts.extra``, seed and time limit)."""
    ex = opts.extra
    return BrkgaOptions(
        population=int(ex.get("population", BrkgaOptions.population)),
        generations=int(ex.get("generations", BrkgaOptions.generations)),
        elite=float(ex.get("elite", BrkgaOptions.elite)),
        mutants=float(ex.get("mutants", BrkgaOptions.mutants)),
        bias=float(ex.get("bias", BrkgaOptions.bias)),
        seed=opts.seed,
        time_limit=opts.time_limit,
    )


def run_slicegraph(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
    """SliceGraph: optimal slicing of topological orders searched by BRKGA (best of it and the
    time-balanced split when the limit stops the search before its first slicing)."""
    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    bo = _brkga_options(opts)
    bound = lower_bound(g, cluster)
    prog = opts.watcher()
    prog.note("searching topological orders")
    val, ca, stats = brkga(
        cg,
        cluster,
        replace(bo, time_limit=max(0.0, opts.time_limit - (time.perf_counter() - t0))),
        seeds=[cg.topo_order, depth_first_order(cg)],
        on_improve=lambda best, elapsed: prog.update(best, bound, elapsed),
    )
    base = contiguous_split(cg, cluster.devices, "time")
    if not validate(cg, cluster, base):
        base_val = evaluate(cg, cluster, base).objective
        if base_val < val:
            val, ca = base_val, base
            stats["fallback"] = "time-balanced split (the search found nothing better in time)"
    if ca is None:
        raise MtppError(
            f"slicegraph found no plan of {g.name!r} that fits the device capacity; "
            "try --method cpsat (which proves infeasibility) or more devices"
        )
    return _finish(g, cluster, ca[labels], "slicegraph", t0, stats)


def _slicegraph_on_devices(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
    """SliceGraph on a heterogeneous cluster: the flat-view plan placed by best_placement (half
    the time limit), then BRKGA whose orders are sliced against device sequences (group order,
    big/fast first, that plan's placement); the better of the two, so never worse than the
    flat view alone with the same time. best_placement may still improve the sliced blocks."""
    t0 = time.perf_counter()
    k = cluster.devices
    flat, refusal = None, None
    try:
        flat = flat_then_place(
            run_slicegraph, g, cluster, k, replace(opts, time_limit=opts.time_limit / 2)
        )
    except MtppError as e:
        refusal = e
    cg, labels = coarse_view(g)
    hints = [] if flat is None else [flat.placement]
    seqs = candidate_sequences(cluster, k, hints)
    left = max(0.0, opts.time_limit - (time.perf_counter() - t0))
    bo = replace(_brkga_options(opts), time_limit=left)
    val, ca, stats = brkga(
        cg, cluster, bo, seeds=[cg.topo_order, depth_first_order(cg)], sequences=seqs
    )
    if ca is not None:
        a, dev = ca[labels], np.array(stats.pop("devices"), dtype=np.int64)
        moved = best_placement(g, cluster, a)
        how = "device sequence"
        if moved.devices is not None and moved.objective < val:
            val, dev, how = moved.objective, moved.devices, "device sequence, then best placement"
        if flat is None or val < flat.objective:
            stats |= {"planned_on": how}
            return _finish(g, cluster, a, "slicegraph", t0, stats, np.asarray(dev, dtype=np.int64))
    if flat is None and refusal is not None:
        raise refusal
    if flat is not None:
        flat.wall_seconds = time.perf_counter() - t0
    return flat


run_slicegraph.on_devices = _slicegraph_on_devices


def run_cpsat(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
    """Exact CP-SAT model, warm-started by the quick heuristics and the exact DP over the
    separator chain (:mod:`solver.pipeline.dp.warmstart`), whose proven optimum needs no search.
    With ``opts.certified_bound`` the search is skipped or stopped once a plan meets it."""
    t0 = time.perf_counter()
    prog = opts.watcher()
    # the exact DP over the separator chain (cached from the bound stage) first: when it
    # proves its plan optimal, no search can improve it
    deadline = t0 + WARM_START_SHARE * opts.time_limit
    dp = chain_warm_start(g, cluster, deadline)
    tie_deadline = min(deadline, t0 + max(MET_DP_MIN_SECONDS, opts.spent_before))
    met = None if skips_search(dp) else met_incumbent_chain(g, cluster, opts, tie_deadline)
    if skips_search(met or dp):
        tie = bool(opts.extra.get("tie_break", True))
        plan = proven_plan(g, cluster, met or dp, "cpsat", t0, tie)
        if met is not None:  # solve's incumbent settled the bottleneck, the DP the tie-break
            plan.stats["stopped"] = WARM_START_MET
        prog.update(plan.objective, plan.lower_bound, time.perf_counter() - t0)
        return plan
    return _search_cpsat(g, cluster, opts, dp, prog, t0)


def met_incumbent_chain(
    g: Graph, cluster: Cluster, opts: SolveOptions, deadline: float
) -> ChainResult | None:
    """The exact DP over the separator chain's ideals (:func:`chain_ideal_dp`) at the cost of
    solve's incumbent when that incumbent already meets the certified bound and the tie-break
    is on with its default budget (``tie_break_seconds`` asks for CP-SAT's); None where it
    does not apply. The bottleneck is settled then, and CP-SAT would only run the tie-break,
    a time-boxed search (plus 0.2-0.3 s to load OR-Tools' CP-SAT and pandas); the DP's
    tie-break is exact over every plan at that cost. Only on graphs below IDEALS_MIN_NODES
    coarse nodes: larger ones had the DP from :func:`chain_warm_start`."""
    inc, bound, extra = opts.incumbent, opts.certified_bound, opts.extra
    if inc is None or bound is None or not meets_target(inc.objective, bound):
        return None
    if not cluster.homogeneous or not extra.get("tie_break", True) or "tie_break_seconds" in extra:
        return None
    cg, _ = coarse_view(g)
    if cg.n >= IDEALS_MIN_NODES:
        return None
    left = max(0.0, deadline - time.perf_counter())
    res = chain_ideal_dp(cg, cluster, cluster.devices, bound, left, upper=inc.objective)
    return res if res.optimal else None


def _search_cpsat(
    g: Graph, cluster: Cluster, opts: SolveOptions, dp, prog: Progress, t0: float
) -> Plan | None:
    """The CP-SAT search from the best warm start (solve's incumbent or the quick heuristics,
    the DP's plan, and SliceGraph first on large graphs), stopped at the certified bound."""
    # imported here: OR-Tools' cp_model pulls in pandas (about a second of start-up), which
    # a solve proven by the DP never needs; loading modules is start-up, not solve time (as
    # before the DP check, and as the command line's own imports)
    loading = time.perf_counter()
    from solver.pipeline.exact.cpsat import CpsatOptions, meets_bound, solve_cpsat  # heavy: ortools

    t0 += time.perf_counter() - loading
    warm_deadline = t0 + WARM_START_SHARE * opts.time_limit
    prog.note("warm start (slicing topological orders)")
    if opts.incumbent is not None:  # solve found it before the bounds
        best, hint = opts.incumbent.objective, opts.incumbent.assignment
    else:
        best, hint = quick_assignment(g, cluster, deadline=warm_deadline)
    dp_best, dp_hint = hint_of(dp, g)
    if dp_best < best:
        best, hint = dp_best, dp_hint
    cg, labels = coarse_view(g)
    met = meets_bound(best, opts.certified_bound)  # no SliceGraph search can beat it
    if cg.n > LARGE_GRAPH and time.perf_counter() < warm_deadline and not met:
        # on large graphs CP-SAT improves a hint slowly: spend the rest of the warm-start
        # share on the SliceGraph search first and start from the better plan
        left = warm_deadline - time.perf_counter()
        bo = BrkgaOptions(seed=opts.seed, time_limit=left)
        val, ca, _ = brkga(cg, cluster, bo, seeds=[cg.topo_order, depth_first_order(cg)])
        if ca is not None and val < best:
            best, hint = val, ca[labels]
    if hint is not None and cg.n >= REFINE_MIN_NODES and _gap_open(best, opts, cluster):
        prog.note("local search on the warm start")
        warm = refined_incumbent(g, cluster, Incumbent(best, hint, 0.0), opts)
        best, hint = warm.objective, warm.assignment
    heur_s = time.perf_counter() - t0
    if math.isfinite(best):
        prog.update(best, lower_bound(g, cluster), heur_s)
    co = CpsatOptions(
        time_limit=max(0.05, opts.time_limit - heur_s),
        workers=opts.workers,
        seed=opts.seed,
        gap=opts.gap,
        on_progress=None if prog is NULL_PROGRESS else prog.update,
        params=dict(opts.extra.get("cpsat_params", {})),
        tie_break=bool(opts.extra.get("tie_break", True)),
        tie_break_seconds=opts.extra.get("tie_break_seconds"),
        spent_before=opts.spent_before + heur_s,
        stop_at=opts.certified_bound,
    )
    prog.note("building the CP-SAT model")
    plan = solve_cpsat(g, cluster, hint, co)
    if plan is not None:
        plan.wall_seconds = time.perf_counter() - t0
        plan.stats["warm_start_seconds"] = round(heur_s, 3)
    return plan


def _gap_open(best: float, opts: SolveOptions, cluster: Cluster) -> bool:
    """True when the warm start is more than REFINE_HINT_GAP above the certified bound (or
    there is none) on a homogeneous cluster: the local search is worth its time."""
    bound = opts.certified_bound
    within = bound is not None and meets_target(best, bound * (1 + REFINE_HINT_GAP))
    return cluster.homogeneous and not within


def refined_incumbent(g: Graph, cluster: Cluster, inc: Incumbent, opts: SolveOptions) -> Incumbent:
    """``inc`` improved by the local search of :mod:`solver.pipeline.heuristics.refine` (at
    most REFINE_HINT_SHARE of the time limit, stopped at the certified bound), or ``inc``
    itself when it finds nothing better; its seconds are the search's. Homogeneous clusters
    only (on others the search returns its input)."""
    t0 = time.perf_counter()
    target = 0.0 if opts.certified_bound is None else opts.certified_bound
    deadline = t0 + REFINE_HINT_SHARE * opts.time_limit
    found = refine_plan(g, cluster, inc.assignment, deadline, target)
    seconds = time.perf_counter() - t0
    if found.objective < inc.objective:
        return Incumbent(found.objective, found.assignment, seconds)
    return Incumbent(inc.objective, inc.assignment, seconds)


def run_poprt(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
    """PopRT auto-sharding: candidate subgraphs, memory-balanced split, traversal."""
    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    po = _poprt_options(opts)
    ca, info = poprt(cg, cluster, po)
    _name_sharding_nodes(g, cg, labels, info)
    return _finish(g, cluster, ca[labels], "poprt", t0, info)


def _poprt_options(opts: SolveOptions):
    ex = opts.extra
    return PoprtOptions(
        optimal_perf=bool(ex.get("optimal_perf", False)),
        keep_per_step=int(ex.get("keep_per_step", PoprtOptions.keep_per_step)),
        keep_best=int(ex.get("keep_best", PoprtOptions.keep_best)),
        time_limit=opts.time_limit,
    )


def _name_sharding_nodes(g: Graph, cg: Graph, labels: np.ndarray, info: dict) -> None:
    """PopRT's sharding nodes of the coarse graph, named by original nodes (in place)."""
    info["sharding_nodes"] = {
        d: [g.names[int(np.flatnonzero(labels == cg.index[nm])[-1])] for nm in names]
        for d, names in info["sharding_nodes"].items()
    }


def _poprt_on_devices(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
    """PopRT on a heterogeneous cluster: the flat-view plan placed by best_placement, and
    PopRT planned for each candidate device sequence (group order, big/fast first, that
    plan's placement), each with an equal share of the time; the best valid plan wins."""
    t0 = time.perf_counter()
    k = cluster.devices
    share = opts.time_limit / 4  # the flat run and at most three sequences
    flat, refusal = None, None
    try:
        flat = flat_then_place(run_poprt, g, cluster, k, replace(opts, time_limit=share))
    except MtppError as e:
        refusal = e
    cg, labels = coarse_view(g)
    best = None if flat is None else (flat.objective, None, None, None)
    for seq in candidate_sequences(cluster, k, [] if flat is None else [flat.placement]):
        po = replace(_poprt_options(opts), time_limit=share)
        ca, info = poprt(cg, cluster, po, devices=seq)
        a = ca[labels]
        if validate(g, cluster, a, placement=seq):
            continue
        val = evaluate(g, cluster, a, placement=seq).objective
        if best is None or val < best[0]:
            best = (val, a, seq, info)
    if best is not None and best[1] is not None:
        _name_sharding_nodes(g, cg, labels, best[3])
        stats = best[3] | {"planned_on": "device sequence"}
        return _finish(g, cluster, best[1], "poprt", t0, stats, np.asarray(best[2], dtype=np.int64))
    if flat is None and refusal is not None:
        raise refusal
    if flat is not None:
        flat.wall_seconds = time.perf_counter() - t0
    return flat


run_poprt.on_devices = _poprt_on_devices


def run_manual(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
    """Manual sharding points from a YAML file (``--sharding FILE``)."""
    t0 = time.perf_counter()
    path = opts.extra.get("sharding")
    if not path:
        raise MtppError(
            "--method manual needs --sharding FILE.yaml (a list of {node, device, stage})"
        )
    device, stage = manual_assignment(g, read_sharding(path))
    need = int(device.max()) + 1
    if need > cluster.devices:
        raise MtppError(
            f"{path}: the sharding uses {need} devices but the cluster has {cluster.devices}; "
            f"pass --devices {need}"
        )
    placement = stages_are_devices(device, stage)  # None: the block is the device
    if placement is None:
        return _finish(g, cluster, device, "manual", t0, {"stages": stage.tolist()})
    return _finish(g, cluster, stage, "manual", t0, {"stages": stage.tolist()}, placement)


def run_idealdp(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
    """Exact DP over the ideals of the DAG (capped); at the time limit, the warm-start plan
    with the universal bound."""
    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    max_ideals = int(opts.extra.get("max_ideals", 50_000))
    if cg.n + 1 > max_ideals:  # a DAG has at least n + 1 ideals: refuse before the warm start
        raise too_many_ideals(max_ideals)
    upper, quick = quick_assignment(g, cluster, deadline=t0 + WARM_START_SHARE * opts.time_limit)
    try:
        val, ca, stats = ideal_dp(
            cg,
            cluster,
            upper=upper,
            max_ideals=max_ideals,
            time_limit=max(0.0, opts.time_limit - (time.perf_counter() - t0)),
        )
    except IdealTimeout as e:
        if quick is None:
            raise
        return _finish(g, cluster, quick, "idealdp", t0, {"note": f"{e}: warm-start plan"})
    if ca is None:
        return None
    return make_plan(
        g,
        cluster,
        ca[labels],
        "idealdp",
        lower_bound=val,
        status=OPTIMAL,
        wall_seconds=time.perf_counter() - t0,
        stats=stats,
    )


def run_brute(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
    """Enumerate every plan (tiny graphs only): the test oracle."""
    return brute_force(g, cluster)
