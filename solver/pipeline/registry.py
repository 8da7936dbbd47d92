"""Every solver behind one call: ``solve(graph, cluster, method, options) -> Plan``.

Heuristics work on the coarse graph (co-location groups merged) and map back; each returned
plan is priced by the one evaluator. Heuristic plans carry the universal lower bound of
:func:`solver.core.cost.lower_bound`, so every plan has a certified gap.

:func:`solve` first checks the options (per method, with the list of valid keys), then runs the
method on at most as many blocks as the coarse graph has nodes (extra devices stay empty, which
changes no optimum) and refuses, before allocating, a run whose tables would not fit in memory.
Every method stops at ``time_limit`` and returns its best plan so far.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.pipeline.plan import ALL_PLACEMENTS, FEASIBLE, OPTIMAL, Plan, make_plan

LARGE_GRAPH = 2000  # coarse nodes above which cpsat first runs SliceGraph for its hint
WARM_START_SHARE = 0.25  # share of the time limit cpsat may spend on its warm start
# share of the time limit for the certified lower bounds (solver.pipeline.bounds)
BOUND_SHARE = 0.15
BOUND_MAX_SECONDS = 10.0
MAX_SEED = 2**31 - 1  # CP-SAT's random_seed is a 32-bit int
MAX_WORKERS = 1024
PLACING_METHODS = ("manual", "cpsat", "brute")  # they choose (or are given) the devices


@dataclass(frozen=True)
class Incumbent:
    """A valid plan known before the search: its objective and assignment (original graph;
    None with an infinite objective when no quick plan fits)."""

    objective: float
    assignment: np.ndarray | None
    seconds: float


@dataclass
class SolveOptions:
    """Options shared by the methods; ``extra`` holds method-specific ones."""

    time_limit: float = 60.0
    workers: int = 0
    seed: int = 0
    gap: float = 0.0
    progress: bool = False
    extra: dict = field(default_factory=dict)
    # a certified lower bound of this very problem (set by solve): cpsat stops at a plan meeting it
    certified_bound: float | None = None
    # the warm-start plan solve found before the bounds (cpsat starts from it)
    incumbent: Incumbent | None = None
    # seconds solve spent before the method (bounds, warm start): the tie-break's yardstick
    spent_before: float = 0.0


# ---------------------------------------------------------------- option checking


@dataclass(frozen=True)
class OptionSpec:
    """One method option: its type, the values it accepts, and how to say so."""

    kind: type
    ok: Callable[[Any], bool] = lambda v: True
    rule: str = ""

    def describe(self) -> str:
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        base = names.get(self.kind, "a JSON object")
        return f"{base} {self.rule}".strip()


def _int(lo: int, hi: int | None = None) -> OptionSpec:
    rule = f">= {lo}" if hi is None else f"in {lo}..{hi}"
    return OptionSpec(int, lambda v: v >= lo and (hi is None or v <= hi), rule)


def _frac(lo_open: bool, hi_open: bool) -> OptionSpec:
    rule = f"in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}"
    return OptionSpec(
        float,
        lambda v: (v > 0 if lo_open else v >= 0) and (v < 1 if hi_open else v <= 1),
        rule,
    )


METHOD_OPTIONS: dict[str, dict[str, OptionSpec]] = {
    "cpsat": {
        "cpsat_params": OptionSpec(dict),
        "tie_break": OptionSpec(bool),
        "tie_break_seconds": OptionSpec(float, lambda v: v >= 0, ">= 0"),
    },
    "slicegraph": {
        "population": _int(2, 100_000),
        "generations": _int(0),
        "elite": _frac(True, False),
        "mutants": _frac(False, True),
        "bias": _frac(False, False),
    },
    "poprt": {
        "optimal_perf": OptionSpec(bool),
        "keep_per_step": _int(1),
        "keep_best": _int(1),
    },
    "manual": {"sharding": OptionSpec(str)},
    "idealdp": {"max_ideals": _int(1, 10_000_000)},
    "time": {},
    "params": {},
    "uniform": {},
    "brute": {},
}
# CP-SAT parameters the solver sets itself for soundness or for --time-limit
RESERVED_CPSAT = {
    "presolve_inclusion_work_limit": "it guards against google/or-tools#5293 (wrong optima)",
    "max_time_in_seconds": "use --time-limit",
    "relative_gap_limit": "use --gap",
    "num_workers": "use --workers",
    "random_seed": "use --seed",
    "log_search_progress": "CP-SAT's log would mix with mtpp's output on stdout",
    "log_to_stdout": "CP-SAT's log would mix with mtpp's output on stdout",
}


def _type_ok(kind: type, v: Any) -> bool:
    if kind is bool:
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if kind is float:
        return isinstance(v, (int, float)) and math.isfinite(v)
    return isinstance(v, kind)


def check_method_options(method: str, extra: dict) -> dict:
    """The options of ``method`` checked against :data:`METHOD_OPTIONS` (floats as float).

    Raises :class:`MtppError` naming an unknown key (with the valid ones) or a wrong value.
    """
    specs = METHOD_OPTIONS.get(method, {})
    out = {}
    for key, value in extra.items():
        spec = specs.get(key)
        if spec is None:
            valid = f"valid: {', '.join(specs)}" if specs else "it takes no options"
            raise MtppError(f"unknown option {key!r} for {method}; {valid}")
        if not _type_ok(spec.kind, value) or not spec.ok(value):
            raise MtppError(
                f"option {key!r} for {method} must be {spec.describe()}, got {value!r}"[:300]
            )
        out[key] = float(value) if spec.kind is float else value
    if "cpsat_params" in out:
        _check_cpsat_params(out["cpsat_params"])
    return out


def _check_cpsat_params(params: dict) -> None:
    from ortools.sat.python import cp_model

    probe = cp_model.CpSolver().parameters
    for key, value in params.items():
        if key in RESERVED_CPSAT:
            raise MtppError(f"cpsat_params: {key!r} cannot be set here; {RESERVED_CPSAT[key]}")
        try:
            setattr(probe, key, value)
        except AttributeError:
            raise MtppError(f"cpsat_params: {key!r} is not a CP-SAT parameter") from None
        except (TypeError, ValueError):
            raise MtppError(
                f"cpsat_params: {value!r} is not a valid value for {key!r}"[:300]
            ) from None


def check_solve_options(opts: SolveOptions) -> None:
    """Refuse a time limit, gap, seed or worker count no method can honour."""

    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if not number(opts.time_limit) or opts.time_limit <= 0:
        raise MtppError(f"--time-limit must be a finite number > 0 seconds, got {opts.time_limit}")
    if not number(opts.gap) or not 0 <= opts.gap < 1:
        raise MtppError(f"--gap must be a finite number in [0, 1), got {opts.gap}")
    if not isinstance(opts.seed, int) or not 0 <= opts.seed <= MAX_SEED:
        raise MtppError(f"--seed must be an integer in 0..{MAX_SEED}, got {opts.seed}")
    if not isinstance(opts.workers, int) or not 0 <= opts.workers <= MAX_WORKERS:
        raise MtppError(f"--workers must be an integer in 0..{MAX_WORKERS}, got {opts.workers}")


def memory_budget() -> int:
    """Bytes one solve may allocate: half of this machine's physical memory (8 GiB if unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def estimate_bytes(method: str, g: Graph, k: int, extra: dict) -> int:
    """Rough peak bytes ``method`` allocates on coarse graph ``g`` with k blocks (its largest
    tables: the slicing DP, BRKGA's population, CP-SAT's variables, the ideal DP)."""
    from solver.pipeline.heuristics.slicing import slice_table_bytes

    n = g.n
    if method in ("time", "params", "uniform", "poprt", "manual", "brute"):
        return 64 * n  # linear in n (brute checks its own k^n)
    need = slice_table_bytes(n, k)  # quick_assignment / every decode
    if method == "slicegraph":
        need += 24 * int(extra.get("population", 20)) * n
    elif method == "cpsat":
        need += 400 * 2 * (n + g.num_tensors + g.num_params) * k  # Python and C++ per variable
    elif method == "idealdp":
        cap = int(extra.get("max_ideals", 50_000))
        need += cap * (16 * (k + 1) + 2 * n)
    return need


