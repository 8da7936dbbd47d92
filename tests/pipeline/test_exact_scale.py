"""The exact solver at scale (issue 11): domain narrowing that keeps every plan no worse than
the hint, memory-aware cuts, and the tie-break among plans with the same bottleneck."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.pipeline.exact.brute import all_assignments, brute_force
from solver.pipeline.exact.cpsat import CpsatOptions, _Model, solve_cpsat
from solver.pipeline.exact.tiebreak import (
    TIE_BREAK_MAIN_SHARE,
    TIE_BREAK_MIN_SECONDS,
    TIE_BREAK_SHARE,
    tie_break,
    tie_break_budget,
)
from solver.pipeline.options import SolveOptions
from solver.pipeline.plan import OPTIMAL
from solver.pipeline.registry import solve
from solver.pipeline.runners import quick_assignment
from tests.badinput import assert_refused
from tests.conftest import problems, scaled_examples


def _valid_plans(g: Graph, c: Cluster) -> list[np.ndarray]:
    return [a for a in all_assignments(g, c.devices) if not validate(g, c, a)]


def _layered(n_layers: int = 6, seed: int = 0) -> tuple[Graph, Cluster]:
    """A decoder-like chain: per layer a heavy weight op with a small output, then a light op
    with a wide output (cutting after it costs more), random costs; weights overflow SRAM."""
    rng = np.random.default_rng(seed)
    names, work, size, edges, params = [], [], [], [], []
    for i in range(2 * n_layers):
        names.append(f"n{i}")
        heavy = i % 2 == 0
        work.append(float(rng.uniform(1.0, 2.0) if heavy else rng.uniform(0.1, 0.3)))
        size.append(1.0 if heavy else 4.0)
        if i:
            edges.append((i - 1, i))
        if heavy:
            params.append((f"w{i}", float(rng.uniform(5.0, 9.0)), [i]))
    g = Graph.build(names, work, size, edges, params=params, name="layered")
    return g, Cluster("toy", 3, fast_memory=12.0, link_bandwidth=2.0, slow_memory_bandwidth=8.0)


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6))
def test_narrowed_domains_keep_every_plan_no_worse_than_the_hint(prob):
    """The proof of _blocks_needed, checked: every plan whose integer cost is at most the
    hint's keeps each node inside its narrowed window [lo, hi]."""
    g, c = prob
    cg, labels = coarse_view(g)
    if c.devices < 2 or cg.n < 2:
        return
    _, hint = quick_assignment(g, c)
    if hint is None:
        return
    ch = np.empty(cg.n, dtype=np.int64)
    ch[labels] = hint
    ch = np.searchsorted(np.unique(ch), ch)
    model = _Model(cg, c, ch)
    assert np.all(model.lo <= ch) and np.all(ch <= model.hi)
    for a in all_assignments(cg, c.devices):
        if validate(cg, c, a) or model.block_costs_int(a).max() > model.ub_int:
            continue
        assert np.all(model.lo <= a) and np.all(a <= model.hi), a


def test_memory_mass_narrows_the_windows(monkeypatch):
    """With weights that overflow, the charged parameter costs cut the windows below what
    work alone allows (a smaller model), and CP-SAT still equals brute force."""
    g, c = _layered()
    truth = brute_force(g, c)
    _, hint = quick_assignment(g, c)
    ch = np.searchsorted(np.unique(hint), hint)
    model = _Model(g, c, ch)
    assert model.mf is not None
    with monkeypatch.context() as mp:  # the same model with the work-only argument
        mp.setattr(_Model, "_masses", lambda self: (0 * self.w_int, 0 * self.w_int, None))
        work_only = _Model(g, c, ch)
    assert np.all(work_only.lo <= model.lo) and np.all(model.hi <= work_only.hi)
    assert (model.hi - model.lo).sum() < (work_only.hi - work_only.lo).sum()
    plan = solve_cpsat(g, c, hint, CpsatOptions(time_limit=20, workers=1))
    assert plan.status == OPTIMAL
    assert plan.objective == pytest.approx(truth.objective, rel=1e-9)


def _two_cut_graph() -> tuple[Graph, Cluster]:
    """a -> b -> c -> d on 3 devices; d alone is the bottleneck (10 + 1) in every optimal plan,
    and a, b, c may be split anywhere: cutting after a sends 8 bytes, after b or c 1 byte."""
    g = Graph.build(
        ["a", "b", "c", "d"],
        [1.0, 1.0, 1.0, 10.0],
        [8.0, 1.0, 1.0, 0.0],
        [(0, 1), (1, 2), (2, 3)],
        name="two-cuts",
    )
    return g, Cluster("toy", 3, link_bandwidth=1.0)


