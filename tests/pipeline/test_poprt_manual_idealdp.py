"""PopRT auto-sharding steps, manual sharding semantics, and the ideal DP against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.pipeline.dp.ideals import enumerate_ideals, ideal_dp
from solver.pipeline.exact.brute import all_assignments, brute_force
from solver.pipeline.heuristics.manual import manual_assignment, parse_sharding, to_sharding_yaml
from solver.pipeline.heuristics.poprt import (
    PoprtOptions,
    build_subgraphs,
    candidate_nodes,
    first_split,
    format_sharding,
    poprt,
)
from tests.conftest import problems, scaled_examples


def three_branches(bytes_=(1, 1, 1, 1, 1, 1, 1, 1, 1), flops=None):
    """The seed's example: candidates Op1, Op2, Op7 with subgraphs [Op1, Op0, Op4],
    [Op2, Op5, Op6], [Op7, Op3, Op8]."""
    names = ["x"] + [f"Op{i}" for i in range(9)]
    ix = {n: i for i, n in enumerate(names)}
    edges = [
        ("x", "Op0"),
        ("x", "Op4"),
        ("Op0", "Op1"),
        ("Op4", "Op1"),
        ("Op1", "Op5"),
        ("Op1", "Op6"),
        ("Op5", "Op2"),
        ("Op6", "Op2"),
        ("Op2", "Op3"),
        ("Op2", "Op8"),
        ("Op3", "Op7"),
        ("Op8", "Op7"),
    ]
    flops = flops or [1.0] * 9
    params = [(f"w{i}", float(b), [ix[f"Op{i}"]]) for i, b in enumerate(bytes_) if b]
    return Graph.build(
        names,
        [0.0] + list(flops),
        [4.0] * 10,
        [(ix[a], ix[b]) for a, b in edges],
        params=params,
        flops=[0.0] + list(flops),
        op_types=["Input"] + ["Op"] * 9,
    )


def test_candidates_and_subgraphs_of_the_seed_example():
    g = three_branches()
    assert [g.names[c] for c in candidate_nodes(g)] == ["Op1", "Op2", "Op7"]
    sg = build_subgraphs(g)
    got = [sorted(g.names[v] for v in m) for m in sg.nodes]
    # equal costs: nobody is below the averages; the model input (a zero-cost source node in
    # our graphs) goes with the first walk that reaches it
    assert got == [["Op0", "Op1", "Op4", "x"], ["Op2", "Op5", "Op6"], ["Op3", "Op7", "Op8"]]
    assert sg.parents[1] == {0} and sg.parents[2] == {1}
    assert sg.ancestors[2] == 0b011 and sg.descendants[0] == 0b110  # bitsets


def test_small_candidates_merge_into_the_next():
    # Op2's subgraph has little weight: below the average bytes, it is dropped and its nodes
    # go to Op7's walk
    g = three_branches(bytes_=(10, 10, 1, 1, 10, 1, 1, 10, 10))
    sg = build_subgraphs(g)
    got = [sorted(g.names[v] for v in m) for m in sg.nodes]
    assert got[0] == ["Op0", "Op1", "Op4", "x"]
    assert got[1] == ["Op2", "Op3", "Op5", "Op6", "Op7", "Op8"]
    assert sg.candidate[1] == g.index["Op7"]


def test_first_split_balances_bytes():
    # subgraph bytes 30 and 24: the running sum reaches 54 / 2 after the first one
    g = three_branches(bytes_=(10, 10, 1, 1, 10, 1, 1, 10, 10))
    sg = build_subgraphs(g)
    assert sg.bytes.tolist() == [30.0, 24.0]
    assert first_split(sg, 2) == (0, 1)
    assert first_split(sg, 1) == (0, 0)
    # three equal subgraphs over 3 devices: one each
    sg3 = build_subgraphs(three_branches())
    assert first_split(sg3, 3) == (0, 1, 2)


def test_out_of_memory_group_moves_a_boundary_subgraph():
    # a chain with skip edges: candidates n2, n4, n6 with equal bytes and FLOPs survive the
    # merge; subgraphs s0 = {n0, n1, n2}, s1 = {n3, n4}, s2 = {n5, n6}, remained s3 = {n7}
    edges = [(i, i + 1) for i in range(7)] + [(0, 2), (2, 4), (4, 6)]
    work = [1, 1, 1, 1.5, 1.5, 1.5, 1.5, 1]
    params = [(f"w{i}", 20.0, [i]) for i in (2, 4, 6, 7)]
    act = [0.0] * 8
    act[4] = 10.0  # n4's working set
    g = Graph.build([f"n{i}" for i in range(8)], work, [1.0] * 8, edges, params=params, act=act)
    c = Cluster("t", 3, capacity=45.0)
    sg = build_subgraphs(g)
    assert [len(m) for m in sg.nodes] == [3, 2, 2, 1]
    split = first_split(sg, 3)
    assert split == (0, 0, 1, 2)
    first = evaluate(g, c, np.asarray(split)[sg.of_node])
    assert first.params[0] + first.peak[0] == 50.0  # over the capacity of 45
    a, info = poprt(g, c, PoprtOptions())
    assert not validate(g, c, a)  # moves fixed it: s1 to device 1, s2 to device 2
    assert info["groupings_explored"] > 1 and info["activation_share"] == 1.0
    assert a.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert (
        format_sharding(info["sharding_nodes"])
        == "Sharding nodes: Device 0 - ['n2']; Device 1 - ['n4']"
    )


def test_memory_share_fallback_when_everything_overflows():
    g = Graph.build(
        ["a", "b"], [1, 1], [1, 1], [(0, 1)], params=[("w", 10, [0, 1])], act=[100.0, 100.0]
    )
    c = Cluster("t", 2, capacity=50.0)
    a, info = poprt(g, c)
    assert info["activation_share"] == pytest.approx(0.3)  # 10 + 0.3 * 100 fits in 50


# ---------------------------------------------------------------- manual sharding
def test_manual_sharding_claims_ancestors_and_leftovers():
    g = three_branches()
    pts = parse_sharding([{"node": "Op1", "device": 0}, {"node": "Op2", "device": 1, "stage": 1}])
    dev, stage = manual_assignment(g, pts)
    by = {g.names[v]: int(dev[v]) for v in range(g.n)}
    assert by["Op0"] == by["Op4"] == by["x"] == by["Op1"] == 0
    assert by["Op5"] == by["Op6"] == by["Op2"] == 1
    assert by["Op3"] == by["Op7"] == by["Op8"] == 2  # leftovers: largest device + 1
    assert stage.max() == 2


def test_manual_errors():
    g = three_branches()
    with pytest.raises(MtppError, match="no node named 'Op99'"):
        manual_assignment(g, parse_sharding([{"node": "Op99", "device": 0}]))
    with pytest.raises(MtppError, match="earlier stage"):
        manual_assignment(
            g,
            parse_sharding(
                [{"node": "Op1", "device": 0, "stage": 1}, {"node": "Op2", "device": 1, "stage": 0}]
            ),
        )
    with pytest.raises(MtppError, match="unknown key 'devise'"):
        parse_sharding([{"node": "Op1", "device": 0, "devise": 1}])


@settings(max_examples=scaled_examples(100), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7, features=False), st.integers(0, 2**16))
def test_sharding_yaml_round_trip(prob, seed):
    g, c = prob
    plans = [a for a in all_assignments(g, c.devices)]
    a = plans[np.random.default_rng(seed).integers(len(plans))]
    dev, _ = manual_assignment(g, parse_sharding(yaml.safe_load(to_sharding_yaml(g, a))))
    assert dev.tolist() == a.tolist()


# ---------------------------------------------------------------- ideal DP
def test_ideals_of_a_diamond():
    g = Graph.build(["a", "b", "c", "d"], [1] * 4, [1] * 4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    assert len(enumerate_ideals(g, 100)) == 6  # {}, a, ab, ac, abc, abcd
    with pytest.raises(MtppError, match="more than 5 ideals"):
        enumerate_ideals(g, 5)


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_ideal_dp_equals_brute_force(prob):
    g, c = prob
    cg, labels = coarse_view(g)
    val, a, _ = ideal_dp(cg, c)
    truth = brute_force(g, c)
    if truth is None:
        assert a is None
        return
    assert a is not None and not validate(cg, c, a)
    assert val == pytest.approx(truth.objective, rel=1e-9, abs=1e-12)
    assert evaluate(g, c, a[labels]).objective == pytest.approx(
        truth.objective, rel=1e-9, abs=1e-12
    )
    assert math.isfinite(val)
