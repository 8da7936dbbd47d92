"""Plan-then-place: a method run on k blocks, and on a cluster whose devices or links differ,
its blocks planned on flat views or on each group of equal devices alone, then placed on the
real devices (:func:`solver.pipeline.placement.best_placement`).

Every placed plan is re-evaluated on the real cluster and carries that cluster's universal
bound, never the bound of the view it was planned on."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.pipeline.options import SolveOptions
from solver.pipeline.placement import (
    best_placement,
    full_placement,
    group_clusters,
    planning_cluster,
)
from solver.pipeline.plan import FEASIBLE, Plan, make_plan

PLACING_METHODS = ("manual", "cpsat", "brute")  # they choose (or are given) the devices


def run_method(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions, method: str):
    """``fn`` on k blocks: placed after planning on a cluster whose devices or links differ
    (heuristics), on every device (manual, which names them; cpsat and brute on such a
    cluster, which choose them), else on k blocks widened to every device."""
    if not cluster.homogeneous and method not in PLACING_METHODS:
        return _plan_then_place(fn, g, cluster, k, opts, method)
    if method == "manual" or k == cluster.devices or not cluster.homogeneous:
        return fn(g, cluster, opts)
    plan = fn(g, cluster.with_devices(k), opts)
    return None if plan is None else widen(plan, g, cluster)


def _run_blocks(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions) -> Plan | None:
    """Run ``fn`` on a homogeneous ``cluster`` with k blocks (widened to every device)."""
    if k == cluster.devices:
        return fn(g, cluster, opts)
    plan = fn(g, cluster.with_devices(k), opts)
    return None if plan is None else widen(plan, g, cluster)


def _plan_then_place(
    fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions, method: str
) -> Plan | None:
    """A heuristic on a cluster whose devices or links differ: with two or more groups, also
    planned on each distinct group alone (:func:`_plan_on_group`); the better plan wins."""
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
    gets a block, else :func:`flat_then_place`."""
    aware = getattr(fn, "on_devices", None)
    if aware is not None and k == cluster.devices:
        return aware(g, cluster, opts)
    return flat_then_place(fn, g, cluster, k, opts)


def _plan_on_group(
    fn, g: Graph, cluster: Cluster, grp, opts: SolveOptions, method: str
) -> Plan | None:
    """``fn``'s plan on one group alone (``grp``: a :class:`solver.pipeline.placement.GroupCluster`,
    k = its devices, or the coarse nodes when fewer), its blocks on that group's devices,
    re-evaluated on ``cluster`` (FEASIBLE, the universal bound of ``cluster``)."""
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


def flat_then_place(fn, g: Graph, cluster: Cluster, k: int, opts: SolveOptions) -> Plan | None:
    """A heuristic on a cluster whose devices or links differ: its blocks are found on the
    flat planning view (the smallest device's memory, so that every block fits any device;
    again with the largest when that finds none or its blocks cannot be placed), then
    :func:`solver.pipeline.placement.best_placement` chooses each block's device on the real
    cluster.
    The plan carries the universal bound of the real cluster, never the flat view's."""
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


def widen(plan: Plan, g: Graph, cluster: Cluster) -> Plan:
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
