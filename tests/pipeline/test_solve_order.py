"""The order of cpsat's bounds and plans before its search (solver.pipeline.registry,
_bounds_and_plans) and the pause of the certified bounds (solver.pipeline.bounds.combine,
BoundSearch): on two chains the two-chain bound goes before the full pair block, every other
graph keeps the old order; a paused search reports the same bounds as one run; the two-chain
plan runs only while its bound leaves the gap open; the CP-SAT tie-break after a met
incumbent gets a share of the seconds that found it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline import registry
from solver.pipeline.bounds import combine
from solver.pipeline.bounds.combine import (
    TWO_CHAIN_PAUSE,
    BoundReport,
    BoundSearch,
    certified_lower_bound,
)
from solver.pipeline.exact.brute import brute_force
from solver.pipeline.options import Incumbent
from tests.pipeline.test_bounds_topology import chain_on_two_servers
from tests.pipeline.test_bounds_two_chain import _credited_encoder_decoder


def _recorded(monkeypatch, calls: list[str]) -> None:
    """Record the pair block (every call: quick or full), the spine relaxations' bound, the
    spine plan and the two-chain bound and plan, in the order they run (each still runs)."""
    for module, name, label in (
        (combine, "_pair_block", "pair block"),
        (combine, "_spine", "spine bound"),
        (registry, "spine_plan", "spine plan"),
        (registry, "two_chain_bound", "two chain bound"),
        (registry, "two_chain_plan", "two chain plan"),
    ):
        fn = getattr(module, name)

        def wrapped(*args, _fn=fn, _label=label, **kwargs):
            calls.append(_label)
            return _fn(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)


def test_two_chains_go_before_the_full_pair_block(monkeypatch):
    g, c = _credited_encoder_decoder()  # optimum 12 at k = 3
    calls: list[str] = []
    _recorded(monkeypatch, calls)
    # the spine plan finds nothing here, so the gap stays open for the two chains
    monkeypatch.setattr(registry, "with_spine_plan", lambda g, c, k, inc, s: inc)
    one_block = Incumbent(18.0, np.zeros(g.n, dtype=np.int64), 0.5)
    rep, inc = registry._bounds_and_plans(g, c, 3, one_block, 5.0, 30.0)
    assert inc.objective == pytest.approx(12.0) and rep.value == pytest.approx(12.0, rel=1e-6)
    assert brute_force(g, c).objective == pytest.approx(12.0)
    # the quick pair block, then the two chains' bound and plan; the spine relaxations and the
    # full pair block never run: the gap closed
    assert calls == ["pair block", "two chain bound", "two chain plan"]
    assert rep.skipped["pair block"] == f"proved nothing above {rep.value:.10g}"
    assert rep.skipped["weights"].startswith("not needed")


def test_other_graphs_keep_every_bound_before_the_spine_plan(monkeypatch):
    # two parallel branches between a and d: every node has a spine ancestor, no side branch
    names = ["a", "b", "c", "d", "e"]
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    g = Graph.build(names, [3.0, 4.0, 4.0, 3.0, 2.0], [2.0] * 5, edges, name="diamond")
    c = Cluster("toy", 3, link_bandwidth=1.0)
    assert registry.two_chain_case(g, c, 3) is None
    calls: list[str] = []
    _recorded(monkeypatch, calls)
    one_block = Incumbent(1e9, np.zeros(g.n, dtype=np.int64), 0.1)
    rep, _ = registry._bounds_and_plans(g, c, 3, one_block, 1.0, 10.0)
    assert "two chain bound" not in calls and "two chain plan" not in calls
    assert calls[0] == "spine bound"  # the stages in their old order, the spine plan last
    if "pair block" in calls and "spine plan" in calls:
        assert calls.index("pair block") < calls.index("spine plan")
    assert rep.value <= brute_force(g, c).objective * (1 + 1e-9)


def test_a_paused_search_reports_the_bounds_of_one_run_without_the_pause():
    g, c = _credited_encoder_decoder()
    whole = certified_lower_bound(g, c, 5.0, ideals=False, target=18.0)
    search = BoundSearch(g, c, 5.0, ideals=False, target=18.0)
    t0 = time.perf_counter()
    paused = search.run(until=TWO_CHAIN_PAUSE)
    assert "pair block" not in paused.bounds and "pair block" not in paused.skipped
    time.sleep(0.3)
    rep = search.resume(paused, 18.0)
    assert rep.bounds == whole.bounds and rep.binding == whole.binding
    assert rep.seconds < time.perf_counter() - t0 - 0.25  # the pause is not the bounds' time


def test_a_resume_after_a_met_bound_lists_the_rest_as_not_needed():
    g, c = _credited_encoder_decoder()
    search = BoundSearch(g, c, 5.0, ideals=False, target=18.0)
    paused = search.run(until=TWO_CHAIN_PAUSE)
    met = BoundReport(12.0, "two chain", {**paused.bounds, "two chain": 12.0}, paused.seconds + 1.0)
    rep = search.resume(met, 12.0)
    assert rep.value == 12.0 and rep.bounds["two chain"] == 12.0
    assert rep.skipped["pair block"].startswith("not needed: ")
    assert rep.skipped["decision"].startswith("not needed: ")
    assert rep.seconds >= paused.seconds + 1.0  # the two chains' second counts


def test_the_two_chain_plan_is_skipped_when_its_bound_meets_the_incumbent(monkeypatch):
    g, c = _credited_encoder_decoder()
    optimum = brute_force(g, c)
    inc = Incumbent(optimum.objective, np.asarray(optimum.assignment), 0.5)

    def refuse(*args, **kwargs):
        raise AssertionError("the plan ran although the bound met the incumbent")

    monkeypatch.setattr(registry, "two_chain_plan", refuse)
    rep = BoundReport(6.0, "universal", {"universal": 6.0}, seconds=0.25)
    rep2, same = registry.with_two_chain(g, c, 3, rep, inc, 10.0)
    assert rep2.binding == "two chain" and rep2.value == pytest.approx(12.0, rel=1e-6)
    assert same.objective == inc.objective and same.seconds == inc.seconds


def _chain(n: int) -> Graph:
    names = [f"v{i}" for i in range(n)]
    edges = [(i, i + 1) for i in range(n - 1)]
    return Graph.build(names, [1.0 + (i % 3) for i in range(n)], [4.0] * n, edges, name="chain")


def test_the_tie_break_after_a_met_incumbent_gets_a_share_of_its_search():
    big = _chain(320)
    assert coarse_view(big)[0].n >= registry.IDEALS_MIN_NODES
    inc = Incumbent(10.0, np.zeros(big.n, dtype=np.int64), 3.0)
    met = BoundReport(10.0, "chain", {"chain": 10.0})
    extra = registry._met_tie_break(big, inc, met, {})
    assert extra == {"tie_break_seconds": registry.MET_TIE_BREAK_SHARE * 3.0}
    # a user's choice is kept; an open gap, or a graph the chain DP breaks ties on, keeps
    # the default
    assert registry._met_tie_break(big, inc, met, {"tie_break_seconds": 7.0}) == {
        "tie_break_seconds": 7.0
    }
    assert registry._met_tie_break(big, inc, met, {"tie_break": False}) == {"tie_break": False}
    open_gap = BoundReport(9.0, "chain", {"chain": 9.0})
    assert registry._met_tie_break(big, inc, open_gap, {}) == {}
    small = _chain(20)
    assert registry._met_tie_break(small, inc, met, {}) == {}
    assert registry._met_tie_break(big, None, met, {}) == {}


def test_a_cluster_whose_links_differ_runs_every_bound_at_once(monkeypatch):
    g, _ = chain_on_two_servers()
    c = Cluster("two-servers", 4, compute=1.0, topology=chain_on_two_servers()[1].topology)
    calls: list[str] = []
    _recorded(monkeypatch, calls)
    one_block = Incumbent(8.0, np.zeros(g.n, dtype=np.int64), 0.5)
    rep, _ = registry._bounds_and_plans(g, c, 4, one_block, 5.0, 30.0)
    assert "two chain bound" not in calls  # the topology bound runs its own pair block
    assert rep.value == pytest.approx(4.01, rel=1e-6)  # the slow link between the groups