def _check_memory(method: str, g: Graph, k: int, extra: dict) -> None:
    from solver.core.units import format_bytes

    need, budget = estimate_bytes(method, g, k, extra), memory_budget()
    if need > budget:
        raise MtppError(
            f"{method} on {g.n:,} nodes and {k:,} blocks would need about {format_bytes(need)} "
            f"of memory (the limit is {format_bytes(budget)}, half of this machine's); use fewer "
            "devices (--devices) or a linear-time method (time, params, uniform)"
        )


# ---------------------------------------------------------------- shared steps


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
        from solver.pipeline.heuristics.baselines import contiguous_split

        t0 = time.perf_counter()
        cg, labels = coarse_view(g)
        ca = contiguous_split(cg, cluster.devices, what, members=_members(labels, cg.n))
        return _finish(g, cluster, ca[labels], what, t0)

    def on_devices(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan | None:
        """The split in proportion to the devices of each candidate sequence (the best valid
        one; with equal shares placed by best_placement), or as before (flat view, then
        placed) when none fits."""
        from solver.core.cost import evaluate
        from solver.pipeline.heuristics.baselines import contiguous_split, device_scale
        from solver.pipeline.placement import best_placement, candidate_sequences

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
            return _flat_then_place(run, g, cluster, k, opts)
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
    from solver.core.cost import evaluate
    from solver.pipeline.heuristics.baselines import contiguous_split
    from solver.pipeline.heuristics.orders import depth_first_order
    from solver.pipeline.heuristics.slicing import SliceTimeout, slice_order

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
    from solver.core.cost import evaluate
    from solver.pipeline.placement import (
        best_placement,
        full_placement,
        group_clusters,
        planning_cluster,
    )

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
    from solver.pipeline.heuristics.brkga import BrkgaOptions

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
    from solver.cli.progress import SolveProgress
    from solver.core.cost import evaluate
    from solver.pipeline.heuristics.baselines import contiguous_split
    from solver.pipeline.heuristics.brkga import brkga
    from solver.pipeline.heuristics.orders import depth_first_order

    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    bo = _brkga_options(opts)
    bound = lower_bound(g, cluster)
    with SolveProgress(enabled=opts.progress, title=f"slicegraph {g.name}") as prog:
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
    from solver.pipeline.heuristics.brkga import brkga
    from solver.pipeline.heuristics.orders import depth_first_order
    from solver.pipeline.placement import best_placement, candidate_sequences

    t0 = time.perf_counter()
    k = cluster.devices
    flat, refusal = None, None
    try:
        flat = _flat_then_place(
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
    from solver.cli.progress import SolveProgress
    from solver.pipeline.dp.warmstart import chain_warm_start, proven_plan, skips_search

    t0 = time.perf_counter()
    with SolveProgress(enabled=opts.progress, title=f"cpsat {g.name}") as prog:
        # the exact DP over the separator chain (cached from the bound stage) first: when it
        # proves its plan optimal, no search can improve it
        dp = chain_warm_start(g, cluster, t0 + WARM_START_SHARE * opts.time_limit)
        if skips_search(dp):
            tie = bool(opts.extra.get("tie_break", True))
            plan = proven_plan(g, cluster, dp, "cpsat", t0, tie)
            prog.update(plan.objective, plan.lower_bound, time.perf_counter() - t0)
            return plan
        return _search_cpsat(g, cluster, opts, dp, prog, t0)


def _search_cpsat(g: Graph, cluster: Cluster, opts: SolveOptions, dp, prog, t0: float):
    """The CP-SAT search from the best warm start (solve's incumbent or the quick heuristics,
    the DP's plan, and SliceGraph first on large graphs), stopped at the certified bound."""
    # imported here: OR-Tools' cp_model pulls in pandas (about a second of start-up), which
    # a solve proven by the DP never needs; loading modules is start-up, not solve time (as
    # before the DP check, and as the command line's own imports)
    loading = time.perf_counter()
    from solver.pipeline.dp.warmstart import hint_of
    from solver.pipeline.exact.cpsat import CpsatOptions, meets_bound, solve_cpsat

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
        from solver.pipeline.heuristics.brkga import BrkgaOptions, brkga
        from solver.pipeline.heuristics.orders import depth_first_order

        left = warm_deadline - time.perf_counter()
        bo = BrkgaOptions(seed=opts.seed, time_limit=left)
        val, ca, _ = brkga(cg, cluster, bo, seeds=[cg.topo_order, depth_first_order(cg)])
        if ca is not None and val < best:
            best, hint = val, ca[labels]
    heur_s = time.perf_counter() - t0
    if math.isfinite(best):
        prog.update(best, lower_bound(g, cluster), heur_s)
    co = CpsatOptions(
        time_limit=max(0.05, opts.time_limit - heur_s),
        workers=opts.workers,
        seed=opts.seed,
        gap=opts.gap,
        on_progress=prog.update if opts.progress else None,
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


def run_poprt(g: Graph, cluster: Cluster, opts: SolveOptions) -> Plan:
    """PopRT auto-sharding: candidate subgraphs, memory-balanced split, traversal."""
    from solver.pipeline.heuristics.poprt import poprt

    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    po = _poprt_options(opts)
    ca, info = poprt(cg, cluster, po)
    _name_sharding_nodes(g, cg, labels, info)
    return _finish(g, cluster, ca[labels], "poprt", t0, info)


def _poprt_options(opts: SolveOptions):
    from solver.pipeline.heuristics.poprt import PoprtOptions

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
    from solver.core.cost import evaluate
    from solver.pipeline.heuristics.poprt import poprt
    from solver.pipeline.placement import candidate_sequences

    t0 = time.perf_counter()
    k = cluster.devices
    share = opts.time_limit / 4  # the flat run and at most three sequences
    flat, refusal = None, None
    try:
        flat = _flat_then_place(run_poprt, g, cluster, k, replace(opts, time_limit=share))
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
    from solver.pipeline.heuristics.manual import (
        manual_assignment,
        read_sharding,
        stages_are_devices,
    )

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
    from solver.pipeline.dp.ideals import IdealTimeout, ideal_dp, too_many_ideals

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
    from solver.pipeline.exact.brute import brute_force

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


def _single_block(g: Graph, cluster: Cluster, method: str, t0: float) -> Plan | None:
    """k = 1: the one plan there is (optimal by enumeration), or None when it does not fit."""
    from solver.core.cost import evaluate
    from solver.pipeline.placement import best_placement

    a = np.zeros(g.n, dtype=np.int64)
    best = best_placement(g, cluster, a)  # homogeneous: block 0 on device 0
    if best.devices is None or validate(g, cluster, a, placement=best.devices):
        return None
    return make_plan(
        g,
        cluster,
        a,
        method,
        lower_bound=evaluate(g, cluster, a, placement=best.devices).objective
        if best.exact
        else lower_bound(g, cluster),
        status=OPTIMAL if best.exact else FEASIBLE,
        wall_seconds=time.perf_counter() - t0,
        stats={"trivial": "one block: the only plan"},
        check=False,
        placement=None if cluster.homogeneous else best.devices,
    )


def _widen(plan: Plan, g: Graph, cluster: Cluster) -> Plan:
    """A plan solved with fewer blocks, re-evaluated on the full cluster (the extra devices stay
    empty; every bound still holds, as no plan can use more blocks than nodes)."""
    stats = dict(plan.stats, solved_blocks=plan.k)
    stats.pop("raw_lower_bound", None)
    raw = plan.stats.get("raw_lower_bound", plan.lower_bound)
    return make_plan(
        g,
        cluster,
        plan.assignment,
        plan.method,
        lower_bound=raw,
        status=plan.status,
        wall_seconds=plan.wall_seconds,
        stats=stats,
        check=False,
    )


def solve(g: Graph, cluster: Cluster, method: str, opts: SolveOptions | None = None) -> Plan | None:
    """Run ``method`` on graph ``g`` and cluster; None when no valid plan exists.

    The certified lower bounds of :mod:`solver.pipeline.bounds` get a share of the time limit
    (:data:`BOUND_SHARE`, at most :data:`BOUND_MAX_SECONDS`) and stop as soon as one meets a
    known plan; the plan carries the larger of its method's own bound and the certified one
    (:func:`certify`). cpsat gets its warm start first and the bounds next (it stops at a plan
    meeting them); every other method runs first and its plan is the one the bounds try to meet.
    """
    try:
        fn = METHODS[method]
    except KeyError:
        raise MtppError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}") from None
    opts = opts or SolveOptions()
    check_solve_options(opts)
    opts = replace(opts, extra=check_method_options(method, opts.extra))
    t0 = time.perf_counter()
    cg, _ = coarse_view(g)
    k = min(cluster.devices, cg.n)
    if k == 1 and method != "manual":
        return _single_block(g, cluster, method, t0)
    if method != "manual":
        _check_memory(method, cg, k, opts.extra)
    budget = min(BOUND_MAX_SECONDS, BOUND_SHARE * opts.time_limit)
    if method == "cpsat":
        return _solve_exact(fn, g, cluster, k, opts, budget)
    rest = replace(opts, time_limit=max(0.05, opts.time_limit - budget))  # bounds after it
    plan = _run_method(fn, g, cluster, k, rest, method)
    if plan is None:
        return None
    return certify(g, cluster, plan, certified_bound(g, cluster, budget, plan.objective))


def _solve_exact(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions, budget: float):
    """cpsat: the warm start, the bounds (they stop once one meets it), then the method with
    both; it solves this very problem (k blocks as good as every device), so the certified
    bound holds for it, and it stops as soon as its plan meets it."""
    inc = warm_incumbent(g, cluster, k, WARM_START_SHARE * opts.time_limit)
    rep = certified_bound(g, cluster, budget, None if inc is None else inc.objective)
    # rep.infeasible (no plan fits the capacity) still runs the method: it names what does not
    # fit, or finds no plan; a plan would contradict the proof and make_plan would refuse it
    spent = rep.seconds + (0.0 if inc is None else inc.seconds)
    opts = replace(
        opts,
        time_limit=max(0.05, opts.time_limit - spent),
        certified_bound=rep.value,
        incumbent=inc,
        spent_before=spent,
    )
    plan = _run_method(fn, g, cluster, k, opts, "cpsat")
    if plan is not None and inc is not None:
        plan.wall_seconds += inc.seconds
    return None if plan is None else certify(g, cluster, plan, rep)


def warm_incumbent(g: Graph, cluster: Cluster, k: int, seconds: float) -> Incumbent | None:
    """The quick heuristics' best plan on k blocks (:func:`quick_assignment`, the exact
    solver's warm start) on a homogeneous cluster; None on one whose devices or links differ
    (there cpsat chooses the devices, and its warm start is placed first)."""
    if not cluster.homogeneous:
        return None
    t0 = time.perf_counter()
    val, a = quick_assignment(g, cluster.with_devices(k), deadline=t0 + seconds)
    return Incumbent(val, a, time.perf_counter() - t0)


def _run_method(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions, method: str):
    """``fn`` on k blocks: placed after planning on a cluster whose devices or links differ
    (heuristics), on every device (manual, which names them; cpsat and brute on such a
    cluster, which choose them), else on k blocks widened to every device."""
    if not cluster.homogeneous and method not in PLACING_METHODS:
        return _plan_then_place(fn, g, cluster, k, opts, method)
    if method == "manual" or k == cluster.devices or not cluster.homogeneous:
        return fn(g, cluster, opts)
    plan = fn(g, cluster.with_devices(k), opts)
    return None if plan is None else _widen(plan, g, cluster)


def _run_blocks(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions) -> Plan | None:
    """Run ``fn`` on a homogeneous ``cluster`` with k blocks (widened to every device)."""
    if k == cluster.devices:
        return fn(g, cluster, opts)
    plan = fn(g, cluster.with_devices(k), opts)
    return None if plan is None else _widen(plan, g, cluster)


def _plan_then_place(
    fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions, method: str
) -> Plan | None:
    """A heuristic on a cluster whose devices or links differ: with two or more groups, also
    planned on each distinct group alone (:func:`_plan_on_group`); the better plan wins."""
    from solver.pipeline.placement import group_clusters

    groups = group_clusters(cluster)
    if not groups:
        return _plan_on_cluster(fn, g, cluster, k, opts)
    t0 = time.perf_counter()
    end = t0 + opts.time_limit
    best, refusal = None, None
    # equal shares: each group run gets (time left) / (runs left); the whole-cluster run last
    # gets its share plus whatever the group runs left unused
    for i, grp in enumerate(groups):
        share = max(0.05, (end - time.perf_counter()) / (len(groups) + 1 - i))
        try:
            plan = _plan_on_group(fn, g, cluster, grp, replace(opts, time_limit=share), method)
        except MtppError:
            continue  # the group alone cannot hold the graph: the whole cluster decides
        if plan is not None and (best is None or plan.objective < best.objective):
            best = plan
    try:
        whole = _plan_on_cluster(
            fn, g, cluster, k, replace(opts, time_limit=max(0.05, end - time.perf_counter()))
        )
    except MtppError as e:
        whole, refusal = None, e
    if whole is not None and (best is None or whole.objective <= best.objective):
        best = whole
    if best is None and refusal is not None:
        raise refusal
    if best is not None:
        best.wall_seconds = time.perf_counter() - t0
    return best


def _plan_on_cluster(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions) -> Plan | None:
    """A heuristic on a cluster whose devices or links differ: its device-aware variant
    (``fn.on_devices``: it plans against device sequences) when it has one and every device
    gets a block, else :func:`_flat_then_place`."""
    aware = getattr(fn, "on_devices", None)
    if aware is not None and k == cluster.devices:
        return aware(g, cluster, opts)
    return _flat_then_place(fn, g, cluster, k, opts)


def _plan_on_group(
    fn, g: Graph, cluster: Cluster, grp, opts: SolveOptions, method: str
) -> Plan | None:
    """``fn``'s plan on one group alone (``grp``: a :class:`solver.pipeline.placement.GroupCluster`,
    k = its devices, or the coarse nodes when fewer), its blocks on that group's devices,
    re-evaluated on ``cluster`` (FEASIBLE, the universal bound of ``cluster``)."""
    from solver.pipeline.placement import full_placement

    sub = grp.cluster
    kg = min(sub.devices, coarse_view(g)[0].n)
    if kg == 1:
        a, used = np.zeros(g.n, dtype=np.int64), grp.devices[:1]
        stats: dict = {}
    else:
        if sub.homogeneous:
            plan = _run_blocks(fn, g, sub, kg, opts)
        else:
            plan = _plan_on_cluster(fn, g, sub, kg, opts)
        if plan is None:
            return None
        sub_dev = np.arange(plan.k) if plan.placement is None else plan.placement
        a, used = plan.assignment, grp.devices[sub_dev]
        stats = dict(plan.stats)
        for key in ("raw_lower_bound", "optimal_within", "bound_source", "bound_scope"):
            stats.pop(key, None)
    placement = full_placement(cluster, used)
    if validate(g, cluster, a, placement=placement):
        return None
    stats["planned_on"] = f"one group alone ({sub.name}, {kg} blocks)"
    return make_plan(
        g,
        cluster,
        a,
        method,
        lower_bound=lower_bound(g, cluster),
        status=FEASIBLE,
        wall_seconds=0.0,
        stats=stats,
        check=False,
        placement=placement,
    )


def _flat_then_place(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions) -> Plan | None:
    """A heuristic on a cluster whose devices or links differ: its blocks are found on the
    flat planning view (the smallest device's memory, so that every block fits any device;
    again with the largest when that finds none or its blocks cannot be placed), then
    :func:`solver.pipeline.placement.best_placement` chooses each block's device on the real
    cluster.
    The plan carries the universal bound of the real cluster, never the flat view's."""
    from solver.pipeline.placement import planning_cluster

    views = [planning_cluster(cluster)]
    if planning_cluster(cluster, biggest=True) != views[0]:
        views.append(planning_cluster(cluster, biggest=True))
    for i, flat in enumerate(views):
        last = i == len(views) - 1
        try:
            plan = _run_blocks(fn, g, flat, k, opts)
        except MtppError:
            if last:
                raise
            continue
        if plan is None:
            if last:
                return None
            continue
        placed = place_plan(g, cluster, plan)
        if placed is not None or last:
            if placed is None:
                raise MtppError(
                    f"{plan.method} found blocks but no placement of them on the devices of "
                    f"{cluster.name!r} fits every device's capacity; try --method cpsat, "
                    "which chooses blocks and devices together"
                )
            return placed
    return None


def place_plan(g: Graph, cluster: Cluster, plan: Plan) -> Plan | None:
    """``plan``'s blocks on the best placement of them on ``cluster`` (re-evaluated there,
    FEASIBLE, with the universal bound of ``cluster``), or None when no placement fits."""
    from solver.pipeline.placement import best_placement

    best = best_placement(g, cluster, plan.assignment)
    if best.devices is None:
        return None
    stats = dict(plan.stats)
    stats.pop("raw_lower_bound", None)
    stats.pop("optimal_within", None)
    stats["placement"] = {
        "how": "best placement of the blocks" + (" (proven)" if best.exact else " (local search)"),
        "planned_on": plan.cluster.name,
    }
    return make_plan(
        g,
        cluster,
        plan.assignment,
        plan.method,
        lower_bound=lower_bound(g, cluster),
        status=FEASIBLE,
        wall_seconds=plan.wall_seconds,
        stats=stats,
        check=False,
        placement=best.devices,
    )


def certified_bound(g: Graph, cluster: Cluster, time_limit: float, target: float | None = None):
    """The certified lower bounds of :mod:`solver.pipeline.bounds` (a ``BoundReport``); ``target``,
    the
    objective of a known plan, stops them as soon as one meets it.

    On a cluster whose devices or links differ:
    :func:`solver.pipeline.bounds.topology.topology_bound`
    (the bounds on ``cluster.relaxation()``, the universal bound, and the group-labelled chains
    that pay the slow link between groups), each valid for every plan on every placement.
    """
    from solver.pipeline.bounds import certified_lower_bound
    from solver.pipeline.bounds.topology import topology_bound

    if cluster.homogeneous:
        return certified_lower_bound(g, cluster, time_limit=time_limit, target=target)
    return topology_bound(g, cluster, time_limit)


def bound_stats(rep, binding: str | None = None, value: float | None = None) -> dict:
    """``stats["bound"]`` of a plan: the binding bound's name and value (the certified report's
    own unless a method's proof binds) and every certified bound."""
    return {
        "binding": rep.binding if binding is None else binding,
        "value": rep.value if value is None else value,
        "certified": rep.to_dict(),
    }


def certify(g: Graph, cluster: Cluster, plan: Plan, rep) -> Plan:
    """``plan`` with the best proven bound: its method's own (an exact method's proof) or the
    certified one, whichever is larger; ``stats["bound"]`` names the binding one. A plan the
    method could not prove becomes OPTIMAL when the certified bound meets its objective.

    On a cluster whose devices or links differ, a method's own bound is kept only when it
    covers every plan and placement (``stats["bound_scope"]``, the CP-SAT model with
    placement); a plan over some device's capacity is placed again
    (:func:`solver.pipeline.placement.best_placement`) and refused only when no placement fits.
    """
    placement = plan.placement
    if not cluster.homogeneous:
        bad = validate(g, cluster, plan.assignment, placement=placement)
        bad = [v for v in bad if v.kind == "capacity"]
        if bad and plan.method != "manual":
            placed = place_plan(g, cluster, plan)
            if placed is None:
                raise MtppError(
                    f"{plan.method}'s plan fits no placement of its blocks on the devices of "
                    f"{cluster.name!r} ({bad[0]}); use more devices or --method cpsat"
                )
            plan, placement, bad = placed, placed.placement, []
        if bad:
            raise MtppError(
                f"{plan.method}'s plan does not fit the devices it names ({bad[0]}); "
                "change the devices in the sharding file"
            )
    covers = cluster.homogeneous or plan.stats.get("bound_scope") == ALL_PLACEMENTS
    own = plan.lower_bound if covers else None
    # a cpsat plan that stopped on meeting the certified bound rests on that bound's proof
    met = plan.method == "cpsat" and "stopped" in plan.stats
    if own is not None and own >= rep.value and not met:
        binding, bound, status = plan.stats.get("bound_source", plan.method), own, plan.status
        resolution = float(plan.stats.get("optimal_within", 0.0))
    else:  # a method's proof within its rounding resolution stays one under a larger bound
        binding, bound, status = rep.binding, rep.value, OPTIMAL
        resolution = float(plan.stats.get("optimal_within", 0.0)) if own is not None else 0.0
        if plan.status != OPTIMAL:
            resolution = 0.0
    stats = dict(plan.stats)
    stats.pop("raw_lower_bound", None)
    stats["bound"] = bound_stats(rep, binding, bound)
    return make_plan(
        g,
        cluster,
        plan.assignment,
        plan.method,
        lower_bound=bound,
        status=status,  # make_plan keeps OPTIMAL only when the bound meets the objective
        wall_seconds=plan.wall_seconds + rep.seconds,
        stats=stats,
        check=False,
        resolution=resolution,
        placement=placement,
    )
