"""Every pipeline solver behind one call: ``solve(graph, cluster, method, options) -> Plan``.

:func:`solve` first checks the options (per method, with the list of valid keys), then runs the
method (:mod:`solver.pipeline.runners`) on at most as many blocks as the coarse graph has nodes
(extra devices stay empty, which changes no optimum; :mod:`solver.pipeline.topology` places the
blocks on a cluster whose devices or links differ) and refuses, before allocating, a run whose
tables would not fit in memory (:mod:`solver.pipeline.options`). Every method stops at
``time_limit`` and returns its best plan so far, with the larger of its own bound and the
certified bounds of :mod:`solver.pipeline.bounds` (:func:`certify`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.core.result import meets_target
from solver.pipeline.bounds import certified_lower_bound, topology
from solver.pipeline.bounds.combine import TWO_CHAIN_PAUSE, BoundReport, BoundSearch
from solver.pipeline.bounds.spine import SPINE_REL_TOL, removed_scopes
from solver.pipeline.bounds.spine_plan import spine_plan
from solver.pipeline.bounds.two_chain import (
    TwoChainBound,
    TwoChainSplit,
    two_chain_bound,
    two_chain_case,
    two_chain_plan,
)
from solver.pipeline.dp.chain_ideals import IDEALS_MIN_NODES, ChainResult
from solver.pipeline.dp.warmstart import FIRST_SHARE, hint_of, ideals_first, skips_search
from solver.pipeline.options import (
    Incumbent,
    SolveOptions,
    check_memory,
    check_method_options,
    check_solve_options,
)
from solver.pipeline.placement import best_placement
from solver.pipeline.plan import ALL_PLACEMENTS, FEASIBLE, OPTIMAL, Plan, make_plan
from solver.pipeline.runners import (
    WARM_START_SHARE,
    quick_assignment,
    run_baseline,
    run_brute,
    run_cpsat,
    run_idealdp,
    run_manual,
    run_poprt,
    run_slicegraph,
)
from solver.pipeline.topology import place_plan, run_method
from solver.pipeline.training.solve import solve_training

# share of the time limit for the certified lower bounds (solver.pipeline.bounds)
BOUND_SHARE = 0.15
BOUND_MAX_SECONDS = 10.0
SPINE_PLAN_SHARE = 0.1  # of the time limit, at most, for the spine plan (cpsat's incumbent)
TWO_CHAIN_SHARE = 0.4  # of the time limit, at most, for the two-chain plan and bound ...
TWO_CHAIN_PLAN_SHARE = 0.4  # ... of which the bound, first, leaves the plan this much
# on two chains, the pair block's time before them (it proves BART-base at k = 16 in 0.14 s,
# it cannot prove the k = 8 rows, where it took 1-2.5 s before the two chains proved them)
QUICK_PAIR_BLOCK_SECONDS = 0.5
# the CP-SAT tie-break's share of the seconds that found a plan meeting the certified bound
MET_TIE_BREAK_SHARE = 0.5
MET_TIE_BREAK_MIN_SECONDS = 0.1
# the methods that tell SolveOptions.reporter their steps and incumbents (the others are silent)
PROGRESS_METHODS = ("cpsat", "slicegraph")
__all__ = [
    "METHODS",
    "PROGRESS_METHODS",
    "bound_stats",
    "certified_bound",
    "certify",
    "solve",
    "warm_incumbent",
]


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
    if opts.training is not None:  # a training plan: least iteration time T (docs/training.md)
        return solve_training(g, cluster, method, fn, opts)
    t0 = time.perf_counter()
    cg, _ = coarse_view(g)
    k = min(cluster.devices, cg.n)
    if k == 1 and method != "manual":
        return _single_block(g, cluster, method, t0)
    if method != "manual":
        check_memory(method, cg, k, opts.extra)
    budget = min(BOUND_MAX_SECONDS, BOUND_SHARE * opts.time_limit)
    if method == "cpsat":
        return _solve_exact(fn, g, cluster, k, opts, budget)
    rest = replace(opts, time_limit=max(0.05, opts.time_limit - budget))  # bounds after it
    plan = run_method(fn, g, cluster, k, rest, method)
    if plan is None:
        return None
    return certify(g, cluster, plan, certified_bound(g, cluster, budget, plan.objective))


def _solve_exact(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions, budget: float):
    """cpsat: the DP over ideals first where it applies (graphs with data edges that are not
    order edges, such as training graphs: when it proves its plan, nothing else runs), the warm
    start, the bounds (they stop once one meets it), then the method with both; it solves this
    very problem (k blocks as good as every device), so the certified bound holds for it, and
    it stops as soon as its plan meets it."""
    t0 = time.perf_counter()
    first = ideals_first(g, cluster.with_devices(k), FIRST_SHARE * opts.time_limit)
    if skips_search(first):  # the DP over ideals proved its plan: no warm start, bounds, search
        plan = run_method(fn, g, cluster, k, opts, "cpsat")  # run_cpsat reads the cached proof
        return None if plan is None else certify(g, cluster, plan, ideals_report(first, t0))
    inc = better_incumbent(
        warm_incumbent(g, cluster, k, WARM_START_SHARE * opts.time_limit), first, g, t0
    )
    rep, inc = _bounds_and_plans(g, cluster, k, inc, budget, opts.time_limit)
    # rep.infeasible (no plan fits the capacity) still runs the method: it names what does not
    # fit, or finds no plan; a plan would contradict the proof and make_plan would refuse it
    spent = rep.seconds + (0.0 if inc is None else inc.seconds)
    opts = replace(
        opts,
        time_limit=max(0.05, opts.time_limit - spent),
        certified_bound=rep.value,
        incumbent=inc,
        spent_before=spent,
        extra=_met_tie_break(g, inc, rep, opts.extra),
    )
    plan = run_method(fn, g, cluster, k, opts, "cpsat")
    if plan is not None and inc is not None:
        plan.wall_seconds += inc.seconds
    return None if plan is None else certify(g, cluster, plan, rep)


def _gap_open(inc: Incumbent | None, rep: BoundReport) -> bool:
    return inc is not None and not meets_target(inc.objective, rep.value)


def _bounds_and_plans(
    g: Graph, cluster: Cluster, k: int, inc: Incumbent | None, budget: float, limit: float
) -> tuple[BoundReport, Incumbent | None]:
    """The certified bounds and the plans cpsat gets before its search, each run only while
    the gap to the incumbent is open: the bounds, the spine plan, the two chains. On a
    two-chain graph (an encoder-decoder) the bounds pause before the spine relaxations and
    the pair block, and the two-chain relaxation goes first: it often proves the incumbent,
    which they only approach (docs/bounds.md, "two chain"); the split is computed only when
    the bounds before the pause leave the gap open."""
    target = None if inc is None else inc.objective
    if not cluster.homogeneous:  # the topology bound; no spine plan nor two chains here
        return certified_bound(g, cluster, budget, target), inc
    search = BoundSearch(g, cluster, budget, target=target)
    rep = search.run(until=TWO_CHAIN_PAUSE)
    split = two_chain_case(g, cluster, k) if _gap_open(inc, rep) else None
    if split is None:  # the order of every other graph: all the bounds first
        rep = search.run()
    if _gap_open(inc, rep):
        inc = with_spine_plan(g, cluster, k, inc, SPINE_PLAN_SHARE * limit)
    if split is None:
        return rep, inc
    # two chains: the pair block where it is quick (with the spine plan's cost as its target;
    # past that, after the two chains)
    if _gap_open(inc, rep):
        rep = search.quick_pair_block(QUICK_PAIR_BLOCK_SECONDS, inc.objective)
    if _gap_open(inc, rep):
        rep, inc = with_two_chain(g, cluster, k, rep, inc, TWO_CHAIN_SHARE * limit, split)
    # the pair block and the packings with the better incumbent, while the gap is open (else
    # they are listed as not needed)
    return search.resume(rep, inc.objective), inc


def _met_tie_break(g: Graph, inc: Incumbent | None, rep: BoundReport, extra: dict) -> dict:
    """The method options with the tie-break's seconds where the incumbent already meets the
    certified bound on a graph too large for the chain DP's exact tie-break (runners):
    CP-SAT's time-boxed tie-break gets MET_TIE_BREAK_SHARE of the seconds spent finding that
    plan (the warm start and the plan DPs), not of the bounds' proof (on Whisper-small at
    k = 8 the default, half of the whole 9 s solve, searched 4.6 s and, given 60 s, found no
    plan sending less). A user's tie_break / tie_break_seconds is kept."""
    if inc is None or not meets_target(inc.objective, rep.value):
        return extra
    if "tie_break_seconds" in extra or not extra.get("tie_break", True):
        return extra
    if coarse_view(g)[0].n < IDEALS_MIN_NODES:  # the chain DP breaks the tie exactly there
        return extra
    seconds = max(MET_TIE_BREAK_MIN_SECONDS, MET_TIE_BREAK_SHARE * inc.seconds)
    return {**extra, "tie_break_seconds": seconds}


