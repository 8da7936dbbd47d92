"""The pair-block bound (solver.pipeline.bounds.pair_block): every pair cost is at most the
cost of every block holding both nodes in every plan, the bound never exceeds the
brute-force optimum, and on parallel experts it proves an optimum no other bound reaches."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline.bounds import certified_lower_bound, pair_block
from solver.pipeline.bounds.pair_block import pair_block_bound, pair_costs, visit_order
from solver.pipeline.exact.brute import all_assignments, batch_costs, brute_force
from tests.conftest import problems, scaled_examples

TOL = 1e-9


def _check_pair_costs_below_every_block(g: Graph, c: Cluster) -> None:
    cg, _ = coarse_view(g)
    costs = pair_costs(cg, c)
    visit_order(costs, cg.n)  # fills the node-block values the pair costs also use
    k = c.devices
    A = all_assignments(cg, k)
    f, _ = batch_costs(cg, c, A, k)
    # the least f over the plans' blocks holding both u and v
    least = np.full((cg.n, cg.n), np.inf)
    for b in range(k):
        inb = b == A
        for u, v in itertools.combinations(range(cg.n), 2):
            both = inb[:, u] & inb[:, v]
            if both.any():
                least[u, v] = min(least[u, v], float(f[both, b].min()))
    for u, v in itertools.combinations(range(cg.n), 2):
        if np.isfinite(least[u, v]):
            assert costs.pair_cost(u, v) <= least[u, v] * (1 + TOL) + TOL
            assert costs.pair_cost(v, u) == costs.pair_cost(u, v)


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6, max_k=3))
def test_pair_cost_is_at_most_every_block_holding_both(prob):
    _check_pair_costs_below_every_block(*prob)


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_pair_block_bound_is_below_the_brute_force_optimum(prob):
    g, c = prob
    truth = brute_force(g, c)
    if truth is None:
        return
    res = pair_block_bound(g, c, c.devices, 5.0)
    assert res.value <= truth.objective * (1 + TOL) + TOL
    if res.value > 0:  # the groups need more blocks than the plan has
        assert sum(2 if len(group) > 1 else 1 for group in res.nodes) > c.devices


def parallel_experts(works: list[float], hidden: float, expert_out: float, head: float) -> Graph:
    """x -> h -> experts e_i (in parallel) -> a running sum a_1..a_{m-1} -> r = x + sum: the
    feed-forward of a mixture of experts. x, h and r send ``hidden`` bytes, the experts and
    the additions ``expert_out``; x costs ``head`` work, the experts ``works``."""
    m = len(works)
    names = ["x", "h", *[f"e{i}" for i in range(m)], *[f"a{i}" for i in range(1, m)], "r"]
    at = {name: i for i, name in enumerate(names)}
    edges = [
        (at["x"], at["h"]),
        (at["x"], at["r"]),
        (at["e0"], at["a1"]),
        (at[f"a{m - 1}"], at["r"]),
    ]
    edges += [(at["h"], at[f"e{i}"]) for i in range(m)]
    edges += [(at[f"e{i}"], at[f"a{max(i, 1)}"]) for i in range(1, m)]
    edges += [(at[f"a{i - 1}"], at[f"a{i}"]) for i in range(2, m)]
    work = [head, 0.0, *works, *[0.0] * (m - 1), 0.0]
    size = [hidden, hidden, *[expert_out] * (2 * m - 1), hidden]
    return Graph.build(names, np.array(work), np.array(size), edges, name="experts")


def test_pair_block_proves_the_optimum_of_parallel_experts():
    # k = 3: the optimum 11 (brute force); no two of {e0, e1, a1, a2} fit in one block below
    # 11 (e.g. e0 and e1: 4 + 4 of work and h's tensor in, the sum out: 11), so four blocks
    # would be needed. The other bounds stay at 9 or below
    g = parallel_experts([4.0, 4.0, 2.0], hidden=1.0, expert_out=3.0, head=3.0)
    c = Cluster(name="toy", devices=3, link_bandwidth=1.0)
    assert brute_force(g, c).objective == pytest.approx(11.0)
    res = pair_block_bound(g, c, 3, 5.0)
    assert res.value == pytest.approx(11.0, rel=1e-9)
    assert res.value <= 11.0
    assert len(res.nodes) == 4 and all(len(group) == 1 for group in res.nodes)
    report = certified_lower_bound(g, c, 5.0, 3, ideals=False)
    assert report.binding == "pair block"
    others = [v for name, v in report.bounds.items() if name != "pair block"]
    assert max(others) <= 9.0 + 1e-6


def test_pair_block_with_a_target_probes_just_below_it_and_stays_below():
    g = parallel_experts([4.0, 4.0, 2.0], hidden=1.0, expert_out=3.0, head=3.0)
    c = Cluster(name="toy", devices=3, link_bandwidth=1.0)
    res = pair_block_bound(g, c, 3, 5.0, floor=9.0, target=11.0)
    assert 9.0 < res.value <= 11.0
    assert res.value == pytest.approx(11.0, rel=1e-9)


def test_pair_block_claims_nothing_with_as_many_blocks_as_nodes():
    g = parallel_experts([4.0, 4.0, 2.0], hidden=1.0, expert_out=3.0, head=3.0)
    c = Cluster(name="toy", devices=g.n, link_bandwidth=1.0)
    assert pair_block_bound(g, c, g.n, 5.0).value == 0.0


def test_parallel_experts_that_fit_pairwise_but_not_all_together_need_two_blocks(monkeypatch):
    # k = 2, optimum 10 (brute force). Below 10 any two of e1, e2, e3 fit in one block but
    # not all three, and none fits with e0: three blocks. Nodes alone prove only 9
    g = parallel_experts([4.0, 2.0, 2.0, 2.0], hidden=3.0, expert_out=1.0, head=0.0)
    c = Cluster(name="toy", devices=2, link_bandwidth=1.0)
    assert brute_force(g, c).objective == pytest.approx(10.0)
    res = pair_block_bound(g, c, 2, 5.0)
    assert res.value == pytest.approx(10.0, rel=1e-9) and res.value <= 10.0
    experts = {g.node(f"e{i}") for i in range(1, 4)}
    assert set(max(res.nodes, key=len)) == experts
    monkeypatch.setattr(pair_block, "sibling_sets", lambda costs, order: [])
    assert pair_block_bound(g, c, 2, 5.0).value == pytest.approx(9.0, rel=1e-9)
