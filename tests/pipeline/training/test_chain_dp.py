"""The training DP over the separator chain's ideals (solver/pipeline/training/chain_dp.py):
the same optimum as the DP over every ideal and as brute force on decoder-shaped graphs, a
bound over every placement on two hosts, the exact block terms of chain_ideals, refusals."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster, Topology
from solver.core.cost import evaluate
from solver.core.graph import Graph
from solver.core.training import TrainingSpec, training_cost
from solver.pipeline.dp.chain_ideals import ChainIdeals, ChainIdealsDoNotApply
from solver.pipeline.exact.brute import all_assignments
from solver.pipeline.exact.cpsat_training import solve_training_cpsat
from solver.pipeline.options import SolveOptions
from solver.pipeline.training import chain_dp, exact
from solver.pipeline.training.chain_dp import chain_training_plan
from solver.pipeline.training.exact import TrainingDPDoesNotApply, exact_training_plan
from solver.pipeline.training.solve import CHAIN_BOUND, solve_training
from tests.conftest import scaled_examples

SPECS = [TrainingSpec("gpipe", 3), TrainingSpec("1f1b", 4), TrainingSpec("1f1b", 1)]


def decoder(seed: int, layers: int, fast_memory: float = math.inf) -> tuple[Graph, Cluster]:
    """Separators joined by gaps of one or two parallel branches (chains of 1-2 nodes, a
    tensor sometimes crossing between them), residual tensors that skip a gap, a weight
    shared by nodes of different gaps, random backward work and stash."""
    rng = np.random.default_rng(seed)
    names, work, size, edges = ["s0"], [float(rng.random())], [float(rng.integers(0, 4))], []
    prev, gap_nodes = 0, []
    for lay in range(layers):
        ends = []
        for b in range(int(rng.integers(1, 3))):
            src = prev
            for depth in range(int(rng.integers(1, 3))):
                v = len(names)
                names.append(f"g{lay}{b}{depth}")
                work.append(float(rng.random() * 5))
                size.append(float(rng.integers(0, 5)))
                edges.append((src, v))
                if depth and ends and rng.random() < 0.5:
                    edges.append((ends[0], v))
                gap_nodes.append(v)
                src = v
            ends.append(src)
        s = len(names)
        names.append(f"s{lay + 1}")
        work.append(float(rng.random() * 3))
        size.append(float(rng.integers(0, 4)))
        edges += [(v, s) for v in ends] + [(prev, s)]
        prev = s
    n = len(names)
    params = [("shared", float(rng.integers(1, 6)), sorted(set(rng.choice(gap_nodes, 2).tolist())))]
    params += [(f"w{v}", float(rng.integers(0, 4)), [v]) for v in range(n) if rng.random() < 0.6]
    g = Graph.build(
        names,
        work,
        size,
        edges,
        params=params,
        act=rng.integers(0, 4, n).astype(float).tolist(),
        work_backward=(rng.random(n) * 6).tolist(),
        stash=rng.integers(0, 5, n).astype(float).tolist(),
        name="decoder",
    )
    cluster = Cluster(
        "toy",
        3,
        fast_memory=fast_memory,
        link_bandwidth=float(rng.choice([0.5, 1.0, 2.0])),
        slow_memory_bandwidth=2.0,
    )
    return g, cluster


def _one_stage_memory(g: Graph, cluster: Cluster, spec: TrainingSpec) -> float:
    return training_cost(g, cluster, np.zeros(g.n, int), spec, k=1).stages[0].memory


def _brute(g: Graph, cluster: Cluster, spec: TrainingSpec, k: int) -> float:
    """The least T over every valid plan of at most k blocks (math.inf: none)."""
    best = math.inf
    for a in all_assignments(g, k):
        c = training_cost(g, cluster, a, spec, k=k)
        if c.valid:
            best = min(best, c.iteration_time)
    return best


@settings(max_examples=scaled_examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**31),
    st.integers(1, 4),
    st.sampled_from([None, 0.35, 0.5, 0.8]),
    st.sampled_from(range(len(SPECS))),
    st.booleans(),
)
def test_chain_dp_equals_the_dp_over_every_ideal(seed, layers, tight, which, overflow):
    g, cl = decoder(seed, layers, fast_memory=6.0 if overflow else math.inf)
    spec = SPECS[which]
    cap = None if tight is None else tight * _one_stage_memory(g, cl, spec)
    cl = replace(cl, capacity=cap)
    truth = exact_training_plan(g, cl, 3, spec)
    sol = chain_training_plan(g, cl, 3, spec)
    if truth.assignment is None:
        assert sol.assignment is None and math.isinf(sol.lower)
        return
    assert sol.cost.valid and sol.optimal
    assert sol.value == pytest.approx(truth.value, rel=1e-9, abs=1e-12)
    assert sol.lower <= truth.value
    # a known plan prunes blocks and changes nothing
    again = chain_training_plan(g, cl, 3, spec, upper=truth.value * 1.001)
    assert again.value == pytest.approx(truth.value, rel=1e-9) and again.optimal
    assert again.blocks <= sol.blocks


@settings(max_examples=scaled_examples(15), suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.sampled_from([None, 0.5, 0.8]), st.sampled_from([0, 1]))
def test_chain_dp_equals_brute_force(seed, tight, which):
    g, cl = decoder(seed, 1)
    spec = SPECS[which]
    cap = None if tight is None else tight * _one_stage_memory(g, cl, spec)
    cl = replace(cl, capacity=cap)
    best = _brute(g, cl, spec, 3)
    sol = chain_training_plan(g, cl, 3, spec)
    if math.isinf(best):
        assert sol.assignment is None and math.isinf(sol.lower)
    else:
        assert sol.value == pytest.approx(best, rel=1e-9, abs=1e-12) and sol.optimal


def _two_hosts(cl: Cluster, slow: float) -> Cluster:
    """4 alike devices on two hosts of 2: the cluster's link inside, ``slow`` between."""
    link = (cl.link_bandwidth, 0.0)
    topo = Topology(((0, 1), (2, 3)), ("h0", "h1"), (link, link), (slow, 0.0))
    return replace(cl, devices=4, topology=topo)


