"""The decision bound with forced io (solver.pipeline.bounds.forced_io and
decision.decision_io_bound): in every plan whose blocks all cost at most T, every block's io
covers the charges of its nodes; the bound never exceeds the brute-force optimum; exact
values on a hand-built graph; it proves more than the universal bound on a layered DAG."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound
from solver.core.graph import Graph, coarse_view
from solver.frontends.workloads import layered_dag
from solver.pipeline.bounds import certified_lower_bound
from solver.pipeline.bounds.decision import decision_io_bound
from solver.pipeline.bounds.forced_io import forced_io, reach_bits
from solver.pipeline.bounds.items import items
from solver.pipeline.exact.brute import all_assignments, brute_force
from tests.conftest import problems, scaled_examples

TOL = 1e-9


def _hull_cost(g: Graph, cluster: Cluster, p: int, c: int) -> float:
    """The work of every node on an order path between p and c (found by walking the
    graph), plus the overflow of the weights charged to them with the larger act of p, c."""
    anc, desc = reach_bits(g, False), reach_bits(g, True)
    bits = (desc[p] & anc[c]) | (desc[c] & anc[p]) | (1 << p) | (1 << c)
    hull = [v for v in range(g.n) if bits >> v & 1]
    first = {int(g.p_users[g.p_ptr[q]]): 0.0 for q in range(g.num_params)}
    for q in range(g.num_params):
        first[int(g.p_users[g.p_ptr[q]])] += float(g.p_size[q])
    held = sum(first.get(v, 0.0) for v in hull)
    peak = max(float(g.act[p]), float(g.act[c]))
    over = 0.0
    if math.isfinite(cluster.fast_memory):
        over = max(0.0, held + peak - cluster.fast_memory) / cluster.slow_memory_bandwidth
    return float(sum(g.work[v] for v in hull)) + over


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7, max_k=3))
def test_every_block_pays_its_nodes_charges(problem):
    """For every valid plan, at T = its bottleneck (so every block costs at most T), each
    block's io_in + io_out is at least the charges of its coarse nodes."""
    g, cluster = problem
    if not cluster.homogeneous:
        return
    cg, labels = coarse_view(g)
    fio = forced_io(cg, cluster)
    if fio is None:
        return
    assert_charges_within_block_io(g, cluster, labels, fio.charges)


def assert_charges_within_block_io(g: Graph, cluster: Cluster, labels, charges_at) -> None:
    """In every plan (brute force over all assignments) of bottleneck T, the charges
    ``charges_at(T)`` of each block's coarse nodes (``labels``: node -> coarse node) add up to
    at most that block's io_in + io_out."""
    for a in all_assignments(g, cluster.devices):
        ev = evaluate(g, cluster, a)
        charges = charges_at(float(ev.f.max()))
        blocks = np.zeros(len(charges), dtype=np.int64)
        blocks[labels] = a
        paid = np.bincount(blocks, charges, minlength=cluster.devices)
        assert np.all(paid <= (ev.io_in + ev.io_out) * (1 + TOL) + TOL)


@settings(max_examples=scaled_examples(100), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7, max_k=3))
def test_hulls_are_the_heaviest_over_consumers(problem):
    """Each tensor's hull cost is the largest of its (producer, consumer) hull costs, walked
    by hand."""
    g, cluster = problem
    cg, _ = coarse_view(g)
    fio = forced_io(cg, cluster)
    if fio is None:
        return
    for h, p, c in zip(fio.hull, fio.sender, fio.receiver, strict=True):
        assert h == pytest.approx(_hull_cost(cg, cluster, int(p), int(c)), rel=1e-12, abs=1e-12)
        tensors = np.flatnonzero(cg.t_producer == p)
        hulls = [
            _hull_cost(cg, cluster, int(p), int(x))
            for t in tensors
            for x in cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]]
            if x != p
        ]
        assert h <= max(hulls) * (1 + 1e-12) + 1e-12


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7, max_k=3))
def test_decision_io_bound_at_most_brute_force(problem):
    g, cluster = problem
    if not cluster.homogeneous:
        return
    best = brute_force(g, cluster)
    cg, _ = coarse_view(g)
    fio = forced_io(cg, cluster)
    if best is None or fio is None:
        return
    k = cluster.devices
    for lo in (0.0, lower_bound(g, cluster, k)):
        value = decision_io_bound(items(g), fio, cluster, k, 2.0, lo)
        assert value <= best.objective * (1 + 1e-9) + 1e-12


def _skip_chain() -> tuple[Graph, Cluster]:
    """a -> b -> c -> d, each work 2, and a's tensor (2 bytes) also read by d; b's and c's
    tensors 0.5 bytes; link 1 B/s, no memory limit."""
    g = Graph.build(
        ["a", "b", "c", "d"],
        np.full(4, 2.0),
        np.array([2.0, 0.5, 0.5, 0.0]),
        [(0, 1), (1, 2), (2, 3), (0, 3)],
        name="skip",
    )
    return g, Cluster("toy", 2, fast_memory=math.inf, link_bandwidth=1.0)


def test_skip_tensor_is_charged_to_both_ends():
    """Below T = 8 (the hull of a and d is the whole chain) a's tensor is forced: a and d pay
    2 s each, so the volume 8 + 4 over 2 blocks proves every T below 6 (the universal bound is
    d's neighbourhood, 4.5); the optimum is 6.5 ({a, b} | {c, d}: 4 s of work, 2.5 s of io)."""
    g, cluster = _skip_chain()
    fio = forced_io(coarse_view(g)[0], cluster)
    assert fio.charges(7.9).tolist() == [2.0, 0.0, 0.0, 2.0]
    assert fio.charges(8.0).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert lower_bound(g, cluster, 2) == pytest.approx(4.5)
    value = decision_io_bound(items(g), fio, cluster, 2, 2.0)
    assert value == pytest.approx(6.0, rel=1e-4)
    assert value <= 6.0
    assert brute_force(g, cluster).objective == pytest.approx(6.5)


def test_layered_dag_proves_more_than_the_universal_bound():
    """On a 600-node layered DAG at k = 16 the skip tensors (read far from their producer)
    are forced, and the certified report names the bound with its value above the universal
    bound."""
    g = layered_dag(600, seed=3)
    cluster = Cluster("ipu", 16, fast_memory=math.inf, link_bandwidth=64e9)
    rep = certified_lower_bound(g, cluster, time_limit=6.0, ideals=False)
    assert rep.bounds["decision io"] > rep.bounds["universal"] * (1 + 1e-3)
    assert rep.binding == "decision io"


def test_hulls_past_their_deadline_give_nothing():
    """The hulls stop at their deadline (the bound is then skipped, never guessed)."""
    g = layered_dag(200, seed=1)
    cluster = Cluster("ipu", 8, fast_memory=math.inf, link_bandwidth=64e9)
    assert forced_io(coarse_view(g)[0], cluster, deadline=0.0) is None
    assert forced_io(coarse_view(g)[0], cluster) is not None