def test_tie_break_returns_the_smaller_cut():
    g, c = _two_cut_graph()
    plans = _valid_plans(g, c)
    evs = [evaluate(g, c, a) for a in plans]
    best = min(e.objective for e in evs)
    cuts = sorted({float(e.bytes_in.sum()) for e in evs if e.objective == best})
    assert best == 11.0 and cuts[0] == 1.0 and cuts[-1] > 1.0  # two optimal cut sizes
    big_cut = np.array([0, 1, 1, 2])  # optimal, sends 8 + 1 bytes
    assert evaluate(g, c, big_cut).objective == best
    plan = solve_cpsat(g, c, big_cut, CpsatOptions(time_limit=10, workers=1))
    assert plan.status == OPTIMAL and plan.objective == best
    assert float(plan.evaluation.bytes_in.sum()) == cuts[0]
    tb = plan.stats["tie_break"]
    assert tb["transfer_bytes_after"] == cuts[0]
    assert tb["transfer_bytes_after"] <= tb["transfer_bytes_before"]
    assert "tie-break" in tb["summary"]


def test_tie_break_stage_moves_an_optimal_big_cut_to_the_smallest():
    """The tie-break itself, from a first-stage plan that cuts after a (8 + 1 bytes)."""
    g, c = _two_cut_graph()
    big_cut = np.array([0, 1, 1, 2])
    model = _Model(g, c, big_cut)
    labels = np.arange(g.n)
    a, stats = tie_break(model, g, labels, c, big_cut, 5.0, {"num_workers": 1})
    ev = evaluate(g, c, a)
    assert ev.objective == 11.0
    assert stats["transfer_bytes_before"] == 9.0
    assert float(ev.bytes_in.sum()) == stats["transfer_bytes_after"] == 1.0
    assert stats["stages"] == ["transfer OPTIMAL", "latency OPTIMAL"]
    assert "transferred 9 B -> 1 B" in stats["summary"]


def test_tie_break_says_proven_only_with_a_proof():
    g, c = _two_cut_graph()
    small = np.array([0, 0, 0, 1])  # already the least transfer (1 byte)
    _, stats = tie_break(_Model(g, c, small), g, np.arange(g.n), c, small, 5.0, {})
    assert stats["summary"].startswith("tie-break: proven: no plan with the same bottleneck")
    _, stats = tie_break(_Model(g, c, small), g, np.arange(g.n), c, small, 0.0, {})
    assert stats["stages"] == []
    assert stats["summary"].startswith("tie-break: found in time no plan")


def test_tie_break_lowers_latency_at_equal_transfer():
    """Same bottleneck and transfer: the plan with the lower sum of block costs wins."""
    g, c = _two_cut_graph()
    plans = _valid_plans(g, c)
    evs = [evaluate(g, c, a) for a in plans]
    opt = [e for e in evs if e.objective == 11.0]
    least = min(float(e.bytes_in.sum()) for e in opt)
    lat = min(e.latency for e in opt if float(e.bytes_in.sum()) == least)
    plan = solve_cpsat(g, c, np.array([0, 1, 1, 2]), CpsatOptions(time_limit=10, workers=1))
    assert plan.evaluation.latency == pytest.approx(lat, rel=1e-12)


