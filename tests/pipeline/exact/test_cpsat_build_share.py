"""The CP-SAT build's share of the time limit: with a warm-start plan at hand a build that
would leave no time to search is given up (the warm plan comes back, FEASIBLE, saying so);
without one the build may take most of the limit (CP-SAT is then the only way to a plan)."""

import numpy as np

from solver.core.cluster import load_cluster
from solver.core.cost import evaluate
from solver.frontends.workloads import layered_dag
from solver.pipeline.exact import cpsat
from solver.pipeline.exact.cpsat import CpsatOptions, solve_cpsat
from solver.pipeline.plan import FEASIBLE
from solver.pipeline.runners import quick_assignment


def small_case():
    g = layered_dag(24, seed=3)
    cluster = load_cluster(None, devices=3)
    _, hint = quick_assignment(g, cluster)
    return g, cluster, hint


def test_a_build_past_its_share_returns_the_warm_plan(monkeypatch):
    g, cluster, hint = small_case()
    monkeypatch.setattr(cpsat, "HINTED_BUILD_SHARE", 0.0)  # every build is past its share
    plan = solve_cpsat(g, cluster, hint, CpsatOptions(time_limit=5.0, workers=1))
    assert np.array_equal(plan.assignment, hint)
    assert plan.status == FEASIBLE
    assert plan.stats["cpsat_status"] == "NOT_SOLVED"
    assert plan.stats["note"] == (
        "building the CP-SAT model took more than 0% of the time limit, which leaves no "
        "time to search: warm-start plan"
    )
    assert plan.objective == evaluate(g, cluster, hint).objective


def test_without_a_warm_plan_the_build_keeps_most_of_the_limit(monkeypatch):
    g, cluster, hint = small_case()
    monkeypatch.setattr(cpsat, "HINTED_BUILD_SHARE", 0.0)
    plan = solve_cpsat(g, cluster, None, CpsatOptions(time_limit=5.0, workers=1))
    assert plan.stats["cpsat_status"] in ("OPTIMAL", "FEASIBLE")
    assert "note" not in plan.stats
    assert plan.objective <= evaluate(g, cluster, hint).objective * (1 + 1e-9)