def ideals_report(first: ChainResult, t0: float) -> BoundReport:
    """The certified report of a plan the DP over ideals proved (its bound meets the plan, so
    the relaxations are not computed); its seconds are the first attempt's."""
    return BoundReport(
        value=first.lower,
        binding="ideals",
        bounds={"ideals": first.lower},
        seconds=time.perf_counter() - t0,
        skipped={"relaxations": "the DP over ideals proved the plan optimal"},
    )


def better_incumbent(
    inc: Incumbent | None, first: ChainResult | None, g: Graph, t0: float
) -> Incumbent | None:
    """The warm start, or the first attempt's plan when the DP found a better one."""
    value, assignment = hint_of(first, g)
    if assignment is not None and (inc is None or value < inc.objective):
        return Incumbent(value, assignment, time.perf_counter() - t0)
    return inc


def with_spine_plan(
    g: Graph, cluster: Cluster, k: int, inc: Incumbent | None, seconds: float
) -> Incumbent | None:
    """The incumbent, or the spine plan (:mod:`solver.pipeline.bounds.spine_plan`: the nodes
    that keep the graph from being a chain pinned, the exact chain DP on the rest) when it is
    better; its seconds count as the incumbent's either way. cpsat asks for it only when the
    certified bounds leave a gap to its warm start (a graph that proves at once pays nothing)."""
    t0 = time.perf_counter()
    upper = math.inf if inc is None else inc.objective
    found = spine_plan(g, cluster, k, seconds, upper)
    spent = time.perf_counter() - t0 + (0.0 if inc is None else inc.seconds)
    if found is not None and found.value < upper:
        return Incumbent(found.value, found.assignment, spent)
    return None if inc is None else Incumbent(inc.objective, inc.assignment, spent)


