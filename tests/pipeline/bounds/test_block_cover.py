"""The block cover bound (solver.pipeline.bounds.block_cover): CP-SAT's pricing bound is at
least the largest price of every valid set (convex, f <= T, within the capacity; found by
enumerating every set with the evaluator), the bound never exceeds the brute-force optimum,
the interval and greedy set costs are the evaluator's, and on a small layered DAG it proves
more than the io density bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound
from solver.core.graph import Graph, coarse_view
from solver.frontends.workloads import layered_dag
from solver.pipeline.bounds import block_cover as bc
from solver.pipeline.bounds.io_density import io_density, io_density_bound
from solver.pipeline.bounds.items import items
from solver.pipeline.exact.brute import brute_force
from tests.conftest import problems, scaled_examples


def convex(g: Graph, members: set[int]) -> bool:
    """No node outside the set on an order path between two of its nodes."""
    below = set().union(*(set(g.descendants(v).tolist()) for v in members))
    above = set().union(*(set(g.ancestors(v).tolist()) for v in members))
    return not ((below & above) - members)


def valid_sets(g: Graph, cluster: Cluster, T: float) -> list[set[int]]:
    """Every valid block at T (the empty set included): convex, f <= T, within capacity."""
    out = []
    for r in range(g.n + 1):
        for combo in itertools.combinations(range(g.n), r):
            s = set(combo)
            if s and not convex(g, s):
                continue
            a = np.ones(g.n, dtype=np.int64)
            a[list(s)] = 0
            ev = evaluate(g, cluster, a, 2)
            if not s or ev.f[0] <= T:
                fits = cluster.capacity is None or not s
                if not fits:
                    fits = ev.params[0] + ev.peak[0] <= cluster.capacity
                if fits:
                    out.append(s)
    return out


@settings(max_examples=scaled_examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6, max_k=3), st.integers(0, 2**32 - 1))
def test_pricing_bound_covers_every_valid_set(problem, seed):
    """U (CP-SAT's proven bound of the pricing model) >= pi(S) for every valid set S at T,
    for random prices of both signs, two random T and the cost of the dearest set."""
    g, cluster = problem
    if not cluster.homogeneous:
        return
    cg, _ = coarse_view(g)
    rng = np.random.default_rng(seed)
    pi = rng.integers(-5, 20, cg.n)
    model = bc.PricingModel(cg, cluster)
    # up to the dearest set of all (every convex set valid: the overflow at its largest)
    costs = [
        bc.set_cost(cg, cluster, np.array(sorted(s))) for s in valid_sets(cg, cluster, math.inf)
    ]
    dearest = max(costs[1:], default=0.0)  # the first is the empty set
    for T in (dearest * rng.random(), dearest * rng.random(), dearest):
        best = max(sum(int(pi[v]) for v in s) for s in valid_sets(cg, cluster, T))
        res = model.price(pi, T, 10.0)
        assert res.upper is not None and res.upper >= best


@settings(max_examples=scaled_examples(25), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7, max_k=3))
def test_block_cover_at_most_brute_force(problem):
    g, cluster = problem
    if not cluster.homogeneous:
        return
    best = brute_force(g, cluster)
    if best is None:
        return
    k = cluster.devices
    for lo in (0.0, lower_bound(g, cluster, k)):
        res = bc.block_cover_bound(g, cluster, k, 1.0, lo)
        assert res.value <= best.objective * (1 + 1e-9) + 1e-12
        assert res.value >= lo


@settings(max_examples=scaled_examples(30), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7, max_k=3))
def test_interval_and_grown_costs_are_the_evaluators(problem):
    """The incremental costs of the intervals and of the greedy growth equal f by the
    evaluator, and the growth's convexity test equals the definition."""
    g, cluster = problem
    if not cluster.homogeneous:
        return
    cg, _ = coarse_view(g)
    sc = bc.set_costs(cg, cluster)
    for order in bc.topological_orders(cg):
        for start, end, cost in bc.interval_rows(sc, order, math.inf, math.inf):
            assert convex(cg, set(order[start:end].tolist()))
            assert math.isclose(cost, bc.set_cost(cg, cluster, order[start:end]), abs_tol=1e-9)
    inc = bc.incidence(cg, sc)
    s = bc.GrowingSet.empty(inc)
    for v in bc.topological_orders(cg)[1].tolist():
        costs, ok = s.cost_with_each(), s.convex_with_each()
        inside = set(np.flatnonzero(s.inside).tolist())
        for w in set(range(cg.n)) - inside:
            cost = bc.set_cost(cg, cluster, np.array(sorted(inside | {w})))
            assert math.isclose(costs[w], cost, rel_tol=1e-9, abs_tol=1e-9)
            assert ok[w] == convex(cg, inside | {w})
        s.add(v)


def test_layered_dag_proves_more_than_io_density():
    """On a 32-node layered DAG at k = 8 the sets that hold a block's share of the work pay
    io that the io density's weights do not see: the block cover proves more (3.3% above it
    in 5 s when measured; asserted: its first probe, 0.1% above)."""
    g = layered_dag(32, seed=0)
    cluster = Cluster("ipu", 8, fast_memory=math.inf, link_bandwidth=64e9)
    cg, it = coarse_view(g)[0], items(g)
    universal = lower_bound(g, cluster, 8)
    lo = io_density_bound(it, io_density(cg, cluster), cluster, 8, 5.0, universal)
    assert lo > universal
    res = bc.block_cover_bound(g, cluster, 8, 1.5, lo)
    assert res.value >= lo * (1 + 0.99e-3)
    assert res.proven >= 1


def test_skips_large_or_trivial_graphs():
    """Above MAX_NODES coarse nodes, or with no more nodes than blocks, it returns lo."""
    cluster = Cluster("ipu", 8, fast_memory=math.inf, link_bandwidth=64e9)
    big = layered_dag(bc.MAX_NODES + 4, seed=1)
    assert bc.block_cover_bound(big, cluster, 8, 1.0, 0.5).value == 0.5
    assert bc.block_cover_bound(layered_dag(8, seed=1), cluster, 8, 1.0, 0.25).value == 0.25
