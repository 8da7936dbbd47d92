"""The group-labelled chain bound (solver/pipeline/bounds/chain_groups.py) on clusters of groups
with a
slow link between them: never above the optimum over every plan and every placement (brute
force), exact on a hand-checked chain where the relaxation's bounds are not."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster, Topology
from solver.core.graph import Graph
from solver.pipeline.bounds.chain_groups import group_chain_bound
from solver.pipeline.bounds.topology import topology_bound
from solver.pipeline.exact.brute import brute_force
from solver.pipeline.registry import certified_bound
from tests.conftest import problems, scaled_examples

TOL = 1e-9


def two_groups(rng: np.random.Generator, base: Cluster, devices: int) -> Cluster:
    """``base``'s memory on ``devices`` devices in two groups, each with its own inside link,
    joined by a link that is usually the slowest; devices of mixed compute and fast memory."""
    cut = int(rng.integers(1, devices))
    inside = [float(rng.choice([2.0, 4.0, 8.0])) for _ in range(2)]
    fast = base.fast_memory
    topo = Topology(
        (tuple(range(cut)), tuple(range(cut, devices))),
        ("h0", "h1"),
        ((inside[0], 0.0), (inside[1], 0.0)),
        (float(rng.choice([0.25, 0.5, 1.0, 4.0])), 0.0),
        fast_memory=tuple(
            fast if math.isinf(fast) else fast * float(rng.choice([1.0, 2.0]))
            for _ in range(devices)
        ),
        compute=tuple(float(rng.choice([1.0, 2.0])) for _ in range(devices)),
    )
    return Cluster(
        "two-groups",
        devices,
        fast_memory=fast,
        compute=1.0,
        slow_memory_bandwidth=base.slow_memory_bandwidth,
        topology=topo,
    )


@settings(max_examples=scaled_examples(80), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6), st.integers(2, 4), st.integers(0, 2**32 - 1))
def test_group_chain_is_below_the_optimum_over_every_plan_and_placement(prob, devices, seed):
    g, base = prob
    c = two_groups(np.random.default_rng(seed), base, devices)
    truth = brute_force(g, c)
    if truth is None:
        return  # no plan fits a capacity: nothing to bound
    for memory in (False, True):
        val = group_chain_bound(g, c, 0.0, 1.0, memory=memory)
        assert val <= truth.objective * (1 + TOL) + TOL, memory
    assert topology_bound(g, c, 1.0).value <= truth.objective * (1 + TOL) + TOL


def chain_on_two_servers() -> tuple[Graph, Cluster]:
    """4 layers in a chain (work 2 s, 1-byte outputs) on 2 + 2 devices: 100 B/s inside a
    group, 0.25 B/s between. Plans inside one group use 2 devices (two layers each: 4 + 0.01
    s); a plan on both groups has a block receiving 1 byte over the slow link (4 s) plus a
    layer (2 s). So the optimum is 4.01 s, while with every link fast (the relaxation) one
    layer per device costs 2.02 s."""
    g = Graph.build(
        [f"l{i}" for i in range(4)], [2.0] * 4, [1.0] * 4, [(i, i + 1) for i in range(3)]
    )
    topo = Topology(((0, 1), (2, 3)), ("a", "b"), ((100.0, 0.0), (100.0, 0.0)), (0.25, 0.0))
    return g, Cluster("two-servers", 4, compute=1.0, topology=topo)


def test_slow_link_between_groups_lifts_the_bound_to_the_optimum():
    g, c = chain_on_two_servers()
    assert brute_force(g, c).objective == 4.01
    rep = certified_bound(g, c, 2.0)
    relaxed = max(v for name, v in rep.bounds.items() if not name.startswith("group"))
    assert relaxed == 2.02 or abs(relaxed - 2.02) < 1e-5  # the flat optimum, at most
    assert rep.binding == "group work io chain"
    assert 4.01 * (1 - 1e-5) <= rep.value <= 4.01


def test_a_fast_link_between_groups_changes_nothing():
    """With ``between`` as fast as the inside links the labelled chain is the flat one: 2.02."""
    g, c = chain_on_two_servers()
    topo = Topology(((0, 1), (2, 3)), ("a", "b"), ((100.0, 0.0), (100.0, 0.0)), (100.0, 0.0))
    fast = Cluster("flat-ish", 4, compute=1.0, topology=topo)
    assert abs(group_chain_bound(g, fast, 0.0, 1.0) - 2.02) < 1e-5
    assert abs(group_chain_bound(g, c, 0.0, 1.0) - 4.01) < 1e-5


def test_group_counts_bound_the_blocks_per_group():
    """Three groups of one device and an infinitely slow link: no plan may cross, so one
    device holds all 4 layers (8 s); the chain may use one bin per group only."""
    g, _ = chain_on_two_servers()
    topo = Topology(((0,), (1,), (2,)), ("a", "b", "c"), ((1.0, 0.0),) * 3, (1e-6, 0.0))
    c = Cluster("three", 3, compute=1.0, topology=topo)
    assert brute_force(g, c).objective == 8.0
    assert abs(group_chain_bound(g, c, 0.0, 1.0) - 8.0) < 1e-5


@st.composite
def residual_chains(draw):
    """A chain of separators with parallel branches between some of them and skip edges
    (residuals), so that chains have gaps, gap cuts and separator-to-separator tensors."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(4, 7))
    names, edges, last = [], [], None
    while len(names) < n:
        v = len(names)
        names.append(f"v{v}")
        if last is not None and rng.random() < 0.6 and len(names) + 1 < n:
            # one or two parallel branch nodes between last and the next separator w
            width = 2 if len(names) + 2 < n and rng.random() < 0.5 else 1
            branch = list(range(v, v + width))
            w = v + width
            names += [f"v{u}" for u in range(v + 1, w + 1)]
            edges += [(last, u) for u in branch] + [(u, w) for u in branch]
            if rng.random() < 0.5:
                edges.append((last, w))  # a residual around the branch
            last = w
            continue
        if last is not None:
            edges.append((last, v))
        last = v
    work = rng.integers(1, 6, n).astype(float)
    size = rng.integers(0, 5, n).astype(float)
    return Graph.build(names, work, size, edges, name="residual")


@settings(max_examples=scaled_examples(80), suppress_health_check=[HealthCheck.too_slow])
@given(residual_chains(), st.integers(3, 4), st.integers(0, 2**32 - 1))
def test_group_chain_on_residual_chains_is_below_the_optimum(g, devices, seed):
    base = Cluster("base", devices, slow_memory_bandwidth=1.0)
    c = two_groups(np.random.default_rng(seed), base, devices)
    truth = brute_force(g, c).objective
    assert group_chain_bound(g, c, 0.0, 1.0) <= truth * (1 + TOL) + TOL
