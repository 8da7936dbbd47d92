"""Graph construction, errors naming the node, queries, and exact contraction."""

import numpy as np
import pytest
from hypothesis import given, settings

from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view, contract, induced_subgraph
from solver.frontends import native
from solver.pipeline.exact.brute import all_assignments
from tests.conftest import problems, scaled_examples


def chain(n=4):
    return Graph.build(
        [f"n{i}" for i in range(n)],
        np.arange(n, dtype=float),
        np.ones(n),
        [(i, i + 1) for i in range(n - 1)],
    )


def test_cycle_is_rejected_with_node_name():
    with pytest.raises(MtppError, match="cycle through node"):
        Graph.build(["a", "b", "c"], [1, 1, 1], [0, 0, 0], [(0, 1), (1, 2), (2, 0)])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"work": [1, -1]}, "node 'b': work must be finite and >= 0"),
        ({"work": [1, float("nan")]}, "node 'b': work must be finite"),
        ({"sizeout": [float("inf"), 0]}, "node 'a': sizeout must be finite"),
        ({"edges": [(0, 5)]}, "outside 0..1"),
        ({"edges": [(1, 1)]}, "node 'b' to itself"),
        ({"names": ["a", "a"]}, "'a' appears more than once"),
        ({"work": [1, True]}, "node 'b': work must be a number, got True"),
        ({"work": ["1", 1]}, "node 'a': work must be a number, got '1'"),
        ({"sizeout": [0, None]}, "node 'b': sizeout must be a number, got None"),
        ({"work": [1, 10**400]}, "work: expected one number per node"),
        ({"edges": [(0, 10**400)]}, "edges must be pairs of node indices"),
        ({"edges": [(0, "b")]}, "edges must be pairs of node indices"),
    ],
)
def test_bad_graphs_name_the_problem(kwargs, match):
    args = {"names": ["a", "b"], "work": [1, 1], "sizeout": [0, 0], "edges": [(0, 1)]}
    args.update(kwargs)
    with pytest.raises(MtppError, match=match):
        Graph.build(args["names"], args["work"], args["sizeout"], args["edges"])


@pytest.mark.parametrize(
    "param, match",
    [
        (("w", 10**400, [0]), "bytes must be finite and >= 0, got 1000"),
        (("w", True, [0]), "bytes must be finite and >= 0, got True"),
        (("w", "8", [0]), "bytes must be finite and >= 0, got '8'"),
        (("w", 8, [10**400]), "users must be node indices"),
    ],
)
def test_bad_parameters_are_refused(param, match):
    with pytest.raises(MtppError, match=match):
        Graph.build(["a", "b"], [1, 1], [0, 0], [(0, 1)], params=[param])


def test_queries():
    g = Graph.build(["a", "b", "c", "d"], [1] * 4, [1] * 4, [(0, 1), (1, 2), (0, 3)])
    assert g.ancestors(2).tolist() == [0, 1]
    assert g.descendants(0).tolist() == [1, 2, 3]
    assert g.topo_order.tolist() == [0, 1, 2, 3]
    assert g.node("c") == 2
    with pytest.raises(MtppError, match="no node named 'zz'"):
        g.node("zz")
    sub = induced_subgraph(g, [1, 2])
    assert sub.names == ("b", "c") and sub.m == 1


def test_shared_weight_is_one_entity():
    g = Graph.build(["a", "b"], [1, 1], [0, 0], [(0, 1)], params=[("w", 10, [0, 1])])
    assert g.num_params == 1 and g.param_bytes_total == 10


def test_colocation_merges_cycles_it_creates():
    # a -> b -> c with a and c co-located: b must join them
    g = Graph.build(["a", "b", "c"], [1, 1, 1], [1, 1, 1], [(0, 1), (1, 2)], colocate=[[0, 2]])
    cg, labels = coarse_view(g)
    assert cg.n == 1 and len(set(labels.tolist())) == 1


@settings(max_examples=scaled_examples(80), deadline=None)
@given(problems(max_nodes=6))
def test_contraction_is_exact(prob):
    g, c = prob
    cg, labels = coarse_view(g)
    for a in all_assignments(cg, c.devices)[:30]:
        orig = evaluate(g, c, a[labels])
        coarse = evaluate(cg, c, a)
        assert np.allclose(orig.f, coarse.f) and np.allclose(orig.params, coarse.params)
    # contracting with identity labels changes nothing
    ident = contract(g, np.arange(g.n))
    a = np.zeros(g.n, dtype=int)
    assert np.allclose(evaluate(ident, c, a).f, evaluate(g, c, a).f)


@settings(max_examples=scaled_examples(50), deadline=None)
@given(problems(max_nodes=6))
def test_native_json_round_trip(prob):
    g, c = prob
    g2 = native.from_dict(native.to_dict(g))
    assert g2.names == g.names and g2.fingerprint == g.fingerprint
    for a in all_assignments(g, c.devices)[:10]:
        assert np.allclose(evaluate(g, c, a).f, evaluate(g2, c, a).f)
    assert [m.tolist() for m in g2.groups] == [m.tolist() for m in g.groups]