def with_two_chain(
    g: Graph,
    cluster: Cluster,
    k: int,
    rep: BoundReport,
    inc: Incumbent,
    seconds: float,
    split: TwoChainSplit | None = None,
) -> tuple[BoundReport, Incumbent]:
    """The certified report and the incumbent after the two-chain DP
    (:mod:`solver.pipeline.bounds.two_chain`: encoder-decoders as two chains with cross
    edges; ``split``: its :func:`two_chain_case`, computed here when not given). Its bound
    first, from the report's and up to the incumbent, added to the report as "two chain"
    (binding when it is the largest; ``unpriced`` then names what its relaxation removed);
    then, only while the gap is open, its plan, between the two, which replaces the incumbent
    when better (its seconds count as the incumbent's). The bound's probes descend to the
    relaxation's optimum whatever plan they start from, so a plan found after it would not
    raise it. Returns at once on graphs that are not two chains."""
    t0 = time.perf_counter()
    split = two_chain_case(g, cluster, k) if split is None else split
    if split is None:
        return replace(rep, seconds=rep.seconds + time.perf_counter() - t0), inc
    bound_s = (1 - TWO_CHAIN_PLAN_SHARE) * seconds
    res = two_chain_bound(split, cluster, k, bound_s, inc.objective, rep.value)
    rep = _with_two_chain_bound(rep, res, split, time.perf_counter() - t0)
    if meets_target(inc.objective, rep.value):
        return rep, inc
    t1 = time.perf_counter()
    left = max(0.0, seconds - (t1 - t0))
    found = two_chain_plan(g, split, cluster, k, left, (rep.value, inc.objective))
    t2 = time.perf_counter()
    if found is None or found.value >= inc.objective:
        return rep, Incumbent(inc.objective, inc.assignment, inc.seconds + t2 - t1)
    inc = Incumbent(found.value, found.assignment, inc.seconds + t2 - t1)
    # the descent stopped within SPINE_REL_TOL of the relaxation's optimum: a plan that close
    # may be proven by a probe just below its cost (the tables are built again; the floor
    # probe below the plan's cost leaves the descent room for that probe)
    left = seconds - (t2 - t0)
    floor = inc.objective * (1 - 2 * SPINE_REL_TOL)
    if res.spine is not None and left > 0 and floor <= rep.value:
        res = two_chain_bound(split, cluster, k, left, inc.objective, floor)
        rep = _with_two_chain_bound(rep, res, split, time.perf_counter() - t2)
    return rep, inc


def _with_two_chain_bound(
    rep: BoundReport, res: TwoChainBound, split: TwoChainSplit, seconds: float
) -> BoundReport:
    """``rep`` with the two-chain bound ``res`` and its ``seconds`` (binding when larger)."""
    if res.value <= rep.value:
        return replace(rep, seconds=rep.seconds + seconds)
    bounds = {**rep.bounds, "two chain": res.value}
    unpriced = tuple(removed_scopes(split.graph, res.spine)) if res.spine else ()
    return replace(
        rep,
        value=res.value,
        binding="two chain",
        bounds=bounds,
        seconds=rep.seconds + seconds,
        unpriced=unpriced,
    )


def warm_incumbent(g: Graph, cluster: Cluster, k: int, seconds: float) -> Incumbent | None:
    """The quick heuristics' best plan on k blocks (:func:`quick_assignment`, the exact
    solver's warm start) on a homogeneous cluster; None on one whose devices or links differ
    (there cpsat chooses the devices, and its warm start is placed first)."""
    if not cluster.homogeneous:
        return None
    t0 = time.perf_counter()
    val, a = quick_assignment(g, cluster.with_devices(k), deadline=t0 + seconds)
    return Incumbent(val, a, time.perf_counter() - t0)


