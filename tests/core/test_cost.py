"""The evaluator against hand-computed costs, and validation messages."""

import math

import numpy as np
import pytest
from hypothesis import given, settings

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.pipeline.exact.brute import all_assignments, batch_costs
from tests.conftest import problems, scaled_examples


def diamond():
    #   a -> b -> d,  a -> c -> d ; a multicasts to b and c
    return Graph.build(
        ["a", "b", "c", "d"],
        [1.0, 2.0, 3.0, 4.0],
        [10.0, 20.0, 30.0, 0.0],
        [(0, 1), (0, 2), (1, 3), (2, 3)],
        params=[("w", 100.0, [1, 2]), ("u", 50.0, [3])],
    )


def test_hand_computed_diamond_three_blocks():
    g = diamond()
    c = Cluster("t", 3, link_bandwidth=10.0)
    ev = evaluate(g, c, [0, 1, 2, 2])
    # block 0 {a}: sends a (10 B, once although b and c are in two other blocks)
    # block 1 {b}: receives a, sends b; block 2 {c, d}: receives a and b
    assert ev.bytes_out.tolist() == [10.0, 20.0, 0.0]
    assert ev.bytes_in.tolist() == [0.0, 10.0, 30.0]
    assert ev.work.tolist() == [1.0, 2.0, 7.0]
    assert np.allclose(ev.f, [1 + 1.0, 1.0 + 2 + 2.0, 3.0 + 7])
    assert ev.objective == pytest.approx(10.0)
    # the shared weight w is stored in block 1 and again in block 2
    assert ev.params.tolist() == [0.0, 100.0, 150.0]


def test_multicast_counts_once_in_io_out():
    g = Graph.build(["a", "b", "c"], [0, 0, 0], [7.0, 0, 0], [(0, 1), (0, 2)])
    ev = evaluate(g, Cluster("t", 3, link_bandwidth=1.0), [0, 1, 2])
    assert ev.io_out.tolist() == [7.0, 0.0, 0.0]
    assert ev.io_in.tolist() == [0.0, 7.0, 7.0]


def test_empty_blocks_cost_nothing():
    g = diamond()
    ev = evaluate(g, Cluster("t", 4, link_bandwidth=10.0), [0, 0, 0, 0])
    assert ev.f[1:].tolist() == [0.0, 0.0, 0.0]
    assert ev.f[0] == 10.0
    assert ev.nodes.tolist() == [4, 0, 0, 0]


def test_overflow_and_peak():
    g = diamond()  # act defaults to output + inputs: act(d) = 0 + 20 + 30
    assert g.act.tolist() == [10.0, 30.0, 40.0, 50.0]
    c = Cluster("t", 1, fast_memory=120.0, link_bandwidth=1.0, slow_memory_bandwidth=2.0)
    ev = evaluate(g, c, [0, 0, 0, 0])
    assert ev.peak[0] == 50.0 and ev.params[0] == 150.0
    assert ev.overflow[0] == pytest.approx((150 + 50 - 120) / 2.0)
    assert ev.f[0] == pytest.approx(10 + 40.0)


def test_validation_names_nodes_and_blocks():
    g = diamond()
    c = Cluster("t", 3, capacity=120.0, link_bandwidth=1.0)
    bad = validate(g, c, [1, 0, 2, 2])
    kinds = {v.kind for v in bad}
    assert "order" in kinds and "capacity" in kinds
    msg = next(str(v) for v in bad if v.kind == "order")
    assert "'a' -> 'b'" in msg and "block 1 back to block 0" in msg
    g2 = Graph.build(["a", "b"], [1, 1], [0, 0], [], colocate=[[0, 1]])
    bad = validate(g2, Cluster("t", 2), [0, 1])
    assert [v.kind for v in bad] == ["colocation"]


def test_assignment_errors():
    g = diamond()
    c = Cluster("t", 2)
    with pytest.raises(MtppError, match="assigns 3 nodes"):
        evaluate(g, c, [0, 0, 0])
    with pytest.raises(MtppError, match="node 'c' is assigned to block 5"):
        evaluate(g, c, [0, 0, 5, 0])


def test_lower_bound_is_average_and_single_node():
    g = diamond()
    assert lower_bound(g, Cluster("t", 2)) == pytest.approx(5.0)
    assert lower_bound(g, Cluster("t", 8)) == pytest.approx(4.0)


@settings(max_examples=scaled_examples(150), deadline=None)
@given(problems(max_nodes=6))
def test_evaluator_matches_independent_batched_costs(prob):
    g, c = prob
    A = all_assignments(g, c.devices)
    f, mem = batch_costs(g, c, A, c.devices)
    for row in range(0, len(A), max(1, len(A) // 20)):
        ev = evaluate(g, c, A[row])
        assert np.allclose(ev.f, f[row], rtol=1e-12, atol=1e-12)
        assert np.allclose(ev.params + ev.peak, mem[row])


@settings(max_examples=scaled_examples(100), deadline=None)
@given(problems(max_nodes=6))
def test_every_invalid_plan_is_rejected_with_a_reason(prob):
    g, c = prob
    k = c.devices
    rng = np.random.default_rng(g.n * 31 + k)
    for _ in range(20):
        a = rng.integers(0, k, g.n)
        bad = validate(g, c, a)
        order_ok = np.all(a[g.e_src] <= a[g.e_dst])
        group_ok = all(len(set(a[m])) == 1 for m in g.groups)
        ev = evaluate(g, c, a)
        cap_ok = c.capacity is None or np.all(ev.params + ev.peak <= c.capacity)
        assert (not bad) == (order_ok and group_ok and cap_ok)
        for v in bad:
            assert "block" in str(v)
    assert math.isfinite(lower_bound(g, c))
