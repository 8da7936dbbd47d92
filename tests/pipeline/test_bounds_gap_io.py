"""The gap refinements of the chain io program (solver.pipeline.bounds.gap_io): each gap's
interior cut and io density equal brute force over every cut and every set of its nodes, and
the refined program stays below the brute-force optimum while proving more than the plain
one where a block boundary inside a gap is dear."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline.bounds.chain_io import Chain, bins_needed_io, chain_io_bound
from solver.pipeline.bounds.gap_io import DENSITY_STEPS, DENSITY_UNITS
from solver.pipeline.bounds.items import items
from solver.pipeline.dp.separators import separators
from solver.pipeline.exact.brute import brute_force
from tests.conftest import problems, scaled_examples
from tests.pipeline.test_bounds import decoders

TOL = 1e-9


def _gaps(cg: Graph) -> tuple[list[int], list[list[int]]]:
    """The separators in order and the nodes of each gap."""
    sep = separators(cg)
    rank = cg.topo_rank
    s_nodes = sorted(np.flatnonzero(sep).tolist(), key=lambda v: rank[v])
    gap = np.searchsorted(rank[s_nodes], rank)
    members: list[list[int]] = [[] for _ in range(len(s_nodes) + 1)]
    for v in np.flatnonzero(~sep).tolist():
        members[int(gap[v])].append(v)
    return s_nodes, members


def _tensors(cg: Graph):
    for t in range(cg.num_tensors):
        cons = cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]].tolist()
        yield int(cg.t_producer[t]), cons, float(cg.t_size[t])


def _closed(cg: Graph, d: set[int], gap_nodes: set[int]) -> bool:
    ptr, idx = cg.pred
    return all(a not in gap_nodes or a in d for v in d for a in idx[ptr[v] : ptr[v + 1]].tolist())


def brute_interior_cut(cg: Graph, s_nodes: list[int], members: list[int], g: int, size):
    """The least gap cut (bytes) over the left sets D of gap g holding volume on both sides."""
    left_sep, right_sep = s_nodes[g - 1], s_nodes[g]
    later_seps = set(s_nodes[g:])
    gap_nodes = set(members)
    vol = float(size[members].sum())
    best = math.inf
    for r in range(len(members) + 1):
        for d in map(set, itertools.combinations(members, r)):
            inside = float(size[list(d)].sum()) if d else 0.0
            if not 0 < inside < vol or not _closed(cg, d, gap_nodes):
                continue
            cut = 0.0
            for p, cons, b in _tensors(cg):
                if p == left_sep and any(c in later_seps for c in cons):
                    continue  # separator-to-separator: the chain io counts it
                if p in d or p == left_sep:
                    rest = [c for c in cons if (c in gap_nodes and c not in d) or c == right_sep]
                    cut += b if rest and b > 0 else 0.0
            best = min(best, cut)
    return best


def brute_density(cg: Graph, members: list[int], size, unit: float = 0.0) -> float:
    """The least (io(S) - unit * |S|) / size(S) over the sets S of gap nodes with volume (io in
    bytes; ``unit``: the rounding the max-flow proof may lose per node)."""
    best = math.inf
    for r in range(1, len(members) + 1):
        for s in map(set, itertools.combinations(members, r)):
            vol = float(size[list(s)].sum())
            if vol <= 0:
                continue
            io = sum(
                b for p, cons, b in _tensors(cg) if len({p, *cons} & s) not in (0, len({p, *cons}))
            )
            best = min(best, (io - unit * len(s)) / vol)
    return best


def _whole_gap_io(cg: Graph, members: list[int]) -> float:
    """io(S) of S = every node of the gap."""
    s = set(members)
    return sum(b for p, cons, b in _tensors(cg) if len({p, *cons} & s) not in (0, len({p, *cons})))


def _check_gaps(g: Graph) -> None:
    cg, _ = coarse_view(g)
    if separators(cg) is None:
        return
    s_nodes, members = _gaps(cg)
    it = items(g)
    for size in (it.work, 3.0 * it.work + it.charged):
        ch = Chain(g, size, np.zeros_like(size), 1.0)
        for gap, mem in enumerate(members):
            if not mem:
                continue
            truth = brute_density(cg, mem, size)
            got = ch.density[gap]
            if math.isinf(truth):
                assert got == 0.0
                continue
            assert got <= truth * (1 + TOL) + TOL
            # the bisection starts at io(gap) / size(gap) and halves DENSITY_STEPS times; its
            # proofs round volumes up, losing at most one unit (1 / 1024 byte) per node
            whole = _whole_gap_io(cg, mem) / float(size[mem].sum())
            floor = brute_density(cg, mem, size, unit=1.0 / DENSITY_UNITS)
            assert got >= floor - whole * 2.0**-DENSITY_STEPS - 1e-12
            if 0 < gap < len(s_nodes):
                want = max(brute_interior_cut(cg, s_nodes, mem, gap, size), ch.cut[gap])
                assert ch.cut_in[gap] == pytest.approx(want) or (
                    ch.cut_in[gap] == ch.cut[gap] <= want  # too many pairs: no claim
                )


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(decoders())
def test_interior_cut_and_density_equal_brute_force_on_decoder_chains(prob):
    _check_gaps(prob[0])


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=8))
def test_interior_cut_and_density_equal_brute_force_on_random_graphs(prob):
    _check_gaps(prob[0])


@settings(max_examples=scaled_examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(decoders())
def test_refined_chain_io_is_below_the_brute_force_optimum_on_decoder_chains(prob):
    g, c = prob
    truth = brute_force(g, c)
    if truth is None:
        return
    it = items(g)
    for memory in (True, False):
        val = chain_io_bound(g, it, c, c.devices, 0.0, 2.0, memory=memory)
        assert val <= truth.objective * (1 + TOL) + TOL, memory


def test_a_boundary_inside_a_gap_pays_the_interior_cut():
    # s0 -> {a, b} -> s1 (k = 2, B = 1): a boundary between a and b sends s0's output to b and
    # a's output to s1 (2 + 3); the gap cut alone (2: before a and b) let the chain split the
    # gap's 8 units freely and prove 10; with the interior cut it proves the optimum 13
    g = Graph.build(
        ["s0", "a", "b", "s1"],
        [4.0, 4.0, 4.0, 4.0],
        [2.0, 3.0, 3.0, 0.0],
        [(0, 1), (0, 2), (1, 3), (2, 3)],
    )
    c = Cluster("toy", 2, link_bandwidth=1.0)
    ch = Chain(g, items(g).work, np.zeros(4), 1.0)
    assert ch.cut.tolist() == [0.0, 2.0, 0.0] and ch.cut_in[1] == 5.0
    plain = Chain(g, items(g).work, np.zeros(4), 1.0, refine=False)
    assert bins_needed_io(plain, 12.0, 2, 1.0) == 2  # the plain program fits 12
    assert bins_needed_io(ch, 12.9, 2, 1.0) == 3
    assert brute_force(g, c).objective == pytest.approx(13.0)
    assert chain_io_bound(g, items(g), c, 2, 0.0, 5.0, memory=False) == pytest.approx(13.0, 1e-5)


def test_a_bin_of_parallel_experts_pays_their_io():
    # s0 -> four parallel experts e_i (work 4, each reads s0's 2 bytes) -> adds a1 = e0 + e1,
    # a2 = a1 + e2 -> s1 (reads a2 and e3): a set of gap nodes holding work pays io; the least
    # io per unit of work is S = {e0, e1, e2, a1, a2}: 2 in and 2 out for 12 units
    names = ["s0", "e0", "e1", "e2", "e3", "a1", "a2", "s1"]
    work = [1.0, 4.0, 4.0, 4.0, 4.0, 0.0, 0.0, 1.0]
    size = [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 0.0]
    edges = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (2, 5), (5, 6), (3, 6), (6, 7), (4, 7)]
    g = Graph.build(names, work, size, edges)
    ch = Chain(g, items(g).work, np.zeros(len(names)), 1.0)
    assert ch.m == 2 and ch.fluid[1] == 16.0
    assert ch.density[1] <= 4.0 / 12.0
    assert ch.density[1] >= 4.0 / 12.0 * (1 - 2.0**-DENSITY_STEPS * 4) - 5.0 / DENSITY_UNITS
    # at k = 3 and T = 8 the plain program fits (a bin of gap volume alone holds 8 units for
    # free); with the density a bin holding only gap nodes holds at most 8 / (1 + 1/3) = 6 of
    # them, and the chain needs 4 bins: T = 8 is proven infeasible
    plain = Chain(g, items(g).work, np.zeros(len(names)), 1.0, refine=False)
    assert bins_needed_io(plain, 8.0, 3, 1.0) == 3
    assert bins_needed_io(ch, 8.0, 3, 1.0) == 4
    c = Cluster("toy", 3, link_bandwidth=1.0)
    bound = chain_io_bound(g, items(g), c, 3, 0.0, 5.0, memory=False)
    assert 8.0 < bound <= brute_force(g, c).objective == pytest.approx(12.0)
