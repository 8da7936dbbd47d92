"""The two-chain DP (solver.pipeline.dp.two_chain) and the bound and plan built on it
(solver.pipeline.bounds.two_chain): on graphs made of two chains with cross edges the DP decides
"k blocks each <= T" exactly (the brute-force optimum without a memory limit is feasible, a hair
below it is not); the bound never exceeds the brute-force optimum of random encoder-decoders;
the plan is a valid plan priced by the evaluator; chains are skipped at once."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.graph import Graph, coarse_view
from solver.pipeline.bounds import two_chain as two_chain_module
from solver.pipeline.bounds.combine import BoundReport
from solver.pipeline.bounds.two_chain import (
    TwoChainBound,
    TwoChainPlan,
    two_chain_bound,
    two_chain_case,
    two_chain_plan,
    two_chain_split,
)
from solver.pipeline.dp.two_chain import (
    TwoChainUnsupported,
    assignment_of,
    fewest_blocks,
    sorted_partial,
    two_chains,
)
from solver.pipeline.exact.brute import brute_force
from solver.pipeline.options import Incumbent
from solver.pipeline.registry import with_two_chain
from tests.conftest import scaled_examples
from tests.pipeline.test_bounds_nonchain import _hand_encoder_decoder, encoder_decoders

TOL = 1e-9


@st.composite
def two_chain_graphs(draw, max_nodes: int = 9):
    """An encoder (a chain with random skip edges) ending in E, a decoder prefix chain beside
    it, a decoder chain whose first node joins the prefix and E, later decoder nodes reading
    E or an earlier encoder node; random work and sizes, no memory limit. Returns the graph,
    the cluster and the mask of the encoder side."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    enc = draw(st.integers(1, 4))
    pre = draw(st.integers(1, 2))
    dec = draw(st.integers(1, max(1, max_nodes - enc - pre)))
    names = [f"e{i}" for i in range(enc)] + [f"p{i}" for i in range(pre)]
    names += [f"d{j}" for j in range(dec)]
    edges = [(i, i + 1) for i in range(enc - 1)]
    edges += [(i, i + 2) for i in range(enc - 2) if rng.random() < 0.5]
    edges += [(enc + i, enc + i + 1) for i in range(pre - 1)]
    first = enc + pre
    edges += [(enc + pre - 1, first), (enc - 1, first)]
    for j in range(1, dec):
        edges.append((first + j - 1, first + j))
        if rng.random() < 0.6:
            edges.append((int(rng.integers(0, enc)), first + j))
    n = len(names)
    work = rng.integers(0, 6, n).astype(float) if rng.random() < 0.5 else rng.random(n) * 5
    sizeout = rng.integers(0, 5, n).astype(float)
    g = Graph.build(names, work, sizeout, sorted(set(edges)), name="twochain")
    k = draw(st.integers(1, 4))
    cluster = Cluster("toy", k, link_bandwidth=float(rng.choice([0.5, 1.0, 2.0])))
    in_a = np.zeros(n, dtype=bool)
    in_a[:enc] = True
    return g, cluster, in_a


def _tables(g: Graph, cluster: Cluster, in_a: np.ndarray):
    tc = two_chains(g, in_a, cluster.link_bandwidth, time.perf_counter() + 30)
    return tc, sorted_partial(tc)


