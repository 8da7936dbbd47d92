"""Brute force is the oracle; CP-SAT must match it and never claim a bound it cannot keep."""

import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.frontends import load_graph, resolve_cluster
from solver.pipeline.exact.brute import all_assignments, batch_costs, brute_force
from solver.pipeline.exact.cpsat import (
    STOPPED_INCUMBENT,
    STOPPED_WARM,
    CpsatOptions,
    meets_bound,
    solve_cpsat,
)
from solver.pipeline.options import SolveOptions
from solver.pipeline.plan import OPTIMAL
from solver.pipeline.registry import solve
from solver.pipeline.runners import quick_assignment
from tests.conftest import KNOWN_OPTIMA, bench_path, problems, scaled_examples


@settings(max_examples=scaled_examples(120), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6))
def test_brute_force_is_below_every_valid_plan(prob):
    g, c = prob
    best = brute_force(g, c)
    A = all_assignments(g, c.devices)
    f, mem = batch_costs(g, c, A, c.devices)
    fits = np.ones(len(A), bool) if c.capacity is None else np.all(mem <= c.capacity, axis=1)
    if best is None:
        assert not fits.any()
        return
    assert not validate(g, c, best.assignment)
    assert best.objective <= f[fits].max(axis=1).min() + 1e-12
    for row in np.flatnonzero(fits)[:10]:
        assert best.objective <= evaluate(g, c, A[row]).objective + 1e-12


@settings(max_examples=scaled_examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_cpsat_equals_brute_force(prob):
    g, c = prob
    truth = brute_force(g, c)
    _, hint = quick_assignment(g, c)
    try:
        plan = solve_cpsat(g, c, hint, CpsatOptions(time_limit=20, workers=2))
    except MtppError:
        assert truth is None  # a single node or group that cannot fit
        return
    if truth is None:
        assert plan is None
        return
    assert plan is not None
    assert not validate(g, c, plan.assignment)
    # the raw bound (before make_plan reports it as at most the objective) must hold
    assert plan.stats["raw_lower_bound"] <= truth.objective * (1 + 1e-9) + 1e-12
    assert plan.stats["cpsat_lower_bound"] <= truth.objective * (1 + 1e-9) + 1e-12
    assert plan.lower_bound <= plan.objective
    assert plan.status == OPTIMAL
    assert plan.objective == pytest.approx(truth.objective, rel=1e-6, abs=1e-9)


def test_regression_large_coefficients_do_not_fake_optimality():
    """OR-Tools 9.15 proved 8.1259 'optimal' here when coefficients exceeded 2^31
    (google/or-tools#5293); the true optimum is 8.04883515."""
    g = Graph.build(
        [f"v{i}" for i in range(7)],
        [4.44934555, 0.0770879, 2.27501023, 2.45560402, 1.44544954, 2.72727203, 1.32447937],
        [2.0, 0.0, 3.0, 4.0, 3.0, 0.0, 1.0],
        [(0, 6), (1, 2), (1, 3), (1, 5), (4, 5)],
        act=[2.0, 1.0, 1.0, 1.0, 2.0, 2.0, 1.0],
        params=[("p0", 1.0, [5, 6]), ("p1", 3.0, [1, 3, 5])],
    )
    c = Cluster("toy", 2, link_bandwidth=1.0)
    truth = brute_force(g, c)
    _, hint = quick_assignment(g, c)
    plan = solve_cpsat(g, c, hint, CpsatOptions(workers=1))
    assert truth.objective == pytest.approx(8.04883515, rel=1e-8)
    assert plan.objective == pytest.approx(truth.objective, rel=1e-9)
    assert plan.stats["raw_lower_bound"] <= truth.objective


@settings(max_examples=scaled_examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_universal_lower_bound_never_exceeds_the_optimum(prob):
    g, c = prob
    truth = brute_force(g, c)
    if truth is not None:
        assert lower_bound(g, c) <= truth.objective * (1 + 1e-12) + 1e-12


def test_cpsat_infeasible_single_node_named():
    g = Graph.build(["a", "big"], [1, 1], [0, 0], [(0, 1)], params=[("w", 100, [1])])
    c = Cluster("t", 2, capacity=50)
    with pytest.raises(MtppError, match="node 'big' needs 100 bytes"):
        solve(g, c, "cpsat")


def test_cpsat_infeasible_total_memory_returns_none():
    g = Graph.build(
        ["a", "b", "c"],
        [1, 1, 1],
        [0, 0, 0],
        [(0, 1), (1, 2)],
        params=[(f"w{i}", 40, [i]) for i in range(3)],
    )
    assert solve(g, Cluster("t", 2, capacity=50), "cpsat") is None
    assert brute_force(g, Cluster("t", 2, capacity=50)) is None


@pytest.mark.parametrize("key", list(KNOWN_OPTIMA))
def test_cpsat_reproduces_known_optima(key):
    n, k, opt = KNOWN_OPTIMA[key]
    g = load_graph(bench_path(key))
    c = resolve_cluster(g)
    assert (g.n, c.devices) == (n, k)
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=60))
    tol = 1e-4 / opt if "inceptionv3" in key else 1e-6
    assert plan.status == OPTIMAL
    assert plan.objective == pytest.approx(opt, rel=tol)
    assert plan.stats["raw_lower_bound"] <= opt * (1 + tol)
    assert lower_bound(g, c) <= opt


