"""The chain program with io (solver.pipeline.bounds.chain_io): the vectorised bin profiles
and bin count give what a plain loop over the gaps gives (the loop the program was first
written as, kept here as the reference), on random graphs at random capacities."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.core.graph import Graph
from solver.pipeline.bounds.chain_io import Chain, bin_profile, bins_needed_io
from solver.pipeline.bounds.items import items
from tests.conftest import problems, scaled_examples

ROOM_SLACK = 1e-9  # the vectorised room may exceed the exact one by a few ulps of the sums


def reference_room(ch: Chain, g2: int, y: float) -> float:
    """The volume of gap g2 a bin with ``y`` left takes: the largest subset sum at most y plus
    the small part, at most the gap's fluid part."""
    sums = ch.sums[g2]
    y = min(y, float(sums[np.searchsorted(sums, y, side="right") - 1]) + ch.small[g2])
    return min(y, ch.fluid[g2])


def reference_bases(ch: Chain, g: int, rest: float, cap: float, Bm: float, extra_rate: float):
    """Per gap g2 a bin starting in gap g can end in: (g2, room left, what it receives from
    s_{g-1}'s block times ``extra_rate``), one separator at a time."""
    out = []
    load, peak, io_out = rest, 0.0, 0.0
    io_in = ch.cut[g] if g > 0 else 0.0
    extra = extra_rate * io_in
    seen: set[int] = set()
    for g2 in range(g + 1, ch.m + 1):
        j = g2 - 1
        load += ch.size[j] + (ch.fluid[j] if j > g else 0.0)
        peak = max(peak, ch.act[j])
        if load + peak > cap:
            break
        for t, p, sec in ch.ins[j]:
            if p < g and t not in seen:
                seen.add(t)
                io_in += sec
                if p == g - 1:
                    extra += extra_rate * sec
        io_out += sum(sec for last, sec in ch.outs[j] if last > j)
        io_out -= sum(sec for p, sec in ch.ends[j] if g <= p < j)
        cut_out = ch.cut[g2] if g2 < ch.m else 0.0
        base = cap - load - peak - Bm * (io_in + max(0.0, io_out) + cut_out)
        if base >= 0:
            out.append((g2, base, extra))
    return out


def reference_bins(ch: Chain, cap: float, k: int, Bm: float) -> int:
    """The bin count of the program, one state per gap, with the reference profiles."""
    best_i = [math.inf] * (ch.m + 1)
    best_x = [-1.0] * (ch.m + 1)
    best_i[0], best_x[0] = 0, 0.0
    finish = math.inf
    for g in range(ch.m + 1):
        if best_i[g] >= min(k + 1, finish):
            continue
        rest0 = ch.fluid[g] - best_x[g]
        r_max = math.ceil(rest0 / cap - 1e-12) if rest0 > 0 else 0
        if g == ch.m:
            finish = min(finish, best_i[g] + r_max)
            continue
        for r in range(r_max + 1):
            i = best_i[g] + r
            if i >= min(k, finish):
                break
            rest = max(0.0, rest0 - r * cap)
            for g2, base, _ in reference_bases(ch, g, rest, cap, Bm, 0.0):
                y = reference_room(ch, g2, base)
                if i + 1 < best_i[g2] or (i + 1 == best_i[g2] and y > best_x[g2]):
                    best_i[g2], best_x[g2] = i + 1, y
    return int(finish) if finish <= k else k + 1


def _chains(g: Graph, Bm: float) -> list[Chain]:
    it = items(g)
    kinds = [Chain(g, it.work, np.zeros_like(it.work), 1.0, refine=False)]
    kinds.append(Chain(g, Bm * it.work + it.charged, it.act, 1.0, refine=False))
    return [ch for ch in kinds if ch.ok and ch.m > 0]


def _check_profile(ch: Chain, g: int, rest: float, cap: float, extra_rate: float) -> None:
    got = bin_profile(ch, g, rest, cap, 2.0, extra_rate)
    want = reference_bases(ch, g, rest, cap, 2.0, extra_rate)
    assert [x[0] for x in got] == [x[0] for x in want]
    slack = ROOM_SLACK * max(1.0, max(float(s[-1]) for s in ch.sums))
    for (g2, y, y_cross), (_, base, extra) in zip(got, want, strict=True):
        assert reference_room(ch, g2, base) <= y <= reference_room(ch, g2, base + slack)
        if extra == 0:
            assert y_cross == y
        elif base < 2.0 * extra:
            assert y_cross is None
        else:
            low = reference_room(ch, g2, base - 2.0 * extra)
            assert low <= y_cross <= reference_room(ch, g2, base - 2.0 * extra + slack)


@settings(max_examples=scaled_examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=9), st.integers(0, 2**32 - 1))
def test_vectorised_profiles_and_bin_counts_match_the_loop(prob, seed):
    g, c = prob
    rng = np.random.default_rng(seed)
    for ch in _chains(g, c.slow_memory_bandwidth):
        total = float(sum(ch.size) + sum(ch.fluid) + max(ch.act, default=0.0))
        for cap in (rng.random(4) * 1.5 * total + 1e-3).tolist():
            for g in range(ch.m):
                _check_profile(ch, g, ch.fluid[g] * rng.random(), cap, float(rng.choice([0, 0.5])))
            for k in (1, 2, 3):
                assert bins_needed_io(ch, cap, k, 2.0) == reference_bins(ch, cap, k, 2.0)


def test_a_larger_capacity_recomputes_a_truncated_reach():
    # the reach of a gap is kept up to twice the capacity it was first computed for: a
    # later, larger capacity must see the bins that end further on
    g = Graph.build(
        [f"s{i}" for i in range(8)], [1.0] * 8, [0.5] * 8, [(i, i + 1) for i in range(7)]
    )
    ch = _chains(g, 1.0)[0]
    assert [x[0] for x in bin_profile(ch, 0, 0.0, 1.6, 1.0)] == [1]
    assert ch.reach[0].limit == 3.2
    assert [x[0] for x in bin_profile(ch, 0, 0.0, 8.0, 1.0)] == [1, 2, 3, 4, 5, 6, 7, 8]
    # two separators a bin, each middle bin receiving and sending 0.5: 2 + 0.5 + 0.5 = 3
    assert bins_needed_io(ch, 3.0, 4, 1.0) == reference_bins(ch, 3.0, 4, 1.0) == 4
    assert bins_needed_io(ch, 2.9, 4, 1.0) == reference_bins(ch, 2.9, 4, 1.0) == 5
