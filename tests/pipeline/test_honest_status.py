"""Honest numbers and bounded time (issue 10): bounds never above the objective, evaluate
recomputes what it can and labels the rest as claimed, method options are checked, heuristics
refuse plans that break the capacity, and every method stops at its time limit."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

import solver.pipeline.options as solve_options
import solver.pipeline.registry as methods
from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.frontends.workloads import layered_dag
from solver.pipeline.dp.ideals import enumerate_ideals
from solver.pipeline.exact.brute import brute_force
from solver.pipeline.exact.cpsat import CpsatOptions, solve_cpsat
from solver.pipeline.heuristics.brkga import BrkgaOptions, brkga
from solver.pipeline.heuristics.slicing import SliceTimeout, slice_order, slice_table_bytes
from solver.pipeline.options import SolveOptions, estimate_bytes
from solver.pipeline.plan import FEASIBLE, INVALID, OPTIMAL, InvalidBoundError, make_plan
from solver.pipeline.registry import solve
from solver.pipeline.runners import quick_assignment
from tests.badinput import assert_refused
from tests.cli_runner import run

# a chain a -> b -> c, work 1 each, 0.1 s of io per crossing: the optimum on 2 devices is
# {a, b} | {c} = 2.1 s, while the universal bound is only 1.5 s (= total work / 2)
CHAIN = {
    "format": "mtpp-graph",
    "version": 1,
    "name": "chain",
    "cluster": {"devices": 2, "link_bandwidth": "1B/s"},
    "nodes": [{"name": x, "work": 1.0, "sizeout": 0.1} for x in "abc"],
    "edges": [["a", "b"], ["b", "c"]],
}
# parameters of 10 bytes per node, capacity 25 bytes: {a, b} | {c, d} fits, but the
# time-balanced split {a} | {b, c, d} (a has most of the work) needs 30 bytes on device 1
TIGHT = {
    "format": "mtpp-graph",
    "version": 1,
    "name": "tight",
    "cluster": {"devices": 2, "link_bandwidth": "1B/s", "capacity": "25B"},
    "nodes": [
        {"name": x, "work": w, "sizeout": 0} for x, w in zip("abcd", [10.0, 1, 1, 1], strict=True)
    ],
    "edges": [["a", "b"], ["b", "c"], ["c", "d"]],
    "params": [{"name": f"w{x}", "bytes": 10, "users": [x]} for x in "abcd"],
}


def write(tmp_path, name, data) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


def chain_graph() -> tuple[Graph, Cluster]:
    g = Graph.build(["a", "b", "c"], [1.0, 1.0, 1.0], [0.1, 0.1, 0.1], [(0, 1), (1, 2)])
    return g, Cluster("c", 2, link_bandwidth=1.0)


# ---------------------------------------------------------------- make_plan and raw bounds


def test_bound_above_objective_is_a_bug_not_clipped():
    g, c = chain_graph()
    a = np.array([0, 0, 1])
    assert evaluate(g, c, a).objective == pytest.approx(2.1)
    with pytest.raises(InvalidBoundError, match="above its plan's re-evaluated objective"):
        make_plan(g, c, a, "test", lower_bound=2.2, status=OPTIMAL)
    with pytest.raises(InvalidBoundError):
        make_plan(g, c, a, "test", lower_bound=math.nan, status=OPTIMAL)


def test_bound_within_rounding_is_reported_as_the_objective_and_kept_raw():
    g, c = chain_graph()
    a = np.array([0, 0, 1])
    obj = evaluate(g, c, a).objective
    raw = obj * (1 + 1e-12)
    plan = make_plan(g, c, a, "test", lower_bound=raw, status=OPTIMAL)
    assert plan.status == OPTIMAL and plan.lower_bound == obj
    assert plan.stats["raw_lower_bound"] == raw


def test_optimal_needs_the_bound_within_tolerance():
    g, c = chain_graph()
    plan = make_plan(g, c, [0, 0, 1], "test", lower_bound=2.0, status=OPTIMAL)
    assert plan.status == FEASIBLE and plan.gap == pytest.approx(0.1 / 2.1)


def test_cpsat_keeps_its_raw_bound_and_scale():
    g, c = chain_graph()
    _, hint = quick_assignment(g, c)
    plan = solve_cpsat(g, c, hint, CpsatOptions(workers=1))
    truth = brute_force(g, c)
    s = plan.stats
    assert plan.status == OPTIMAL and truth.objective == pytest.approx(2.1)
    # the raw bound: the integer bound CP-SAT proved divided by the scale, never above the
    # true optimum, and within the 1e-6 tolerance of it (that is what OPTIMAL means)
    assert s["cpsat_lower_bound"] == s["cpsat_bound_int"] / s["scale"]
    assert s["raw_lower_bound"] == max(lower_bound(g, c), s["cpsat_lower_bound"])
    assert s["raw_lower_bound"] <= truth.objective
    assert s["raw_lower_bound"] >= truth.objective * (1 - 1e-6)


def test_rounding_never_hides_a_cpsat_proof():
    """A 10,000 s tensor caps the integer scale at 2^30 / 1e4, so rounding leaves a gap above
    1e-6 that CP-SAT's proof covers: OPTIMAL within the stated resolution, as brute force
    confirms; without the proof (or past 0.1% of the objective) the status stays FEASIBLE."""
    rng = np.random.default_rng(1)
    size = [1e-3] * 8
    size[6] = 1e4
    edges = [(i, i + 1) for i in range(5)] + [(6, 7)]
    g = Graph.build([f"v{i}" for i in range(8)], rng.random(8) * 2 + 0.5, size, edges)
    c = Cluster("c", 2, link_bandwidth=1.0)
    _, hint = quick_assignment(g, c)
    plan = solve_cpsat(g, c, hint, CpsatOptions(workers=1))
    truth = brute_force(g, c)
    assert plan.stats["scale"] == pytest.approx(2**30 / 1e4)
    assert plan.gap > 1e-6  # the rounding gap the proof has to explain
    assert plan.status == OPTIMAL and plan.objective == pytest.approx(truth.objective, rel=1e-12)
    res = plan.stats["optimal_within"]
    assert plan.objective - plan.lower_bound <= res <= 1e-3 * plan.objective
    assert plan.to_dict()["optimal_within"] == res
    a, lb = plan.assignment, plan.lower_bound
    assert make_plan(g, c, a, "x", lower_bound=lb, status=OPTIMAL).status == FEASIBLE
    big = 2e-3 * plan.objective  # a resolution too coarse to prove anything
    assert make_plan(g, c, a, "x", lower_bound=lb, status=OPTIMAL, resolution=big).status == (
        FEASIBLE
    )
    # a larger certified bound (still below the objective) must not undo that proof: the plan
    # keeps OPTIMAL within the same resolution, with the certified bound as the binding one
    from solver.pipeline.bounds import BoundReport

    mid = (plan.objective + plan.lower_bound) / 2
    out = methods.certify(g, c, plan, BoundReport(mid, "chain io", {"chain io": mid}, 0.0))
    assert out.status == OPTIMAL and out.lower_bound == mid
    assert out.stats["optimal_within"] == res and out.stats["bound"]["binding"] == "chain io"
    # ... while a plan its method did not prove is OPTIMAL only if the bound meets it (1e-6)
    unproven = make_plan(g, c, a, "x", lower_bound=lb, status=FEASIBLE)
    out = methods.certify(g, c, unproven, BoundReport(mid, "chain io", {"chain io": mid}, 0.0))
    assert out.status == FEASIBLE and "optimal_within" not in out.stats


def test_evaluate_accepts_optimal_within_the_resolution(tmp_path, capsys):
    rng = np.random.default_rng(1)
    work = rng.random(8) * 2 + 0.5
    graph = {
        "format": "mtpp-graph",
        "version": 1,
        "name": "coarse-scale",
        "cluster": {"devices": 2, "link_bandwidth": "1B/s"},
        "nodes": [
            {"name": f"v{i}", "work": float(w), "sizeout": 1e4 if i == 6 else 1e-3}
            for i, w in enumerate(work)
        ],
        "edges": [[f"v{i}", f"v{i + 1}"] for i in range(5)] + [["v6", "v7"]],
    }
    path = write(tmp_path, "g.json", graph)
    plan = tmp_path / "plan.json"
    code, out, _ = run(capsys, "solve", path, "--out", plan, "--json")
    s = json.loads(out)
    assert code == 0 and s["status"] == OPTIMAL and s["gap"] > 1e-6 and s["optimal_within"]
    code, out, _ = run(capsys, "evaluate", path, plan, "--json")
    e = json.loads(out)
    assert code == 0 and e["status"] == OPTIMAL and e["claim"] == "consistent"
    assert e["claimed_optimal_within"] == s["optimal_within"]
    code, out, _ = run(capsys, "solve", path)
    assert "within the rounding resolution" in out


# ---------------------------------------------------------------- evaluate: recomputed vs claimed


@pytest.fixture
def universal_only(monkeypatch):
    """The certified bounds replaced by the universal bound alone: on CHAIN it does not prove
    the optimum (1.5 < 2.1), so the tests below see plans whose status rests on a claim."""
    import solver.pipeline.registry
    from solver.core.cost import lower_bound
    from solver.pipeline.bounds import BoundReport

    def universal(g, cluster, time_limit, target=None):
        v = float(lower_bound(g, cluster))
        return BoundReport(v, "universal", {"universal": v}, 0.0)

    class UniversalSearch:  # cpsat's bounds, which pause for the two chains
        def __init__(self, g, cluster, *args, **kwargs):
            self.rep = universal(g, cluster, 0.0)

        def run(self, until=None):
            return self.rep

        def quick_pair_block(self, seconds, target):
            return self.rep

        def resume(self, rep, target):
            return rep

    monkeypatch.setattr(solver.pipeline.registry, "certified_bound", universal)
    monkeypatch.setattr(solver.pipeline.registry, "BoundSearch", UniversalSearch)


def test_evaluate_recomputes_the_certified_bound(tmp_path, capsys):
    """Without a claim to lean on, evaluate proves CHAIN's optimum itself: the certified bound
    (a forced chain of three unit operators on two devices, plus the cut's io) meets 2.1."""
    graph = write(tmp_path, "chain.json", CHAIN)
    plan = tmp_path / "plan.json"
    run(capsys, "solve", graph, "-m", "time", "--out", plan, "-q")
    d = json.loads(plan.read_text())
    d.pop("status"), d.pop("lower_bound")
    plan.write_text(json.dumps(d))
    code, out, _ = run(capsys, "evaluate", graph, plan, "--json")
    e = json.loads(out)
    assert code == 0 and e["status"] == OPTIMAL and e["status_source"] == "recomputed"
    assert e["lower_bound"] == pytest.approx(2.1) and e["stats"]["bound"]["binding"] != "universal"


@pytest.mark.parametrize("method, status", [("cpsat", OPTIMAL), ("slicegraph", FEASIBLE)])
def test_solve_and_evaluate_agree(method, status, tmp_path, capsys, universal_only):
    graph = write(tmp_path, "chain.json", CHAIN)
    plan = tmp_path / "plan.json"
    code, out, _ = run(capsys, "solve", graph, "-m", method, "--out", plan, "--json")
    s = json.loads(out)
    assert code == 0 and s["status"] == status
    code, out, _ = run(capsys, "evaluate", graph, plan, "--json")
    e = json.loads(out)
    assert code == 0 and e["status"] == s["status"] and e["objective"] == s["objective"]
    assert e["objective"] == pytest.approx(2.1)
    assert e["lower_bound"] == pytest.approx(1.5)  # recomputed: the universal bound
    assert e["claimed_lower_bound"] == s["lower_bound"] and e["claim"] == "consistent"
    assert e["status_source"] == ("claimed" if status == OPTIMAL else "recomputed")


def test_a_claimed_bound_of_1e9_is_an_invalid_claim(tmp_path, capsys, universal_only):
    graph = write(tmp_path, "chain.json", CHAIN)
    plan = tmp_path / "plan.json"
    run(capsys, "solve", graph, "--out", plan, "-q")
    d = json.loads(plan.read_text())
    d["lower_bound"] = 1e9
    plan.write_text(json.dumps(d))
    code, out, _ = run(capsys, "evaluate", graph, plan, "--json")
    e = json.loads(out)
    assert code == 1 and e["valid"]
    assert e["status"] == FEASIBLE and e["status_source"] == "recomputed"
    assert e["claimed_lower_bound"] == 1e9 and e["claimed_status"] == OPTIMAL
    assert e["claim"].startswith("invalid: the lower bound 1000000000 exceeds the objective")
    assert e["lower_bound"] == pytest.approx(1.5) and e["gap"] == pytest.approx(0.6 / 2.1)
    code, out, _ = run(capsys, "evaluate", graph, plan)
    assert code == 1 and "invalid: the lower bound" in out and "FEASIBLE" in out


@pytest.mark.parametrize(
    "edit, why",
    [
        ({"lower_bound": 2.0}, "OPTIMAL without a lower bound within 1e-6"),
        ({"lower_bound": "x"}, "is not a finite number"),
        ({"objective": 1.0}, "differs from the recomputed one"),
    ],
)
def test_claims_that_do_not_check_out(edit, why, tmp_path, capsys, universal_only):
    graph = write(tmp_path, "chain.json", CHAIN)
    plan = tmp_path / "plan.json"
    run(capsys, "solve", graph, "--out", plan, "-q")
    d = json.loads(plan.read_text())
    d.update(edit)
    plan.write_text(json.dumps(d))
    code, out, _ = run(capsys, "evaluate", graph, plan, "--json")
    e = json.loads(out)
    assert code == 1 and e["status"] == FEASIBLE and why in e["claim"]


def test_claim_for_another_cluster_is_not_used(tmp_path, capsys):
    graph = write(tmp_path, "chain.json", CHAIN)
    plan = tmp_path / "plan.json"
    run(capsys, "solve", graph, "--out", plan, "-q")
    code, out, _ = run(capsys, "evaluate", graph, plan, "--devices", "3", "--json")
    e = json.loads(out)
    assert code == 0 and e["status"] == FEASIBLE and e["claim"].startswith("not applicable")


def test_evaluate_invalid_plan_status_constant(tmp_path, capsys):
    graph = write(tmp_path, "chain.json", CHAIN)
    plan = tmp_path / "plan.json"
    run(capsys, "solve", graph, "--out", plan, "-q")
    d = json.loads(plan.read_text())
    d["assignment"] = {"a": 1, "b": 0, "c": 1}
    plan.write_text(json.dumps(d))
    code, out, _ = run(capsys, "evaluate", graph, plan, "--json")
    e = json.loads(out)
    assert code == 1 and e["status"] == INVALID and e["status_source"] == "recomputed"


# ---------------------------------------------------------------- heuristics and the capacity


def test_heuristic_plan_over_capacity_is_refused_with_the_reason(tmp_path, capsys):
    graph = write(tmp_path, "tight.json", TIGHT)
    line = assert_refused(
        capsys, ["solve", graph, "-m", "time"], r"time found no plan .* capacity", watch=tmp_path
    )
    assert "block 1 needs 30 bytes" in line and "--devices" in line
    code, out, _ = run(capsys, "solve", graph, "-m", "cpsat", "--json")
    assert code == 0 and json.loads(out)["objective"] == pytest.approx(11.0)  # {a, b} | {c, d}


# ---------------------------------------------------------------- option checking


@pytest.mark.parametrize(
    "argv, match",
    [
        (
            ["-m", "slicegraph", "--set", "x=1"],
            "unknown option 'x' for slicegraph; valid: population, generations, elite, "
            "mutants, bias$",
        ),
        (["-m", "slicegraph", "--set", "population=abc"], "'population' .* integer in 2..100000"),
        (["-m", "slicegraph", "--set", "population=1.5"], "'population' .* got 1.5"),
        (["-m", "slicegraph", "--set", "bias=NaN"], "'bias' for slicegraph must be a number"),
        (["-m", "slicegraph", "--set", "elite=true"], "'elite' .* got True"),
        (["-m", "idealdp", "--set", "max_ideals=-3"], "'max_ideals' for idealdp"),
        (["-m", "time", "--set", "population=3"], "for time; it takes no options"),
        (["-m", "poprt", "--set", "optimal_perf=1"], "'optimal_perf' .* true or false"),
        (["--set", 'cpsat_params={"nope": 1}'], "'nope' is not a CP-SAT parameter"),
        (["--set", 'cpsat_params={"num_workers": 2}'], "cannot be set here; use --workers"),
        (["--set", 'cpsat_params={"max_presolve_iterations": "x"}'], "not a valid value"),
        (["--set", 'cpsat_params={"log_search_progress": true}'], "would mix with mtpp"),
        (["-m", "slicegraph", "--optimal-perf"], "--optimal-perf applies to --method poprt"),
        (["--seed", "-1"], "--seed must be an integer in 0..2147483647, got -1"),
        (["--time-limit", "nan"], "--time-limit must be a finite number > 0"),
        (["--time-limit", "inf"], "--time-limit must be a finite number > 0"),
        (["--gap", "inf"], r"--gap must be a finite number in \[0, 1\)"),
        (["--gap", "1"], r"--gap must be a finite number in \[0, 1\), got 1.0"),
        (["--gap", "-0.1"], r"--gap must be"),
    ],
)
def test_bad_options_refused(argv, match, tmp_path, capsys):
    graph = write(tmp_path, "chain.json", CHAIN)
    assert_refused(capsys, ["solve", graph, *argv, "--out", tmp_path / "p.json"], match, tmp_path)


def test_options_are_checked_in_the_library_too():
    g, c = chain_graph()
    with pytest.raises(MtppError, match="unknown option 'optimal_perf' for slicegraph"):
        solve(g, c, "slicegraph", SolveOptions(extra={"optimal_perf": True}))
    plan = solve(g, c, "slicegraph", SolveOptions(extra={"population": 4, "elite": 1}))
    assert plan.objective == pytest.approx(2.1)


# ---------------------------------------------------------------- k larger than n, memory


def test_more_devices_than_nodes(tmp_path, capsys):
    graph = write(tmp_path, "chain.json", CHAIN)
    for method in ("cpsat", "slicegraph", "idealdp", "brute", "time", "poprt"):
        code, out, _ = run(capsys, "solve", graph, "-m", method, "-k", "40", "--json")
        d = json.loads(out)
        assert code == 0 and d["devices"] == 40 and len(d["blocks"]) == 40, method
        assert sum(b["nodes"] > 0 for b in d["blocks"]) <= 3
        assert d["objective"] >= 1.2 - 1e-9  # b alone: 1 + 0.1 in + 0.1 out
    code, out, _ = run(capsys, "solve", graph, "-k", "40", "--json")
    d = json.loads(out)
    assert d["status"] == OPTIMAL and d["objective"] == pytest.approx(1.2)
    assert d["stats"]["solved_blocks"] == 3
    code, out, _ = run(capsys, "solve", graph, "-k", "40")
    assert code == 0 and "3..39" in out and len(out.splitlines()) < 20  # one line, not 37


def test_memory_estimate_refuses_before_allocating(monkeypatch):
    g = layered_dag(400)
    cg, _ = coarse_view(g)
    c = Cluster("c", 400, link_bandwidth=1e9)
    assert estimate_bytes("slicegraph", cg, 400, {}) == slice_table_bytes(400, 400) + 24 * 20 * 400
    assert slice_table_bytes(100_000, 100_000) == 16 * 100_001 * 100_001
    monkeypatch.setattr(solve_options, "memory_budget", lambda: 10**6)
    with pytest.raises(MtppError, match=r"slicegraph on 400 nodes and 400 blocks would need"):
        solve(g, c, "slicegraph")
    plan = solve(g, c, "time")  # linear in n: still runs
    assert plan.k == 400 and not validate(g, c, plan.assignment)


def test_idealdp_refuses_at_once_when_n_exceeds_the_cap():
    g = layered_dag(50)
    with pytest.raises(MtppError, match="more than 20 ideals"):
        enumerate_ideals(g, 20)


# ---------------------------------------------------------------- bounded time


def test_single_block_is_solved_without_a_search():
    g = layered_dag(3000)
    c = Cluster("c", 1, link_bandwidth=1e9)
    for method in ("cpsat", "slicegraph", "idealdp", "poprt"):
        plan = solve(g, c, method)
        assert plan.status == OPTIMAL and plan.lower_bound == plan.objective
        assert plan.objective == pytest.approx(float(g.work.sum()))
    val, a = slice_order(g, c, g.topo_order)
    assert val == pytest.approx(float(g.work.sum())) and not a.any()


def test_single_block_over_capacity_has_no_plan():
    g, _ = chain_graph()
    g = Graph.build(["a", "b"], [1, 1], [0, 0], [(0, 1)], params=[("w", 10, [0, 1])])
    assert solve(g, Cluster("c", 1, capacity=5), "slicegraph") is None


def test_slicing_stops_at_its_deadline():
    g = layered_dag(2000)
    c = Cluster("c", 2, link_bandwidth=1e9)
    with pytest.raises(SliceTimeout, match="after 256 of 2,000 nodes"):
        slice_order(g, c, g.topo_order, deadline=time.perf_counter() - 1)
    val, a = slice_order(g, c, g.topo_order)  # no deadline: the full DP
    assert a is not None and val == pytest.approx(evaluate(g, c, a).objective)


def test_brkga_returns_its_best_at_the_limit():
    g = layered_dag(2000)
    c = Cluster("c", 2, link_bandwidth=1e9)
    val, a, stats = brkga(g, c, BrkgaOptions(time_limit=0.0), seeds=[g.topo_order])
    assert a is None and stats["time_limit_reached"] and stats["generations"] == 0
    plan = solve(g, c, "slicegraph", SolveOptions(time_limit=1e-6))
    assert "time-balanced split" in plan.stats["fallback"]
    assert not validate(g, c, plan.assignment)


def test_cpsat_returns_the_warm_start_when_the_build_runs_out_of_time():
    g, c = chain_graph()
    _, hint = quick_assignment(g, c)
    plan = solve_cpsat(g, c, hint, CpsatOptions(time_limit=1e-9))
    assert plan.status == FEASIBLE and plan.stats["cpsat_status"] == "NOT_SOLVED"
    assert plan.assignment.tolist() == hint.tolist()
    assert plan.lower_bound == pytest.approx(lower_bound(g, c))


# ------------------------------------------------------------ cpsat stops at the certified bound


def heavy_dag(seed: int, n: int = 30, heavy: bool = True) -> Graph:
    """A random DAG (chain plus skips) with random work and io; with ``heavy`` one node has
    twice the others' work and no io, so the certified bound (that node) is the optimum."""
    rng = np.random.default_rng(seed)
    work = rng.uniform(0.5, 1.5, n)
    size = rng.uniform(0, 0.5, n)
    if heavy:
        work[n // 2], size[:] = 2 * work.sum(), 0.0
    edges = [(v - 1, v) for v in range(1, n)]
    edges += [(int(rng.integers(0, v - 1)), v) for v in range(2, n) if rng.random() < 0.3]
    return Graph.build([f"n{i}" for i in range(n)], work, size, sorted(set(edges)))


def two_hosts() -> Cluster:
    from solver.core.cluster import Topology

    topo = Topology(((0, 1), (2, 3)), ("h0", "h1"), ((8.0, 0.0), (8.0, 0.0)), (1.0, 0.0))
    return Cluster("two", 4, compute=1.0, link_bandwidth=8.0, topology=topo)


@pytest.mark.parametrize("cluster", [Cluster("c", 4, link_bandwidth=1.0), two_hosts()])
def test_cpsat_stops_when_its_plan_meets_the_certified_bound(cluster):
    g = heavy_dag(3)
    t = time.perf_counter()
    plan = solve(g, cluster, "cpsat", SolveOptions(time_limit=30, workers=2))
    assert time.perf_counter() - t < 5  # far less than its time limit
    assert plan.status == OPTIMAL and plan.gap <= 1e-6
    assert plan.objective == pytest.approx(g.work.max(), rel=1e-9)
    assert plan.stats["stopped"].endswith("met the certified bound: no search")
    bound = plan.stats["bound"]
    assert bound["binding"] == bound["certified"]["binding"] != "cpsat"  # the proof, named
    assert bound["value"] == bound["certified"]["value"] == plan.lower_bound


def test_cpsat_searches_when_the_certified_bound_is_not_tight(universal_only):
    g, c = heavy_dag(0, heavy=False), Cluster("c", 4, link_bandwidth=1.0)
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=30, workers=2))
    assert plan.stats["bound"]["certified"]["value"] < 0.9 * plan.objective  # not tight
    assert "stopped" not in plan.stats and plan.stats["cpsat_status"] == "OPTIMAL"
    assert plan.status == OPTIMAL and plan.stats["bound"]["binding"] == "cpsat"
