"""The chain DP's frontier tables resume where a deadline stopped them (under load, a table
that restarted at every call never finished within a short limit)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline.dp import chain_ideals
from solver.pipeline.dp.chain_ideals import chain_ideal_dp
from solver.pipeline.dp.separators import separators


def diamonds(count: int = 8, seed: int = 4) -> Graph:
    """A chain of diamonds (s -> a, b -> next s): every s is a separator, the gaps hold the
    diamonds' sides. Random costs; one weight shared by two nodes."""
    rng = np.random.default_rng(seed)
    edges = []
    for i in range(count):
        s, a, b, t = 3 * i, 3 * i + 1, 3 * i + 2, 3 * i + 3
        edges += [(s, a), (s, b), (a, t), (b, t)]
    n = 3 * count + 1
    return Graph.build(
        [f"n{i}" for i in range(n)],
        rng.gamma(2.0, 1e-4, n),
        (rng.integers(1, 64, n) * 2**14).astype(float),
        np.array(edges),
        params=[("w", float(2**20), [1, 5])],
        name="diamonds",
    )


FIELDS = ("t_size", "t_low", "t_low_mask", "t_high", "t_high_mask", "p_size", "p_low", "out")


def test_a_frontier_stopped_by_its_deadline_goes_on_from_the_gap_it_reached():
    g, _ = coarse_view(diamonds())
    ids = chain_ideals._Ideals(g, separators(g), time.perf_counter() + 60)
    assert ids.m > 1  # several gaps
    fresh = chain_ideals._Frontier(g, ids, time.perf_counter() + 60)
    done: dict = {}
    with pytest.raises(chain_ideals._Out, match="time limit while building frontiers"):
        chain_ideals._Frontier(g, ids, time.perf_counter() - 1.0, done)
    assert done["gaps"] == 0
    resumed = chain_ideals._Frontier(g, ids, time.perf_counter() + 60, done)
    finished = {"t": list(done["t"]), "p": list(done["p"]), "gaps": ids.m + 1}
    from_the_end = chain_ideals._Frontier(g, ids, time.perf_counter() - 1.0, finished)
    for name in FIELDS:
        assert np.array_equal(getattr(resumed, name), getattr(fresh, name))
        assert np.array_equal(getattr(from_the_end, name), getattr(fresh, name))


def test_a_dp_stopped_while_pricing_resumes_to_the_same_optimum():
    g, _ = coarse_view(diamonds())
    c = Cluster(name="toy", devices=4, link_bandwidth=2e10)
    ref = chain_ideal_dp(g, c, 4, 0.0, 60.0)
    state: dict = {}
    stopped = chain_ideal_dp(g, c, 4, 0.0, 0.0, state=state)  # no time: stops at once
    assert not stopped.optimal and "stopped" in stopped.stats
    res = chain_ideal_dp(g, c, 4, stopped.lower, 60.0, state=state)
    assert ref.optimal and res.optimal and state == {}
    assert res.value == pytest.approx(ref.value, rel=1e-12)
