"""Every solver behind one call: ``solve(graph, cluster, method, options) -> Plan``.

Heuristics work on the coarse graph (co-location groups merged) and map back; each returned
plan is priced by the one evaluator. Heuristic plans carry the universal lower bound of
:func:`solver.cost.lower_bound`, so every plan has a certified gap.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from solver.cluster import Cluster
from solver.cost import lower_bound, validate
from solver.errors import MtppError
from solver.graph import Graph, coarse_view
from solver.plan import FEASIBLE, Plan, make_plan

LARGE_GRAPH = 2000  # coarse nodes above which cpsat first runs SliceGraph for its hint


@dataclass
class SolveOptions:
    """Options shared by the methods; ``extra`` holds method-specific ones."""

    time_limit: float = 60.0
    workers: int = 0
    seed: int = 0
    gap: float = 0.0
    progress: bool = False
    extra: dict = field(default_factory=dict)


def _members(labels: np.ndarray, L: int) -> np.ndarray:
    return np.bincount(labels, minlength=L)


def _finish(
    g: Graph, cluster: Cluster, a: np.ndarray, method: str, t0: float, stats: dict | None = None
) -> Plan:
    """Wrap a heuristic assignment: order/co-location errors are bugs; capacity ones are marked."""
    bad = validate(g, cluster, a)
    hard = [v for v in bad if v.kind != "capacity"]
    if hard:
        raise AssertionError(f"{method} produced an invalid plan: {hard[0]}")
    plan = make_plan(
        g,
        cluster,
        a,
        method,
        lower_bound=lower_bound(g, cluster),
        status=FEASIBLE,
        wall_seconds=time.perf_counter() - t0,
        stats=stats,
        check=False,
    )
    if bad:
        plan.status = "INVALID"
        plan.stats["violations"] = [str(v) for v in bad]
    return plan


def run_baseline(what: str) -> Callable[[Graph, Cluster, SolveOptions], Plan]:
    def run(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
        from solver.heuristics.baselines import contiguous_split

        t0 = time.perf_counter()
        cg, labels = coarse_view(g)
        ca = contiguous_split(cg, cluster.devices, what, members=_members(labels, cg.n))
        return _finish(g, cluster, ca[labels], what, t0)

    run.__doc__ = f"Contiguous split of a topological order balanced by {what}."
    return run


def quick_assignment(g: Graph, cluster: Cluster) -> tuple[float, np.ndarray | None]:
    """Best plan of the fast deterministic slicings (breadth- and depth-first orders) and the
    time-balanced baseline, as (objective, assignment on the original graph)."""
    from solver.cost import evaluate
    from solver.heuristics.baselines import contiguous_split
    from solver.heuristics.orders import depth_first_order
    from solver.heuristics.slicing import slice_order

    cg, labels = coarse_view(g)
    best, best_a = math.inf, None
    base = contiguous_split(cg, cluster.devices, "time")
    if not any(v.kind == "capacity" for v in validate(cg, cluster, base)):
        best, best_a = evaluate(cg, cluster, base).objective, base
    for order in (cg.topo_order, depth_first_order(cg)):
        val, a = slice_order(cg, cluster, order)
        if a is not None and val < best:
            best, best_a = val, a
    if best_a is None:
        return math.inf, None
    return best, best_a[labels]


def run_slicegraph(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
    """SliceGraph: optimal slicing of topological orders searched by BRKGA."""
    from solver.heuristics.brkga import BrkgaOptions, brkga
    from solver.heuristics.orders import depth_first_order

    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    ex = opts.extra
    bo = BrkgaOptions(
        population=int(ex.get("population", BrkgaOptions.population)),
        generations=int(ex.get("generations", BrkgaOptions.generations)),
        elite=float(ex.get("elite", BrkgaOptions.elite)),
        mutants=float(ex.get("mutants", BrkgaOptions.mutants)),
        bias=float(ex.get("bias", BrkgaOptions.bias)),
        seed=opts.seed,
        time_limit=opts.time_limit,
    )
    from solver.progress import SolveProgress

    bound = lower_bound(g, cluster)
    with SolveProgress(enabled=opts.progress, title=f"slicegraph {g.name}") as prog:
        val, ca, stats = brkga(
            cg,
            cluster,
            bo,
            seeds=[cg.topo_order, depth_first_order(cg)],
            on_improve=lambda best, elapsed: prog.update(best, bound, elapsed),
        )
    if ca is None:
        raise MtppError(
            f"slicegraph found no plan of {g.name!r} that fits the device capacity; "
            "try --method cpsat (which proves infeasibility) or more devices"
        )
    return _finish(g, cluster, ca[labels], "slicegraph", t0, stats)


def run_cpsat(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
    """Exact CP-SAT model, warm-started by the quick heuristics."""
    from solver.exact.cpsat import CpsatOptions, solve_cpsat
    from solver.progress import SolveProgress

    t0 = time.perf_counter()
    best, hint = quick_assignment(g, cluster)
    cg, labels = coarse_view(g)
    if cg.n > LARGE_GRAPH:
        # on large graphs CP-SAT improves a hint slowly: spend a quarter of the time on the
        # SliceGraph search first and start from the better plan
        from solver.heuristics.brkga import BrkgaOptions, brkga
        from solver.heuristics.orders import depth_first_order

        bo = BrkgaOptions(seed=opts.seed, time_limit=opts.time_limit / 4)
        val, ca, _ = brkga(cg, cluster, bo, seeds=[cg.topo_order, depth_first_order(cg)])
        if ca is not None and val < best:
            hint = ca[labels]
    heur_s = time.perf_counter() - t0
    with SolveProgress(enabled=opts.progress, title=f"cpsat {g.name}") as prog:
        co = CpsatOptions(
            time_limit=max(0.05, opts.time_limit - heur_s),
            workers=opts.workers,
            seed=opts.seed,
            gap=opts.gap,
            on_progress=prog.update if opts.progress else None,
            params=dict(opts.extra.get("cpsat_params", {})),
        )
        plan = solve_cpsat(g, cluster, hint, co)
    if plan is not None:
        plan.wall_seconds = time.perf_counter() - t0
        plan.stats["warm_start_seconds"] = round(heur_s, 3)
    return plan


def run_poprt(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
    """PopRT auto-sharding: candidate subgraphs, memory-balanced split, traversal."""
    from solver.heuristics.poprt import PoprtOptions, poprt

    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    ex = opts.extra
    po = PoprtOptions(
        optimal_perf=bool(ex.get("optimal_perf", False)),
        keep_per_step=int(ex.get("keep_per_step", PoprtOptions.keep_per_step)),
        keep_best=int(ex.get("keep_best", PoprtOptions.keep_best)),
        time_limit=opts.time_limit,
    )
    ca, info = poprt(cg, cluster, po)
    info["sharding_nodes"] = {
        d: [g.names[int(np.flatnonzero(labels == cg.index[nm])[-1])] for nm in names]
        for d, names in info["sharding_nodes"].items()
    }
    return _finish(g, cluster, ca[labels], "poprt", t0, info)


def run_manual(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
    """Manual sharding points from a YAML file (``--sharding FILE``)."""
    from solver.heuristics.manual import manual_assignment, read_sharding

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
    return _finish(g, cluster, device, "manual", t0, {"stages": stage.tolist()})


def run_idealdp(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
    """Exact DP over the ideals of the DAG (capped)."""
    from solver.heuristics.idealdp import ideal_dp
    from solver.plan import OPTIMAL

    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    upper, _ = quick_assignment(g, cluster)
    val, ca, stats = ideal_dp(
        cg,
        cluster,
        upper=upper,
        max_ideals=int(opts.extra.get("max_ideals", 50_000)),
        time_limit=opts.time_limit,
    )
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
    from solver.exact.brute import brute_force

    return brute_force(g, cluster)


METHODS: dict[str, Callable[[Graph, Cluster, SolveOptions], Plan | None]] = {
    "cpsat": run_cpsat,
    "slicegraph": run_slicegraph,
    "poprt": run_poprt,
    "manual": run_manual,
    "idealdp": run_idealdp,
    "time": run_baseline("time"),
    "params": run_baseline("params"),
    "uniform": run_baseline("uniform"),
    "brute": run_brute,
}


def solve(g: Graph, cluster: Cluster, method: str, opts: SolveOptions | None = None) -> Plan | None:
    """Run ``method`` on graph ``g`` and cluster; None when no valid plan exists."""
    try:
        fn = METHODS[method]
    except KeyError:
        raise MtppError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}") from None
    return fn(g, cluster, opts or SolveOptions())
