"""The io density bound (solver.pipeline.bounds.io_density): each cut is the least
io + mu * work over the sets holding its node (brute force over every set), in every plan
whose blocks all cost at most T each block's io covers its nodes' charges (every valid plan of
small random graphs), the bound never exceeds the brute-force optimum, and on a 100-node
layered DAG at k = 16 it proves more than the decision io bound (which proves more than the
universal bound there)."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings

from solver.core.cluster import Cluster
from solver.core.cost import lower_bound
from solver.core.graph import Graph, coarse_view
from solver.frontends.workloads import layered_dag
from solver.pipeline.bounds.decision import decision_io_bound
from solver.pipeline.bounds.forced_io import forced_io
from solver.pipeline.bounds.io_density import io_density, io_density_bound, singleton_density
from solver.pipeline.bounds.items import items
from solver.pipeline.exact.brute import brute_force
from tests.conftest import problems, scaled_examples
from tests.pipeline.test_bounds_decision_io import assert_charges_within_block_io

TOL = 1e-9


def set_io(g: Graph, members: set[int], bandwidth: float) -> float:
    """io_in + io_out of a node set, walked tensor by tensor (each tensor once per side)."""
    total = 0.0
    for t in range(g.num_tensors):
        ends = {int(g.t_producer[t]), *g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]].tolist()}
        if len(ends) > 1 and 0 < len(ends & members) < len(ends):
            total += float(g.t_size[t]) / bandwidth
    return total


def cheapest_set(g: Graph, v: int, mu: float, bandwidth: float) -> float:
    """min over node sets S holding v of io(S) + mu * work(S), by enumeration."""
    others = [u for u in range(g.n) if u != v]
    best = math.inf
    for r in range(len(others) + 1):
        for extra in itertools.combinations(others, r):
            s = {v, *extra}
            best = min(best, set_io(g, s, bandwidth) + mu * float(g.work[list(s)].sum()))
    return best


@settings(max_examples=scaled_examples(30), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6, max_k=3))
def test_cuts_are_the_cheapest_sets(problem):
    """Every cut is at most the cheapest set found by enumeration, and within the rounding of
    the integer capacities of it; and at most its set {v} alone."""
    g, cluster = problem
    if not cluster.homogeneous:
        return
    cg, _ = coarse_view(g)
    dens = io_density(cg, cluster)
    assert dens.complete
    # the sets {v} alone: an upper end of every cut (what the bounds check before cutting)
    assert np.all(dens.cuts <= singleton_density(cg, cluster).cuts * (1 + TOL) + TOL)
    for v in range(cg.n):
        for j, mu in enumerate(dens.mus.tolist()):
            exact = cheapest_set(cg, v, mu, cluster.link_bandwidth)
            assert dens.cuts[v, j] <= exact * (1 + TOL) + TOL
            assert dens.cuts[v, j] >= exact * (1 - 1e-6) - 1e-9


@settings(max_examples=scaled_examples(80), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7, max_k=3))
def test_every_block_pays_its_nodes_charges(problem):
    """For every valid plan, at T = its bottleneck (every block costs at most T), each
    block's io_in + io_out is at least the density charges of its coarse nodes."""
    g, cluster = problem
    if not cluster.homogeneous:
        return
    cg, labels = coarse_view(g)
    assert_charges_within_block_io(g, cluster, labels, io_density(cg, cluster).charges)


@settings(max_examples=scaled_examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7, max_k=3))
def test_io_density_bound_at_most_brute_force(problem):
    g, cluster = problem
    if not cluster.homogeneous:
        return
    best = brute_force(g, cluster)
    if best is None:
        return
    cg, _ = coarse_view(g)
    dens = io_density(cg, cluster)
    k = cluster.devices
    for lo in (0.0, lower_bound(g, cluster, k)):
        value = io_density_bound(items(g), dens, cluster, k, 2.0, lo)
        assert value <= best.objective * (1 + 1e-9) + 1e-12


def test_layered_dag_proves_more_than_decision_io():
    """On a 100-node layered DAG at k = 16 every block pays io to its neighbours, which no
    other bound prices: the io density binds, above the decision io bound."""
    g = layered_dag(100, seed=0)
    cluster = Cluster("ipu", 16, fast_memory=math.inf, link_bandwidth=64e9)
    cg, it = coarse_view(g)[0], items(g)
    universal = lower_bound(g, cluster, 16)
    decision = decision_io_bound(it, forced_io(cg, cluster), cluster, 16, 5.0, universal)
    density = io_density_bound(it, io_density(cg, cluster), cluster, 16, 5.0, universal)
    assert density > decision * (1 + 5e-3)
    assert decision > universal


def test_cuts_past_their_deadline_are_zero():
    """Cuts the clock stopped are zero (no charge), never guessed; larger graphs skip."""
    cluster = Cluster("ipu", 8, fast_memory=math.inf, link_bandwidth=64e9)
    cg = coarse_view(layered_dag(60, seed=1))[0]
    late = io_density(cg, cluster, deadline=0.0)
    assert not late.complete and not late.cuts.any()
    assert not late.charges(1e-3).any()
    assert io_density(coarse_view(layered_dag(500, seed=1))[0], cluster) is None