def certified_bound(g: Graph, cluster: Cluster, time_limit: float, target: float | None = None):
    """The certified lower bounds of :mod:`solver.pipeline.bounds` (a ``BoundReport``);
    ``target``, the objective of a known plan, stops them as soon as one meets it.

    On a cluster whose devices or links differ:
    :func:`solver.pipeline.bounds.topology.topology_bound` (the bounds on
    ``cluster.relaxation()``, the universal bound, and the group-labelled chains that pay the
    slow link between groups), each valid for every plan on every placement.
    """
    if cluster.homogeneous:
        return certified_lower_bound(g, cluster, time_limit=time_limit, target=target)
    return topology.topology_bound(g, cluster, time_limit)


def bound_stats(rep, binding: str | None = None, value: float | None = None) -> dict:
    """``stats["bound"]`` of a plan: the binding bound's name and value (the certified report's
    own unless a method's proof binds) and every certified bound."""
    return {
        "binding": rep.binding if binding is None else binding,
        "value": rep.value if value is None else value,
        "certified": rep.to_dict(),
    }


@dataclass(frozen=True)
class BindingBound:
    """The bound a plan carries: the binding proof's name and value, the status it claims
    (OPTIMAL: kept only when the value meets the objective) and the rounding resolution of an
    exact model's proof (0: none)."""

    name: str
    value: float
    status: str
    resolution: float


def certify(g: Graph, cluster: Cluster, plan: Plan, rep) -> Plan:
    """``plan`` with the best proven bound: its method's own (an exact method's proof) or the
    certified one, whichever is larger; ``stats["bound"]`` names the binding one. A plan the
    method could not prove becomes OPTIMAL when the certified bound meets its objective: the
    status is decided by the one rule, :func:`solver.core.result.certify` (via make_plan).

    On a cluster whose devices or links differ, a method's own bound is kept only when it
    covers every plan and placement (``stats["bound_scope"]``, the CP-SAT model with
    placement); a plan over some device's capacity is placed again
    (:func:`solver.pipeline.placement.best_placement`) and refused only when no placement fits.
    """
    plan = _on_fitting_devices(g, cluster, plan)
    bound = binding_bound(cluster, plan, rep)
    stats = dict(plan.stats)
    stats.pop("raw_lower_bound", None)
    stats["bound"] = bound_stats(rep, bound.name, bound.value)
    return make_plan(
        g,
        cluster,
        plan.assignment,
        plan.method,
        lower_bound=bound.value,
        status=bound.status,
        wall_seconds=plan.wall_seconds + rep.seconds,
        stats=stats,
        check=False,
        resolution=bound.resolution,
        placement=plan.placement,
    )


def binding_bound(cluster: Cluster, plan: Plan, rep) -> BindingBound:
    """The larger of ``plan``'s own bound (when it covers every plan of ``cluster``) and the
    certified report ``rep``; a cpsat plan that stopped on meeting the certified bound rests
    on that bound's proof."""
    covers = cluster.homogeneous or plan.stats.get("bound_scope") == ALL_PLACEMENTS
    own = plan.lower_bound if covers else None
    met = plan.method == "cpsat" and "stopped" in plan.stats
    resolution = float(plan.stats.get("optimal_within", 0.0))
    if own is not None and own >= rep.value and not met:
        source = plan.stats.get("bound_source", plan.method)
        return BindingBound(source, own, plan.status, resolution)
    # a method's proof within its rounding resolution stays one under a larger bound
    proved = own is not None and plan.status == OPTIMAL
    return BindingBound(rep.binding, rep.value, OPTIMAL, resolution if proved else 0.0)


def _on_fitting_devices(g: Graph, cluster: Cluster, plan: Plan) -> Plan:
    """``plan`` itself, unless the devices of ``cluster`` differ and it breaks some device's
    capacity: then its blocks placed again, refused when no placement fits (or when the plan
    names its devices: manual)."""
    if cluster.homogeneous:
        return plan
    bad = validate(g, cluster, plan.assignment, placement=plan.placement)
    bad = [v for v in bad if v.kind == "capacity"]
    if not bad:
        return plan
    if plan.method == "manual":
        raise MtppError(
            f"{plan.method}'s plan does not fit the devices it names ({bad[0]}); "
            "change the devices in the sharding file"
        )
    placed = place_plan(g, cluster, plan)
    if placed is None:
        raise MtppError(
            f"{plan.method}'s plan fits no placement of its blocks on the devices of "
            f"{cluster.name!r} ({bad[0]}); use more devices or --method cpsat"
        )
    return placed