@settings(max_examples=scaled_examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(two_chain_graphs())
def test_dp_decides_k_blocks_at_most_t_exactly(prob):
    g, c, in_a = prob
    truth = brute_force(g, c)
    tc, srt = _tables(g, c, in_a)
    k = c.devices
    opt = truth.objective
    chain = fewest_blocks(tc, srt, opt, k)
    assert chain is not None  # the optimum's T is feasible
    a = assignment_of(tc, chain, g.n)
    assert validate(g, c, a, k) == []
    assert evaluate(g, c, a, k).objective == pytest.approx(opt, rel=1e-9, abs=1e-12)
    if opt > 0:
        assert fewest_blocks(tc, srt, opt * (1 - 1e-6) - 1e-12, k) is None  # and nothing below


def test_dp_refuses_a_prefix_that_reads_the_encoder():
    # p0 reads e0: a B-ideal beside A holds a reader of a tensor of A (the cross part would
    # then depend on both sides), so the DP does not apply
    g = Graph.build(
        ["e0", "e1", "p0", "d0"], [1.0] * 4, [1.0] * 4, [(0, 1), (0, 2), (2, 3), (1, 3)]
    )
    in_a = np.array([True, True, False, False])
    with pytest.raises(TwoChainUnsupported, match="a B-ideal beside A holds a reader"):
        two_chains(g, in_a, 1.0, time.perf_counter() + 5)
    with pytest.raises(TwoChainUnsupported, match="an edge goes from B into A"):
        two_chains(g, np.array([False, True, False, False]), 1.0, time.perf_counter() + 5)


def _bound(g: Graph, c: Cluster, k: int, target: float | None = None) -> TwoChainBound:
    """The two-chain bound of ``g`` (0 when it is not two chains), 5 s."""
    split = two_chain_case(g, c, k)
    return TwoChainBound(0.0, None) if split is None else two_chain_bound(split, c, k, 5.0, target)


def _plan(g: Graph, c: Cluster, k: int, lower: float = 0.0) -> TwoChainPlan | None:
    """The two-chain plan of ``g`` above a proven bound ``lower`` (None: not two chains)."""
    split = two_chain_case(g, c, k)
    return None if split is None else two_chain_plan(g, split, c, k, 5.0, (lower, math.inf))


def _check_bound_and_plan(g: Graph, c: Cluster) -> None:
    truth = brute_force(g, c)
    k = c.devices
    bound = _bound(g, c, k)
    if truth is None:
        return
    assert bound.value <= truth.objective * (1 + TOL) + TOL
    plan = _plan(g, c, k, lower=bound.value)  # the first probe just above the bound
    if plan is not None:
        assert validate(g, c, plan.assignment, k) == []
        assert evaluate(g, c, plan.assignment, k).objective == pytest.approx(plan.value)
        assert plan.value >= truth.objective * (1 - TOL) - TOL


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(encoder_decoders())
def test_bound_is_at_most_the_optimum_and_plan_is_valid_on_encoder_decoders(prob):
    _check_bound_and_plan(*prob)


@settings(max_examples=scaled_examples(100), suppress_health_check=[HealthCheck.too_slow])
@given(two_chain_graphs())
def test_bound_is_at_most_the_optimum_on_two_chain_graphs(prob):
    g, c, _ = prob
    _check_bound_and_plan(g, c)


def test_hand_built_encoder_decoder_bound_and_plan_meet_the_optimum():
    # e0 -> e1 (E) -> d0 -> d1, the prefix p beside the encoder, E read by d1 through k1:
    # brute force 9 ({e0, e1} | {p, d0, k1} | {d1}); the two chains (e0, e1) and (p, d0, k1,
    # d1) keep everything (k1 spans no position after the join), so the DP is exact
    g, c = _hand_encoder_decoder()
    assert brute_force(g, c).objective == pytest.approx(9.0)
    split = two_chain_split(coarse_view(g)[0])
    assert split is not None
    assert [split.graph.names[v] for v in np.flatnonzero(split.side)] == ["p"]
    assert [split.graph.names[v] for v in np.flatnonzero(split.in_a)] == ["e0", "e1"]
    plan = _plan(g, c, 3)
    assert plan is not None and plan.value == pytest.approx(9.0)
    bound = _bound(g, c, 3, target=9.0)
    assert bound.value == pytest.approx(9.0, rel=1e-6) and bound.value <= 9.0


def test_chains_are_skipped_at_once():
    n = 50
    g = Graph.build(
        [f"v{i}" for i in range(n)], [1.0] * n, [1.0] * n, [(i, i + 1) for i in range(n - 1)]
    )
    c = Cluster("toy", 4)
    assert two_chain_split(coarse_view(g)[0]) is None
    assert two_chain_case(g, c, 4) is None
    assert math.isinf(c.fast_memory)


@st.composite
def projected_encoder_decoders(draw):
    """An encoder ending in E, a decoder prefix p beside it, decoder layers d1.. each reading
    E through a projection k_j at least as large as E, and some decoder projections s_j of
    d_{j-1} read by d_{j+1} (the credited removed nodes); random work and sizes, 2 or 3
    blocks, no memory limit."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    enc, dec = int(rng.integers(1, 3)), int(rng.integers(2, 4))
    names = [f"e{i}" for i in range(enc)] + ["p"] + [f"d{j}" for j in range(dec)]
    edges = [(i, i + 1) for i in range(enc - 1)] + [(enc, enc + 1), (enc - 1, enc + 1)]
    wide = {}  # projection -> the node whose tensor it reads
    for j in range(1, dec):
        d = enc + 1 + j
        names.append(f"k{j}")
        edges += [(d - 1, d), (enc - 1, len(names) - 1), (len(names) - 1, d)]
        wide[len(names) - 1] = enc - 1
        if j + 1 < dec and rng.random() < 0.5:  # a decoder projection skipping d_j
            names.append(f"s{j}")
            edges += [(d - 1, len(names) - 1), (len(names) - 1, d + 1)]
            wide[len(names) - 1] = d - 1
    n = len(names)
    work = rng.integers(1, 6, n).astype(float)
    size = rng.integers(1, 5, n).astype(float)
    for proj, src in wide.items():
        size[proj] = max(size[proj], size[src])
    g = Graph.build(names, work, size, edges, name="projected")
    return g, Cluster("toy", int(rng.integers(2, 4)), link_bandwidth=1.0)


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(projected_encoder_decoders())
def test_bound_with_credits_is_at_most_the_optimum(prob):
    _check_bound_and_plan(*prob)


def test_credit_is_capped_where_a_reader_may_receive_the_projection_instead():
    # the optimum 12 puts k1 with e0 and d1 alone, receiving k1's output (as large as E)
    # instead of E; crediting d1 with k1's work in every block would prove 12.99
    g = Graph.build(
        ["e0", "p", "d0", "d1", "k1"],
        [5.0, 3.0, 3.0, 5.0, 2.0],
        [2.0, 4.0, 4.0, 4.0, 2.0],
        [(1, 2), (0, 2), (2, 3), (0, 4), (4, 3)],
    )
    c = Cluster("toy", 3, link_bandwidth=1.0)
    assert brute_force(g, c).objective == pytest.approx(12.0)
    bound = _bound(g, c, 3, target=12.0)
    assert bound.value <= 12.0 and bound.value == pytest.approx(12.0, rel=1e-6)
    assert _bound(g, c, 3).value == pytest.approx(12.0, rel=2e-3)


def _credited_encoder_decoder() -> tuple[Graph, Cluster]:
    g = Graph.build(
        ["e0", "p", "d0", "d1", "k1"],
        [5.0, 3.0, 3.0, 5.0, 2.0],
        [2.0, 4.0, 4.0, 4.0, 2.0],
        [(1, 2), (0, 2), (2, 3), (0, 4), (4, 3)],
    )
    return g, Cluster("toy", 3, link_bandwidth=1.0)


def test_solve_adds_the_two_chain_bound_and_plan_when_the_gap_is_open():
    g, c = _credited_encoder_decoder()
    one_block = Incumbent(18.0, np.zeros(g.n, dtype=np.int64), 0.5)
    rep = BoundReport(6.0, "universal", {"universal": 6.0}, seconds=0.25)
    rep2, inc = with_two_chain(g, c, 3, rep, one_block, 10.0)
    assert inc.objective == pytest.approx(12.0) and inc.seconds >= 0.5
    assert evaluate(g, c, inc.assignment, 3).objective == pytest.approx(12.0)
    assert rep2.binding == "two chain" and rep2.bounds["universal"] == 6.0
    assert rep2.value == rep2.bounds["two chain"] == pytest.approx(12.0, rel=1e-6)
    assert rep2.value <= 12.0 and rep2.seconds >= 0.25
    # nothing above a bound that already meets the plan: the report stays, its time grows
    met = BoundReport(12.0, "decision", {"decision": 12.0})
    rep3, same = with_two_chain(g, c, 3, met, inc, 10.0)
    assert rep3.binding == "decision" and "two chain" not in rep3.bounds
    assert same.objective == inc.objective


def test_decoder_projection_credit_is_capped_too():
    # s1 and s2 project d0 and d1 for d2 and d3 (each skips a decoder node, so the relaxation
    # removes it): the optimum is 21 and the capped credits prove it; crediting each reader
    # with its projection's work in every block would prove 24
    g = Graph.build(
        ["e0", "e1", "p", "d0", "d1", "d2", "d3", "s1", "s2"],
        [4.0, 3.0, 3.0, 4.0, 4.0, 5.0, 3.0, 3.0, 3.0],
        [4.0, 3.0, 4.0, 4.0, 3.0, 2.0, 2.0, 4.0, 3.0],
        [(0, 1), (2, 3), (1, 3), (3, 4), (1, 4), (3, 7), (7, 5), (4, 5), (1, 5), (4, 8)]
        + [(8, 6), (5, 6), (1, 6)],
    )
    c = Cluster("toy", 3, link_bandwidth=1.0)
    assert brute_force(g, c).objective == pytest.approx(21.0)
    bound = _bound(g, c, 3)
    assert bound.value <= 21.0 and bound.value == pytest.approx(21.0, rel=2e-3)


def test_the_split_is_computed_once_per_solve(monkeypatch):
    calls = []
    split_once = two_chain_module.two_chain_split

    def counted(cg):
        calls.append(cg.n)
        return split_once(cg)

    monkeypatch.setattr(two_chain_module, "two_chain_split", counted)
    g, c = _credited_encoder_decoder()
    rep = BoundReport(6.0, "universal", {"universal": 6.0}, seconds=0.25)
    rep2, inc = with_two_chain(g, c, 3, rep, Incumbent(18.0, np.zeros(g.n, np.int64), 0.5), 10.0)
    assert rep2.binding == "two chain" and inc.objective == pytest.approx(12.0)
    assert calls == [g.n]


def test_the_plan_probes_just_above_the_bound_early(monkeypatch):
    # no descent: a probe just below the incumbent's cost, then one at PLAN_FIRST_GAP above
    # a bound a hair below the optimum 12 finds it
    monkeypatch.setattr(two_chain_module, "_descend", lambda *args: 0.0)
    g, c = _credited_encoder_decoder()
    split = two_chain_case(g, c, 3)
    plan = two_chain_plan(g, split, c, 3, 5.0, (12.0 * (1 - 1e-3), 18.0))
    assert plan is not None and plan.value == pytest.approx(12.0)
    assert evaluate(g, c, plan.assignment, 3).objective == pytest.approx(12.0)
    # a bound too far below: the probe there finds nothing; the plan is the first probe's
    loose = two_chain_plan(g, split, c, 3, 5.0, (10.0, 18.0))
    assert loose is not None and 12.0 - 1e-9 <= loose.value < 18.0
    assert evaluate(g, c, loose.assignment, 3).objective == pytest.approx(loose.value)
