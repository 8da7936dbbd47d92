"""Volume windows of a gap's interior cut (solver.pipeline.bounds.gap_io.interior_windows) and
the chain io program that charges them: every window holds for every boundary of every plan
(brute force over every closed set of gap nodes), the program stays below the brute-force
optimum, and on parallel experts it proves more than the interior cut alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline.bounds.chain_io import Chain, bins_needed_io, chain_io_bound
from solver.pipeline.bounds.gap_io import gap_graph, interior_windows
from solver.pipeline.bounds.items import items
from solver.pipeline.dp.separators import separators
from solver.pipeline.exact.brute import brute_force
from tests.conftest import problems, scaled_examples
from tests.pipeline.test_bounds import decoders
from tests.pipeline.test_bounds_gap_io import _closed, _gaps, _tensors

TOL = 1e-9


def _boundaries(cg: Graph, s_nodes: list[int], members: list[int], g: int, size):
    """(volume, cut bytes) of every left side D of gap g with volume on both sides (the gap
    cut's tensors, as brute_interior_cut counts them)."""
    left_sep, right_sep = s_nodes[g - 1], s_nodes[g]
    later_seps, gap_nodes = set(s_nodes[g:]), set(members)
    vol = float(size[members].sum())
    for mask in range(1 << len(members)):
        d = {v for i, v in enumerate(members) if mask >> i & 1}
        inside = float(size[list(d)].sum()) if d else 0.0
        if not 0 < inside < vol or not _closed(cg, d, gap_nodes):
            continue
        cut = 0.0
        for p, cons, b in _tensors(cg):
            if p == left_sep and any(c in later_seps for c in cons):
                continue
            if p in d or p == left_sep:
                rest = [c for c in cons if (c in gap_nodes and c not in d) or c == right_sep]
                cut += b if rest and b > 0 else 0.0
        yield inside, cut


def _check_windows(g: Graph) -> int:
    """Every window of every gap against every boundary; the number of windows checked."""
    cg, _ = coarse_view(g)
    sep = separators(cg)
    if sep is None:
        return 0
    s_nodes, members = _gaps(cg)
    pos = np.full(cg.n, -1, dtype=np.int64)
    pos[s_nodes] = np.arange(len(s_nodes))
    it = items(g)
    checked = 0
    for size in (it.work, 3.0 * it.work + it.charged):
        for gap in range(1, len(s_nodes)):
            mem = members[gap]
            if not mem:
                continue
            gg = gap_graph(cg, mem, s_nodes[gap - 1], s_nodes[gap], pos, gap)
            # every window the pinning finds (no step, no limit), not only the kept ones
            win = interior_windows(gg, size, 0.0, most=len(mem), step=0.0)
            assert win.at == sorted(win.at) and win.cut == sorted(win.cut)
            for inside, cut in _boundaries(cg, s_nodes, mem, gap, size):
                for at, least in zip(win.at, win.cut, strict=True):
                    if inside > at * (1 + TOL):
                        assert cut >= least - TOL, (gap, inside, at, cut, least)
            checked += len(win.at)
    return checked


@st.composite
def experts(draw, max_nodes: int = 9):
    """Parallel experts between separators (a mixture-of-experts feed-forward): a router and
    2-3 experts (chains of 1-2 nodes) read s0, partial sums add the experts (the first one
    the router's output too) and feed s1, which also reads s0 (the residual); a second such
    layer while there is room, at most ``max_nodes`` nodes, random works and sizes, k = 2
    or 3."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    names, work, size, edges = ["s0"], [float(rng.integers(0, 3))], [float(rng.integers(1, 4))], []
    prev = 0
    while len(names) + 5 <= max_nodes:  # a layer has 5 nodes at least
        lay = len(names)
        router = len(names)
        names.append(f"r{lay}")
        work.append(float(rng.integers(0, 2)) + 0.5)
        size.append(float(rng.integers(0, 2)))
        edges.append((prev, router))
        ends = []
        for e in range(draw(st.integers(2, 3))):
            src = prev
            room = max_nodes - len(names) - (3 - e)  # the adds and s1 still to come
            for depth in range(draw(st.integers(1, 2)) if room >= 2 else 1):
                v = len(names)
                names.append(f"e{lay}{e}{depth}")
                work.append(float(rng.integers(1, 6)))
                size.append(float(rng.integers(1, 5)))
                edges.append((src, v))
                src = v
            ends.append(src)
            if len(names) + len(ends) + 1 > max_nodes - 1:
                break
        acc = router
        for i, e in enumerate(ends[:-1]):
            a = len(names)
            names.append(f"a{lay}{i}")
            work.append(float(rng.integers(0, 2)))
            size.append(float(rng.integers(1, 4)))
            edges += [(acc, a), (e, a)]
            acc = a
        s = len(names)
        names.append(f"s{lay}")
        work.append(float(rng.integers(0, 3)))
        size.append(float(rng.integers(1, 4)))
        edges += [(acc, s), (ends[-1], s), (prev, s)]
        prev = s
    g = Graph.build(names, work, size, edges, name="experts")
    c = Cluster("toy", draw(st.integers(2, 3)), link_bandwidth=float(rng.choice([0.5, 1.0, 2.0])))
    return g, c


@settings(max_examples=scaled_examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(experts())
def test_windows_hold_for_every_boundary_of_parallel_experts(prob):
    _check_windows(prob[0])


@settings(max_examples=scaled_examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=8))
def test_windows_hold_for_every_boundary_of_random_graphs(prob):
    _check_windows(prob[0])


@settings(max_examples=scaled_examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(decoders())
def test_windows_hold_for_every_boundary_of_decoder_chains(prob):
    _check_windows(prob[0])


def _below_optimum(g: Graph, c: Cluster) -> None:
    truth = brute_force(g, c)
    if truth is None or not math.isfinite(truth.objective):
        return
    it = items(g)
    for memory in (True, False):
        # without a target the windows are always added
        val = chain_io_bound(g, it, c, c.devices, 0.0, 2.0, memory=memory)
        assert val <= truth.objective * (1 + TOL) + TOL, memory


@settings(max_examples=scaled_examples(80), suppress_health_check=[HealthCheck.too_slow])
@given(experts())
def test_chain_io_with_windows_is_below_the_optimum_on_parallel_experts(prob):
    _below_optimum(*prob)


@settings(max_examples=scaled_examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=8))
def test_chain_io_with_windows_is_below_the_optimum_on_random_graphs(prob):
    _below_optimum(*prob)


def _router_and_experts() -> Graph:
    # s0 -> router r (work 0.5, 1 byte out) and experts e1-e3 (work 3, 2 bytes out, each
    # reading s0's 2 bytes, which s1 reads too: a separator tensor the chain io counts);
    # a1 = r + e1 + e2, a2 = a1 + e3 (a separator) -> s1
    names = ["s0", "r", "e1", "e2", "e3", "a1", "a2", "s1"]
    work = [1.0, 0.5, 3.0, 3.0, 3.0, 0.5, 0.5, 1.0]
    size = [2.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 0.0]
    edges = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (2, 5), (3, 5), (5, 6), (4, 6), (6, 7)]
    return Graph.build(names, work, size, edges + [(0, 7)])


def test_a_boundary_past_the_router_pays_more_than_one_after_it():
    # a boundary inside the gap that leaves only the router on the left sends r's 1 byte (the
    # interior cut); one with more volume on the left holds an expert, and sends its output or
    # the partial sum besides: 2 bytes. The plain program lets every boundary inside the gap
    # cost 1 and proves 10; with the window it proves 11 (the optimum is 12)
    g = _router_and_experts()
    c = Cluster("toy", 2, link_bandwidth=1.0)
    ch = Chain(g, items(g).work, np.zeros(g.n), 1.0)
    assert ch.m == 3 and ch.fluid[1] == 10.0 and ch.cut_in[1] == 1.0  # a2 is a separator
    assert bins_needed_io(ch, 10.9, 2, 1.0) == 2
    assert ch.add_windows(math.inf)
    assert ch.win_at[:, 1].tolist() == [0.0, 0.5] and ch.win_cut[:, 1].tolist() == [1.0, 2.0]
    assert bins_needed_io(ch, 10.9, 2, 1.0) == 3
    assert brute_force(g, c).objective == pytest.approx(12.0)
    assert chain_io_bound(g, items(g), c, 2, 0.0, 5.0, memory=False) == pytest.approx(11.0, 1e-5)


def test_windows_are_skipped_when_they_cannot_lift_the_chain_above_the_floor():
    # the window adds 1 link second per boundary side: at most 2 to the bound (10 -> 12), so
    # with a floor of 12 the search stops at the plain value; with 11.5 it goes on
    g = _router_and_experts()
    c = Cluster("toy", 2, link_bandwidth=1.0)
    it = items(g)

    def bound(**kw) -> float:
        return chain_io_bound(g, it, c, 2, 0.0, 5.0, memory=False, **kw)

    assert bound(floor=12.0) == pytest.approx(10.0, 1e-5)
    assert bound(floor=11.5) == pytest.approx(11.0, 1e-5)
    # a target the plain program meets: no windows needed
    assert bound(target=10.0) == pytest.approx(10.0, 1e-5)