def test_every_cpsat_solver_keeps_the_presolve_guard():
    """solver.core.sat makes every CP-SAT solver of the project (pipeline, tie-break, sharding,
    packing bound): google/or-tools#5293's presolve step off, then the given parameters."""
    import os

    from solver.core.sat import new_solver, search_params

    params = search_params(0, 7, gap=0.01)
    assert params == {
        "num_workers": os.cpu_count() or 1,
        "random_seed": 7,
        "log_search_progress": False,
        "relative_gap_limit": 0.01,
    }
    assert "relative_gap_limit" not in search_params(2, 0)
    p = new_solver(2.5, {**params, "num_workers": 3}).parameters
    assert p.presolve_inclusion_work_limit == 0 and p.max_time_in_seconds == 2.5
    assert (p.num_workers, p.random_seed, p.relative_gap_limit) == (3, 7, 0.01)


# ---------------------------------------------------------------- stopping at the certified bound


def random_dag(seed: int, n: int = 30, heavy: bool = False, io: float = 0.0) -> Graph:
    """A random DAG (a chain plus skips), random work; with ``heavy`` one node has twice the
    rest's work, so the universal bound (that node) is the optimum on 3+ devices."""
    rng = np.random.default_rng(seed)
    work = rng.uniform(0.5, 1.5, n)
    if heavy:
        work[n // 2] = 2 * work.sum()
    edges = [(v - 1, v) for v in range(1, n)]
    edges += [(int(rng.integers(0, v - 1)), v) for v in range(2, n) if rng.random() < 0.3]
    names = [f"n{i}" for i in range(n)]
    return Graph.build(names, work, rng.uniform(0, io, n), sorted(set(edges)))


def test_meets_bound_uses_the_optimality_tolerance():
    assert meets_bound(1.0, 1.0) and meets_bound(1.0 + 0.9e-6, 1.0)
    assert not meets_bound(1.0 + 1.1e-6, 1.0)
    assert not meets_bound(1.0, None) and not meets_bound(1.0, math.inf)


@pytest.mark.parametrize("tie", [True, False])
def test_cpsat_skips_the_search_when_the_warm_start_meets_the_bound(tie):
    g, c = random_dag(3, heavy=True), Cluster("c", 4, link_bandwidth=1.0)
    bound = float(lower_bound(g, c))
    assert bound == pytest.approx(g.work.max())
    _, hint = quick_assignment(g, c)
    t = time.perf_counter()
    plan = solve_cpsat(
        g, c, hint, CpsatOptions(time_limit=30, workers=2, stop_at=bound, tie_break=tie)
    )
    assert time.perf_counter() - t < 5
    assert plan.stats["stopped"] == STOPPED_WARM and plan.stats["cpsat_status"] == "NOT_SOLVED"
    assert plan.objective <= bound * (1 + 1e-6) and not validate(g, c, plan.assignment)
    assert ("transfer_bytes_after" in plan.stats["tie_break"]) == tie
    # without the bound CP-SAT searches (and proves the same optimum itself)
    own = solve_cpsat(g, c, hint, CpsatOptions(time_limit=30, workers=2, tie_break=tie))
    assert "stopped" not in own.stats and own.stats["cpsat_status"] == "OPTIMAL"
    assert own.objective == pytest.approx(plan.objective, rel=1e-9)


def test_cpsat_stops_at_the_first_incumbent_that_meets_the_bound():
    g, c = random_dag(0, io=0.5), Cluster("c", 4, link_bandwidth=1.0)
    _, hint = quick_assignment(g, c)
    best = solve_cpsat(g, c, hint, CpsatOptions(time_limit=30, workers=2, tie_break=False))
    assert best.status == OPTIMAL and "stopped" not in best.stats
    bad = np.zeros(g.n, dtype=np.int64)  # one block: far from the optimum, the search must run
    opts = CpsatOptions(time_limit=30, workers=2, tie_break=False, stop_at=best.objective)
    plan = solve_cpsat(g, c, bad, opts)
    assert plan.stats["stopped"] == STOPPED_INCUMBENT
    assert plan.stats["cpsat_status"] in ("FEASIBLE", "OPTIMAL")
    assert plan.objective <= best.objective * (1 + 1e-6) and not validate(g, c, plan.assignment)
    # a bound just below the optimum (beyond the tolerance) is never met: CP-SAT's own proof
    opts.stop_at = best.objective * (1 - 1e-5)
    plan = solve_cpsat(g, c, bad, opts)
    assert "stopped" not in plan.stats and plan.stats["cpsat_status"] == "OPTIMAL"
    assert plan.objective == pytest.approx(best.objective, rel=1e-9)


def test_cpsat_stops_on_a_placed_incumbent_too():
    """Two hosts (the model also chooses each block's device): the callback reads the placement
    and re-evaluates the plan on it before stopping."""
    from solver.core.cluster import Topology

    topo = Topology(((0, 1), (2, 3)), ("h0", "h1"), ((8.0, 0.0), (8.0, 0.0)), (1.0, 0.0))
    c = Cluster("two", 4, compute=1.0, link_bandwidth=8.0, topology=topo)
    g = random_dag(0, io=0.5)
    best = solve_cpsat(g, c, None, CpsatOptions(time_limit=30, workers=2))
    assert best.stats["cpsat_status"] == "OPTIMAL"
    bad = np.zeros(g.n, dtype=np.int64)
    plan = solve_cpsat(g, c, bad, CpsatOptions(time_limit=30, workers=2, stop_at=best.objective))
    assert plan.stats["stopped"] == STOPPED_INCUMBENT
    ev = evaluate(g, c, plan.assignment, placement=plan.placement)
    assert ev.objective == plan.objective <= best.objective * (1 + 1e-6)


def test_small_graph_with_an_open_gap_is_proven_by_the_ideal_dp_without_search():
    """BERT-3 at k = 8: the cheap bounds stop at 20.6 while the optimum (a block no extra device
    can split) is 27.92; the exact DP over the separator chain proves the warm start optimal,
    so no CP-SAT model is searched, and the plan carries the DP's exact tie-break."""
    key = "OperatorGraphs/bert_l-3_inference"
    g = load_graph(bench_path(key))
    c = resolve_cluster(g, devices=8)
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=60))
    assert plan.status == OPTIMAL
    assert plan.objective == pytest.approx(KNOWN_OPTIMA[key][2], rel=1e-9)
    assert plan.stats["bound"]["binding"] == "ideals"
    assert "no CP-SAT search needed" in plan.stats["proof"]
    assert "exact DP" in plan.stats["tie_break"]["summary"]
    assert plan.lower_bound <= plan.objective


def test_warm_start_meeting_the_cheap_bounds_skips_the_costly_ones():
    """BERT-24 (layers) at k = 8: the work io chain meets the warm start; the packings, whose
    CP-SAT probes took 2 s there, are listed as not needed and never run."""
    g = load_graph(bench_path("LayerGraphs/bert24_inference"))
    c = resolve_cluster(g, devices=8)
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=60))
    cert = plan.stats["bound"]["certified"]
    assert plan.status == OPTIMAL and plan.stats["stopped"].startswith("the warm start met")
    assert cert["binding"] == "work io chain"
    for name in ("decision", "work packing", "weights"):
        assert name not in cert["bounds"] and cert["skipped"][name].startswith("not needed")
    assert plan.objective <= cert["value"] * (1 + 1e-6)