@settings(max_examples=scaled_examples(10), suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.sampled_from([None, 0.6]))
def test_on_two_hosts_the_bound_holds_for_every_plan_and_placement(seed, tight):
    g, cl = decoder(seed, 1)
    spec = TrainingSpec("1f1b", 4)
    cap = None if tight is None else tight * _one_stage_memory(g, cl, spec)
    cl = _two_hosts(replace(cl, capacity=cap), slow=0.1 * cl.link_bandwidth)
    k = 3
    best = math.inf
    for a in all_assignments(g, k):
        for devices in itertools.permutations(range(4), k):
            full = np.array([*devices, *sorted(set(range(4)) - set(devices))])
            c = training_cost(g, cl, a, spec, placement=full)
            if c.valid:
                best = min(best, c.iteration_time)
    sol = chain_training_plan(g, cl, k, spec)
    if math.isinf(best):
        assert sol.assignment is None
        return
    assert sol.lower <= best * (1 + 1e-9)
    assert sol.cost.valid and sol.value >= best * (1 - 1e-9)
    again = training_cost(g, cl, sol.assignment, spec, placement=sol.placement)
    assert again.iteration_time == sol.value


@settings(max_examples=scaled_examples(30), suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 3), st.booleans())
def test_block_terms_are_the_evaluators(seed, layers, overflow):
    g, cl = decoder(seed, layers, fast_memory=6.0 if overflow else math.inf)
    chain = ChainIdeals(g, cl, deadline=math.inf)
    members = [chain.assignment([0, r]) == 0 for r in range(chain.count)]
    seen = 0
    for blk in chain.blocks(g.work, math.inf, deadline=math.inf):
        for i, j, w, io, params, peak in zip(
            blk.first, blk.last, blk.work, blk.io, blk.params, blk.peak, strict=True
        ):
            inner, outer = members[i], members[j]
            assert (inner <= outer).all() and (outer & ~inner).any()
            plan = np.where(outer, np.where(inner, 0, 1), 2)
            ev = evaluate(g, cl, plan, k=3)
            assert w == pytest.approx(ev.work[1], rel=1e-12, abs=1e-12)
            assert io / cl.link_bandwidth == pytest.approx(ev.io_in[1] + ev.io_out[1], abs=1e-12)
            assert (params, peak) == (ev.params[1], ev.peak[1])
            seen += 1
    n = chain.count
    assert seen == sum(  # every pair I strictly inside J, priced once
        (members[i] <= members[j]).all() for i in range(n) for j in range(n) if i != j
    )


def test_fits_upto_is_the_models_test_at_the_boundary():
    inflight = np.array([1.0, 2.0, 3.0, 3.0])
    cl = Cluster("c", 4, capacity=10.0)
    static = np.array([4.0, 4.0, 10.0, 11.0, 0.0, 1.0 / 3.0])
    stash = np.array([2.0, 3.0, 0.0, 0.0, 10.0 / 3.0, 3.0])
    fits = chain_dp._fits_upto(static, stash, inflight, cl)
    direct = [
        int((s + inflight * t <= 10.0 * (1 + 1e-12)).sum())
        for s, t in zip(static, stash, strict=True)
    ]
    assert fits.tolist() == direct
    assert direct[:4] == [4, 2, 4, 0]  # 4 + 3 x 2 = 10 fits exactly; 11 > 10 never fits


