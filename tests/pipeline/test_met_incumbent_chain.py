"""When solve's incumbent already meets the certified bound, the exact chain DP settles the
tie-break (least transferred bytes, then latency, among plans of that bottleneck) instead of
CP-SAT's time-boxed search: checked against every plan of small graphs."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from solver.core.cluster import Cluster
from solver.core.cost import evaluate
from solver.core.graph import coarse_view
from solver.frontends.workloads import layered_dag
from solver.pipeline.exact.brute import all_assignments
from solver.pipeline.options import Incumbent, SolveOptions
from solver.pipeline.registry import solve
from solver.pipeline.runners import WARM_START_MET, met_incumbent_chain

CLUSTER = Cluster(name="toy", devices=3, link_bandwidth=2e10)


def every_plan(g, cluster):
    """(objective, transfer, latency, assignment) of every valid plan, by brute force."""
    out = []
    for a in all_assignments(g, cluster.devices):
        ev = evaluate(g, cluster, a)
        out.append((ev.objective, float(ev.bytes_in.sum()), ev.latency, a))
    return out


def least_transfer_at_optimum(plans):
    best = min(p[0] for p in plans)
    ties = [p for p in plans if p[0] <= best * (1 + 1e-9)]
    return best, min(ties, key=lambda p: (p[1], p[2]))


def met_options(objective: float, assignment: np.ndarray, bound: float, **extra) -> SolveOptions:
    inc = Incumbent(objective, assignment, 0.0)
    return SolveOptions(time_limit=30.0, incumbent=inc, certified_bound=bound, extra=extra)


@pytest.mark.parametrize("seed", range(5))
def test_the_dp_tie_break_is_the_least_transfer_then_latency_of_every_optimal_plan(seed):
    g = layered_dag(9, width=2, seed=seed)
    plans = every_plan(g, CLUSTER)
    best, tie = least_transfer_at_optimum(plans)
    worst_optimal = max((p for p in plans if p[0] <= best * (1 + 1e-9)), key=lambda p: p[1])
    opts = met_options(worst_optimal[0], worst_optimal[3], best)
    res = met_incumbent_chain(g, CLUSTER, opts, time.perf_counter() + 30.0)
    assert res is not None and res.optimal
    _, labels = coarse_view(g)
    ev = evaluate(g, CLUSTER, res.assignment[labels])
    assert math.isclose(ev.objective, best, rel_tol=1e-9)
    assert float(ev.bytes_in.sum()) == tie[1]
    assert math.isclose(ev.latency, tie[2], rel_tol=1e-9)


def test_no_dp_when_the_incumbent_does_not_meet_the_bound_or_the_tie_break_is_off():
    g = layered_dag(9, width=2, seed=1)
    best, tie = least_transfer_at_optimum(every_plan(g, CLUSTER))
    deadline = time.perf_counter() + 30.0
    assert met_incumbent_chain(g, CLUSTER, met_options(best, tie[3], best * 0.99), deadline) is None
    off = met_options(best, tie[3], best, tie_break=False)
    assert met_incumbent_chain(g, CLUSTER, off, deadline) is None
    budget = met_options(best, tie[3], best, tie_break_seconds=1.0)  # CP-SAT's, as asked
    assert met_incumbent_chain(g, CLUSTER, budget, deadline) is None
    assert met_incumbent_chain(g, CLUSTER, met_options(best, tie[3], best), deadline) is not None
    past = time.perf_counter() - 1.0  # no time left: CP-SAT's tie-break runs instead
    assert met_incumbent_chain(g, CLUSTER, met_options(best, tie[3], best), past) is None
    assert met_incumbent_chain(g, CLUSTER, SolveOptions(time_limit=30.0), deadline) is None


def test_solve_says_the_warm_start_met_the_bound_and_the_dp_broke_the_tie():
    g = layered_dag(9, width=2, seed=1)  # its warm start meets the certified bound
    best, tie = least_transfer_at_optimum(every_plan(g, CLUSTER))
    plan = solve(g, CLUSTER, "cpsat", SolveOptions(time_limit=30.0))
    assert plan.status == "OPTIMAL" and math.isclose(plan.objective, best, rel_tol=1e-9)
    assert plan.stats["stopped"] == WARM_START_MET and "cpsat_status" not in plan.stats
    assert plan.stats["tie_break"]["summary"].endswith("exact DP)")
    ev = evaluate(g, CLUSTER, plan.assignment)
    assert float(ev.bytes_in.sum()) == tie[1]
    assert math.isclose(ev.latency, tie[2], rel_tol=1e-9)