@settings(max_examples=scaled_examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6))
def test_tie_break_equals_brute_force(prob):
    """CP-SAT with the tie-break: the optimum of brute force, and among the plans with that
    bottleneck the least transferred bytes (brute force over every valid plan)."""
    g, c = prob
    truth = brute_force(g, c)
    if truth is None:
        return
    _, hint = quick_assignment(g, c)
    plan = solve_cpsat(g, c, hint, CpsatOptions(time_limit=20, workers=2))
    assert plan.objective == pytest.approx(truth.objective, rel=1e-6, abs=1e-9)
    tb = plan.stats["tie_break"]
    if not all(s.endswith("OPTIMAL") for s in tb.get("stages", ["x"])):
        return
    evs = [evaluate(g, c, a) for a in _valid_plans(g, c)]
    least = min(float(e.bytes_in.sum()) for e in evs if e.objective <= plan.objective)
    assert float(plan.evaluation.bytes_in.sum()) == pytest.approx(least, abs=1e-9)


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6))
def test_tie_break_from_the_worst_optimal_cut_reaches_the_least(prob):
    """Start the tie-break from the optimal plan that sends the MOST bytes (brute force): it
    must end at the least transfer among plans no worse, never above the bottleneck."""
    g, c = prob
    cg, labels = coarse_view(g)
    plans = _valid_plans(g, c)
    if not plans or c.devices < 2:
        return
    evs = [evaluate(g, c, a) for a in plans]
    opt = min(e.objective for e in evs)
    worst = max(
        (i for i, e in enumerate(evs) if e.objective == opt),
        key=lambda i: float(evs[i].bytes_in.sum()),
    )
    ca = np.empty(cg.n, dtype=np.int64)
    ca[labels] = plans[worst]
    ca = np.searchsorted(np.unique(ca), ca)
    model = _Model(cg, c, ca)
    a, stats = tie_break(model, g, labels, c, ca, 10.0, {"num_workers": 1})
    ev = evaluate(g, c, a)
    assert ev.objective <= opt and not validate(g, c, a)
    assert stats["transfer_bytes_before"] == float(evs[worst].bytes_in.sum())
    if stats["stages"] and stats["stages"][0] == "transfer OPTIMAL":
        least = min(float(e.bytes_in.sum()) for e in evs if e.objective <= opt)
        assert float(ev.bytes_in.sum()) == pytest.approx(least, abs=1e-9)


def test_tie_break_can_be_skipped():
    g, c = _two_cut_graph()
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=10, workers=1, extra={"tie_break": False}))
    assert plan.objective == 11.0
    assert plan.stats["tie_break"]["summary"] == "tie-break skipped (tie_break=false)"


def test_tie_break_option_must_be_a_boolean(tmp_path, capsys):
    g, _ = _two_cut_graph()
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g_to_native(g)))
    assert_refused(
        capsys,
        ["solve", str(path), "--set", "tie_break=maybe"],
        r"option 'tie_break' for cpsat must be true or false",
        watch=tmp_path,
    )


def g_to_native(g: Graph) -> dict:
    """The native JSON form of a small graph without parameters."""
    return {
        "name": g.name,
        "nodes": [
            {"name": n, "work": float(w), "sizeout": float(s)}
            for n, w, s in zip(g.names, g.work, g.sizeout, strict=True)
        ],
        "edges": [[g.names[u], g.names[v]] for u, v in zip(g.e_src, g.e_dst, strict=True)],
    }


def test_tie_break_budget_is_a_share_of_what_is_left_and_of_the_main_solve():
    # a 25 s search with 40 s left: half the search (12.5 s), under 20% of what is left (8 s)
    assert tie_break_budget(40.0, 25.0) == pytest.approx(TIE_BREAK_SHARE * 40.0)
    assert tie_break_budget(100.0, 25.0) == pytest.approx(TIE_BREAK_MAIN_SHARE * 25.0)
    # a fast solve stays fast: never more than the main solve (or the small floor)
    assert tie_break_budget(59.0, 0.03) == pytest.approx(TIE_BREAK_MIN_SECONDS)
    assert tie_break_budget(59.0, 1.0) <= 1.0
    # the user's budget wins, within what is left
    assert tie_break_budget(59.0, 0.03, asked=5.0) == 5.0
    assert tie_break_budget(2.0, 0.03, asked=5.0) == 2.0
    assert tie_break_budget(0.0, 10.0) == 0.0


def test_tie_break_stopped_early_says_what_it_found_and_that_it_is_not_proven():
    """A tie-break with no time for a proof names the transfer it keeps and says "not proven"."""
    g, c = _two_cut_graph()
    small = np.array([0, 0, 0, 1])
    _, stats = tie_break(_Model(g, c, small), g, np.arange(g.n), c, small, 0.0, {})
    assert "not proven least" in stats["summary"] and "stopped after" in stats["summary"]
    assert stats["budget_seconds"] == 0.0


def test_cpsat_tie_break_seconds_option_is_checked_and_used():
    g, c = _two_cut_graph()
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=10, extra={"tie_break_seconds": 2.0}))
    assert plan.status == OPTIMAL
    assert plan.stats["tie_break"]["budget_seconds"] == pytest.approx(2.0, abs=0.01)
    with pytest.raises(MtppError) as err:
        solve(g, c, "cpsat", SolveOptions(extra={"tie_break_seconds": -1.0}))
    assert str(err.value) == "option 'tie_break_seconds' for cpsat must be a number >= 0, got -1.0"
