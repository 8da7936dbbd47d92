"""The spine plan (solver.pipeline.bounds.spine_plan): the nodes the spine relaxation removes
pinned to the node they feed, the exact chain DP on the rest. Its plan is a real plan (valid,
priced by the evaluator) and never below the brute-force optimum; on a hand-built
encoder-decoder it is the optimum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.graph import Graph, coarse_view
from solver.pipeline.bounds.spine import heaviest_path, kept_nodes, spine_spans
from solver.pipeline.bounds.spine_plan import pinned_labels, spine_plan
from solver.pipeline.exact.brute import brute_force
from solver.pipeline.options import Incumbent
from solver.pipeline.registry import with_spine_plan
from tests.conftest import problems, scaled_examples
from tests.pipeline.test_bounds_nonchain import _hand_encoder_decoder, encoder_decoders

TOL = 1e-9


def _check_plan_is_valid_and_not_below_the_optimum(g: Graph, c: Cluster) -> None:
    truth = brute_force(g, c)
    res = spine_plan(g, c, c.devices, 5.0)
    if res is None:
        return
    assert truth is not None  # a plan exists: brute force finds one
    assert validate(g, c, res.assignment, c.devices) == []
    assert evaluate(g, c, res.assignment, c.devices).objective == pytest.approx(res.value)
    assert res.value >= truth.objective * (1 - TOL) - TOL


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_spine_plan_is_a_valid_plan_of_random_graphs(prob):
    _check_plan_is_valid_and_not_below_the_optimum(*prob)


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(encoder_decoders())
def test_spine_plan_is_a_valid_plan_of_encoder_decoders(prob):
    _check_plan_is_valid_and_not_below_the_optimum(*prob)


def test_pinned_labels_merge_each_removed_node_with_the_node_it_feeds():
    # p (beside the encoder) feeds d0, the projection k1 feeds d1: each is merged with it,
    # and the labels stay in a topological order
    g, _ = _hand_encoder_decoder()
    cg, _ = coarse_view(g)
    keep = kept_nodes(spine_spans(cg, heaviest_path(cg)), np.ones(4, dtype=bool))
    labels = pinned_labels(cg, keep)
    groups: dict[int, list[str]] = {}
    for v, lab in enumerate(labels.tolist()):
        groups.setdefault(lab, []).append(cg.names[v])
    assert sorted(groups.values()) == [["e0"], ["e1"], ["k1", "d1"], ["p", "d0"]]
    assert all(labels[u] <= labels[v] for u, v in zip(cg.e_src, cg.e_dst, strict=True))


def test_pinned_labels_merge_the_cycle_a_pin_closes():
    # r feeds q (removed, first) and w (kept); q and w feed t. q is pinned to t, and r with
    # it (through q); then r -> w -> t is a cycle through the merged node: w joins it
    g = Graph.build(
        ["s", "r", "q", "w", "t"],
        [1.0] * 5,
        [1.0, 1.0, 1.0, 1.0, 0.0],
        [(0, 1), (1, 2), (1, 3), (2, 4), (3, 4)],
    )
    cg, _ = coarse_view(g)
    labels = pinned_labels(cg, np.array([True, False, False, True, True]))
    assert labels.tolist() == [0, 1, 1, 1, 1]
    labels = pinned_labels(cg, np.array([True, False, True, True, True]))  # r pinned to q
    assert labels.tolist() == [0, 1, 1, 2, 3]


def test_spine_plan_is_the_optimum_of_a_hand_built_encoder_decoder():
    # pinned: {e0}, {e1}, {p, d0}, {k1, d1}; {e0, e1} | {p, d0} | {k1, d1} costs 8 + 1,
    # 5 + 1 + 1, 5 + 1 + 1: 9, the brute-force optimum
    g, c = _hand_encoder_decoder()
    res = spine_plan(g, c, 3, 5.0)
    assert res is not None and res.pinned == 2
    assert res.value == pytest.approx(9.0) == brute_force(g, c).objective
    blocks = [[g.names[v] for v in np.flatnonzero(res.assignment == b)] for b in range(3)]
    assert blocks == [["e0", "e1"], ["p", "d0"], ["k1", "d1"]]
    # a known plan at the optimum: nothing below it to find
    assert spine_plan(g, c, 3, 5.0, upper=9.0) is None


def test_spine_plan_leaves_clusters_that_differ_and_a_single_block():
    g, c = _hand_encoder_decoder()
    assert spine_plan(g, c, 1, 5.0) is None
    assert spine_plan(g, c.with_devices(3), 3, 0.0) is None  # no time: nothing tried


def test_cpsat_starts_from_the_spine_plan_when_it_beats_the_warm_start():
    g, c = _hand_encoder_decoder()
    worse = Incumbent(12.0, np.zeros(g.n, dtype=np.int64), 0.5)
    inc = with_spine_plan(g, c, 3, worse, 5.0)
    assert inc.objective == pytest.approx(9.0) and inc.seconds >= 0.5
    assert evaluate(g, c, inc.assignment, 3).objective == pytest.approx(9.0)
    kept = with_spine_plan(g, c, 3, inc, 5.0)  # nothing better than 9: the same plan
    assert kept.objective == inc.objective and kept.assignment is inc.assignment
    assert kept.seconds >= inc.seconds