def test_refusals_name_the_reason():
    g, cl = decoder(1, 2)
    with pytest.raises(TrainingDPDoesNotApply, match="interleaved in-flight counts"):
        chain_training_plan(g, cl, 3, TrainingSpec("interleaved", 4, virtual_stages=2))
    topo = Topology(((0, 1, 2),), ("a",), ((1.0, 0.0),), None, compute=(1.0, 1.0, 2.0))
    with pytest.raises(TrainingDPDoesNotApply, match="the devices differ"):
        chain_training_plan(g, replace(cl, topology=topo), 3, TrainingSpec())
    loose = Graph.build(["a", "b", "c"], [1.0] * 3, [1.0] * 3, [(0, 1), (1, 2)], ordered=[1, 0])
    with pytest.raises(TrainingDPDoesNotApply, match="training chain DP: a data edge is not an"):
        chain_training_plan(loose, cl, 3, TrainingSpec())
    with pytest.raises(ChainIdealsDoNotApply):
        ChainIdeals(g, replace(cl, topology=topo), deadline=math.inf)


def test_solve_runs_the_chain_dp_where_the_dp_over_every_ideal_refuses(monkeypatch):
    g, cl = decoder(7, 4)
    spec = TrainingSpec("1f1b", 4)
    cl = replace(cl, capacity=0.5 * _one_stage_memory(g, cl, spec))
    truth = exact_training_plan(g, cl, 3, spec)
    monkeypatch.setattr(exact, "MAX_IDEALS", 3)  # the DP over every ideal refuses
    plan = solve_training(g, cl, "cpsat", None, SolveOptions(training=spec, time_limit=30))
    assert plan.status == "OPTIMAL"
    assert plan.objective == pytest.approx(truth.value, rel=1e-9)
    certified = plan.stats["bound"]["certified"]
    # the search over M stops once its bound is within STOP_GAP of the plan
    assert truth.value * (1 - 2 * chain_dp.STOP_GAP) <= certified[CHAIN_BOUND] <= truth.value
    assert "3,000" not in plan.stats["training_solve"]["notes"]["training ideal DP"]


@settings(max_examples=scaled_examples(20), suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.sampled_from([0.3, 0.03, 0.003]), st.sampled_from([None, 0.5]))
def test_a_search_stopped_early_keeps_an_honest_bound(seed, stop, tight):
    """Stopping the search over M while intervals are open (here: a loose stopping rule)
    leaves the least open bound, never above the optimum, and a valid plan."""
    g, cl = decoder(seed, 3)
    spec = SPECS[1]
    cap = None if tight is None else tight * _one_stage_memory(g, cl, spec)
    cl = replace(cl, capacity=cap)
    truth = exact_training_plan(g, cl, 3, spec)
    stopped = _with_stop_gap(stop, lambda: chain_training_plan(g, cl, 3, spec))
    if truth.assignment is None:
        assert math.isinf(stopped.lower)
        return
    assert stopped.lower <= truth.value * (1 + 1e-12)
    assert stopped.cost.valid and stopped.value >= truth.value * (1 - 1e-9)
    assert stopped.value <= stopped.lower / (1 - stop) * (1 + 1e-6)


def _with_stop_gap(stop: float, run):
    saved = chain_dp.STOP_GAP
    chain_dp.STOP_GAP = stop
    try:
        return run()
    finally:
        chain_dp.STOP_GAP = saved


@pytest.mark.parametrize("seed", [3, 11, 29])
@pytest.mark.parametrize("hosts", [False, True])
def test_chain_dp_agrees_with_the_cpsat_training_model(seed, hosts):
    """The CP-SAT training model (every plan, every placement) as an independent reference:
    on one host the two optima meet; on two hosts the chain DP's bound is below CP-SAT's
    proven optimum and its placed plan no better than it."""
    g, cl = decoder(seed, 2)
    spec = TrainingSpec("1f1b", 4)
    cl = replace(cl, capacity=0.75 * _one_stage_memory(g, cl, spec))
    if hosts:
        cl = _two_hosts(cl, slow=0.1 * cl.link_bandwidth)
    ref = solve_training_cpsat(g, cl, spec, time_limit=60.0, workers=1)
    sol = chain_training_plan(g, cl, 3 if hosts else cl.devices, spec)
    if ref.infeasible:  # proven by CP-SAT: no plan of up to 4 blocks fits, so none of 3
        assert sol.assignment is None and math.isinf(sol.lower)
        return
    assert ref.optimal
    if hosts:  # CP-SAT ranges over plans of up to 4 blocks; the DP's bound is for 3
        assert sol.cost.valid and sol.value >= ref.iteration_time * (1 - 1e-9)
        return
    assert sol.optimal
    assert sol.value == pytest.approx(ref.iteration_time, rel=1e-6, abs=ref.resolution)
