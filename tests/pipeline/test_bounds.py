"""Certified lower bounds (solver.pipeline.bounds): never above the brute-force optimum, and tight
where
the universal averaging bound is not (exact values on hand-checked instances)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import llama
from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.graph import Graph, coarse_view
from solver.frontends import load_graph, resolve_cluster
from solver.pipeline.bounds import certified_lower_bound
from solver.pipeline.bounds.chain import bins_needed, chain_bound, work_chain_bound
from solver.pipeline.bounds.chain_io import Chain, bins_needed_io, chain_io_bound, gap_subset_sums
from solver.pipeline.bounds.decision import decision_bound, work_packing_bound
from solver.pipeline.bounds.items import items
from solver.pipeline.bounds.node_block import (
    cut_network,
    min_block_cost,
    node_block_bound,
    own_overflow,
)
from solver.pipeline.bounds.packing import cannot_pack, smallest_capacity
from solver.pipeline.bounds.weights import capacity_infeasible, least_work_for_bytes, weights_bound
from solver.pipeline.dp.separators import separators
from solver.pipeline.exact.brute import brute_force
from tests.conftest import KNOWN_OPTIMA, ROOT, bench_path, problems, scaled_examples

TOL = 1e-9


def _all_bounds(g, c):
    it = items(g)
    k = c.devices
    return {
        "weights": weights_bound(it, c, k, 0.5),
        "decision": decision_bound(it, c, k, 0.5),
        "work packing": work_packing_bound(it, k, 0.3),
        "chain": chain_bound(g, it, c, k),
        "work chain": work_chain_bound(g, it, k),
        "chain io": chain_io_bound(g, it, c, k, 0.0, 2.0),
        "work io chain": chain_io_bound(g, it, c, k, 0.0, 2.0, memory=False),
    }


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_every_bound_is_below_the_brute_force_optimum(prob):
    g, c = prob
    truth = brute_force(g, c)
    if capacity_infeasible(items(g), c, c.devices, 0.5):
        assert truth is None  # a proof that no plan fits must be right
        return
    if truth is None:
        return
    for name, val in _all_bounds(g, c).items():
        assert val <= truth.objective * (1 + TOL) + TOL, name


@settings(max_examples=scaled_examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_chain_io_bounds_are_below_the_brute_force_optimum(prob):
    g, c = prob
    truth = brute_force(g, c)
    if truth is None:
        return
    it = items(g)
    for memory in (True, False):
        val = chain_io_bound(g, it, c, c.devices, 0.0, 2.0, memory=memory)
        assert val <= truth.objective * (1 + TOL) + TOL, memory


def test_gap_cut_charges_the_cheapest_cut_inside_a_layer():
    # s0 -> {a, b} -> s1: splitting between s0 and s1 sends a's and b's outputs (3 + 3) or
    # s0's output (2, consumed only inside the gap): the cheapest cut is 2 bytes
    g = Graph.build(
        ["s0", "a", "b", "s1"],
        [4.0, 4.0, 4.0, 4.0],
        [2.0, 3.0, 3.0, 0.0],
        [(0, 1), (0, 2), (1, 3), (2, 3)],
    )
    c = Cluster("toy", 2, link_bandwidth=1.0)
    ch = Chain(g, items(g).work, np.zeros(4), 1.0)
    assert ch.m == 2 and ch.cut.tolist() == [0.0, 2.0, 0.0]
    # best plan {s0, a} | {b, s1}: 8 + 2 + 3 on both sides; a boundary inside the gap pays
    # its interior cut (2 + 3, tests/pipeline/test_bounds_gap_io.py), so the chain proves it
    # (with the 2-byte cut alone it split the gap freely: (16 + 2 * 2) / 2 = 10)
    assert brute_force(g, c).objective == pytest.approx(13.0)
    assert chain_io_bound(g, items(g), c, 2, 0.0, 5.0, memory=False) == pytest.approx(13.0, 1e-5)
    assert work_chain_bound(g, items(g), 2) == pytest.approx(8.0, rel=1e-6)


@settings(max_examples=scaled_examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=6))
def test_certified_bound_is_the_largest_and_valid(prob):
    g, c = prob
    rep = certified_lower_bound(g, c, time_limit=0.5)
    truth = brute_force(g, c)
    if rep.infeasible:
        assert truth is None and rep.binding == "capacity"
        return
    assert rep.value == max(rep.bounds.values()) == rep.bounds[rep.binding]
    assert rep.bounds["universal"] == pytest.approx(lower_bound(g, c))
    if truth is not None:
        assert rep.value <= truth.objective * (1 + TOL) + TOL


# ---------------------------------------------------------------------- packing engine
def test_cannot_pack_proves_only_true_infeasibility():
    # three items of 6 into two bins of 10: volume fits (18 <= 20) but no bin holds two
    six = np.full(3, 6.0)
    assert cannot_pack(six, np.zeros(3), 10.0, 2, time_limit=5.0)
    assert not cannot_pack(six, np.zeros(3), 12.0, 2, time_limit=5.0)
    # peaks: items 4 + 4 with act 3 each need 11 in one bin; two bins of 7 hold one each
    assert not cannot_pack(np.full(2, 4.0), np.full(2, 3.0), 7.0, 2, time_limit=5.0)
    assert cannot_pack(np.full(2, 4.0), np.full(2, 3.0), 10.9, 1, time_limit=5.0)
    assert not cannot_pack(np.full(2, 4.0), np.full(2, 3.0), 11.0, 1, time_limit=5.0)


def test_smallest_capacity_finds_the_makespan_of_identical_items():
    # 5 items of 3 on 2 machines: the best split is 9 / 6, so every capacity below 9 fails
    cap = smallest_capacity(np.full(5, 3.0), np.zeros(5), 2, 0.0, 15.0, time_limit=10.0)
    assert 9.0 * (1 - 1e-4) <= cap < 9.0


def test_least_work_for_bytes_takes_the_cheapest_bytes_first():
    w, b = np.array([5.0, 1.0, 2.0]), np.array([1.0, 4.0, 2.0])
    assert least_work_for_bytes(w, b, 5.0) == pytest.approx(1.0 + 0.5 * 2.0)
    assert least_work_for_bytes(w, b, 0.0) == 0.0


# ---------------------------------------------------------------------- the forced chain
def _chain(n_layers: int, weight: float, work: float) -> Graph:
    """in -> w0 -> w1 -> ... -> out, each layer with an indivisible weight."""
    n = n_layers + 2
    names = ["in"] + [f"l{i}" for i in range(n_layers)] + ["out"]
    wk = [0.0] + [work] * n_layers + [0.0]
    params = [(f"p{i}", weight, [i + 1]) for i in range(n_layers)]
    edges = [(i, i + 1) for i in range(n - 1)]
    return Graph.build(names, wk, [0.0] * n, edges, params=params, act=[0.0] * n)


def test_separators_of_a_diamond_and_a_chain():
    g = Graph.build(list("abcd"), [1.0] * 4, [1.0] * 4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    assert separators(g).tolist() == [True, False, False, True]
    assert separators(_chain(3, 1.0, 1.0)).all()


def test_chain_bound_sees_indivisible_layers_the_average_cannot():
    # 5 layers of 10 bytes on 2 devices of 20 bytes: some device holds 3 layers (30 bytes),
    # 10 bytes over at B_mem = 1 plus 3 units of work: optimum 13, average (5 + 10) / 2
    g = _chain(5, 10.0, 1.0)
    c = Cluster("toy", 2, fast_memory=20.0, slow_memory_bandwidth=1.0)
    truth = brute_force(g, c).objective
    assert truth == pytest.approx(13.0)
    assert lower_bound(g, c) == pytest.approx(7.5)
    assert chain_bound(g, items(g), c, 2) == pytest.approx(13.0, rel=1e-6)
    assert chain_bound(g, items(g), c, 2) <= truth
    rep = certified_lower_bound(g, c, time_limit=2.0, ideals=False)  # the relaxations alone
    for name in ("chain", "chain io", "decision", "weights"):  # each sees the 3 layers
        assert rep.bounds[name] == pytest.approx(13.0, rel=1e-4) and rep.bounds[name] <= truth
    assert rep.value == pytest.approx(13.0, rel=1e-5) and rep.value <= truth


def test_bins_needed_splits_fluid_segments_and_keeps_separators_whole():
    seq = [(5.0, 0.0, False), (4.0, 2.0, True), (3.0, 0.0, False)]
    assert bins_needed(seq, 14.0, 3) == 1  # 5 + 4 + 2 (peak) + 3 = 14
    assert bins_needed(seq, 10.0, 3) == 2  # [5], [4 + peak 2 + 3]
    assert bins_needed(seq, 5.0, 3) == 4  # the separator alone needs 6 > 5


def test_chain_io_charges_the_tensors_a_cut_must_send():
    # in -> a -> b -> out, a sends 4 bytes to b at B = 1: a cut between a and b costs 4 on
    # both sides; work 10 each; k = 2: best plan {in, a} | {b, out}: 10 + 4 = 14
    g = Graph.build(["in", "a", "b", "out"], [0, 10, 10, 0], [0, 4, 0, 0], [(0, 1), (1, 2), (2, 3)])
    c = Cluster("toy", 2, link_bandwidth=1.0)
    assert brute_force(g, c).objective == pytest.approx(14.0)
    assert work_chain_bound(g, items(g), 2) == pytest.approx(10.0, rel=1e-6)
    assert chain_io_bound(g, items(g), c, 2, 0.0, 5.0, memory=False) == pytest.approx(
        14.0, rel=1e-6
    )
    ch = Chain(g, items(g).work, np.zeros(4), 1.0)
    assert ch.m == 4 and ch.outs[1] == [(2, 4.0)]
    assert bins_needed_io(ch, 14.0, 2, 1.0) == 2
    assert bins_needed_io(ch, 13.9, 2, 1.0) == 3  # more than k


def test_gap_subset_sums_keep_the_big_nodes_whole():
    size = np.array([0.0, 3.0, 3.0, 0.5, 0.0])
    sep = np.array([True, False, False, False, True])
    gap = np.array([0, 1, 1, 1, 1])
    sums, small = gap_subset_sums(size, gap, sep, 2)
    assert sums[1].tolist() == [0.0, 0.5, 3.0, 3.5, 6.0, 6.5] and small == [0.0, 0.0, 0.0]
    # s0 -> {a, b} -> s1, works 1, 2, 6, 1, k = 2, no io: a divisible gap would allow 5 + 5,
    # whole nodes force 7 ({s0, a} | {b, s1}), the optimum
    g = Graph.build(
        ["s0", "a", "b", "s1"], [1.0, 2.0, 6.0, 1.0], [0.0] * 4, [(0, 1), (0, 2), (1, 3), (2, 3)]
    )
    assert brute_force(g, Cluster("toy", 2)).objective == pytest.approx(7.0)
    assert work_chain_bound(g, items(g), 2) == pytest.approx(5.0, rel=1e-6)
    val = chain_io_bound(g, items(g), Cluster("toy", 2), 2, 0.0, 5.0, memory=False)
    assert val == pytest.approx(7.0, rel=1e-5) and val <= 7.0


def test_work_chain_and_work_packing_see_one_big_node():
    # one node holds 10 of 13 units of work: every plan has a block with work >= 10
    g = Graph.build(list("abcd"), [1.0, 10.0, 1.0, 1.0], [0.0] * 4, [(0, 1), (1, 2), (2, 3)])
    c = Cluster("toy", 3)
    assert work_chain_bound(g, items(g), 3) == pytest.approx(10.0, rel=1e-6)
    assert work_packing_bound(items(g), 3, 1.0) == pytest.approx(10.0, rel=1e-4)
    assert brute_force(g, c).objective == pytest.approx(10.0)


def test_capacity_proof_when_weights_cannot_fit():
    g = _chain(3, 10.0, 1.0)
    assert capacity_infeasible(items(g), Cluster("t", 2, capacity=15.0), 2, 1.0)
    assert brute_force(g, Cluster("t", 2, capacity=15.0)) is None
    assert not capacity_infeasible(items(g), Cluster("t", 2, capacity=20.0), 2, 1.0)
    rep = certified_lower_bound(g, Cluster("t", 2, capacity=15.0), time_limit=1.0)
    assert rep.infeasible and rep.binding == "capacity" and math.isinf(rep.value)


# ---------------------------------------------------------------------- Llama generator
def test_llama_generator_sparse_external_weights(tmp_path):
    shape = llama.LlamaShape(layers=2, hidden=32, mlp=48, heads=4, kv_heads=2, vocab=64, seq=8)
    out = llama.write(shape, tmp_path / "tiny.onnx", random_weights=True, seed=3)
    import onnx
    import onnxruntime as ort

    onnx.checker.check_model(str(out))
    model = onnx.load(str(out), load_external_data=False)
    n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.external_data)
    assert n_params == shape.param_count()
    ids = (np.arange(8) * 7 % 64).reshape(1, 8)
    y = ort.InferenceSession(str(out)).run(None, {"input_ids": ids})[0]
    assert y.shape == (1, 8, 64) and np.isfinite(y).all() and np.abs(y).max() > 0
    # the 7B preset: 6,738,415,616 weights (Llama-2-7B), a sparse data file, never written
    big = llama.write(llama.LlamaShape(**llama.PRESETS["7b"]), tmp_path / "l7.onnx")
    data = tmp_path / "l7.onnx.data"
    assert llama.LlamaShape(**llama.PRESETS["7b"]).param_count() == 6_738_415_616
    assert data.stat().st_size >= 2 * 6_738_415_616
    assert data.stat().st_blocks * 512 < 1 << 20  # a hole, not 13 GB on disk
    from solver.frontends import load_graph

    g = load_graph(big, cluster="ipu-pod", devices=16)
    # fp16 weights plus the stored fp16 constants (rotary cos and sin, causal mask: 128 x 128)
    assert g.param_bytes_total == 2 * 6_738_415_616 + 3 * 2 * 128 * 128
    c = Cluster("ipu", 16, fast_memory=900e6, link_bandwidth=64e9, slow_memory_bandwidth=20e9)
    rep = certified_lower_bound(g, c, time_limit=2.0)
    assert rep.binding in ("chain", "chain io") and rep.value > 1.9 * lower_bound(g, c)


def test_llama_cli_refuses_to_overwrite(tmp_path):
    out = tmp_path / "m.onnx"
    out.write_text("keep")
    argv = [sys.executable, str(ROOT / "models" / "llama.py"), "--layers", "1", "--out", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True)
    assert r.returncode == 2 and "exists" in r.stderr and out.read_text() == "keep"
    assert r.stderr.count("\n") == 1


def test_evaluate_agrees_with_chain_example():
    g = _chain(5, 10.0, 1.0)
    c = Cluster("toy", 2, fast_memory=20.0, slow_memory_bandwidth=1.0)
    assert evaluate(g, c, [0, 0, 0, 0, 1, 1, 1]).objective == pytest.approx(13.0)


# ---------------------------------------------------------------------- the exact ideal DP
def _dp(g, c):
    from solver.core.graph import coarse_view
    from solver.pipeline.dp.chain_ideals import chain_ideal_dp

    cg, labels = coarse_view(g)
    res = chain_ideal_dp(cg, c, c.devices, 0.0, 60.0)
    return res, (None if res.assignment is None else res.assignment[labels])


def _check_dp_against_brute_force(g, c):
    """The DP's plan is optimal, its bound proves it and never exceeds the optimum, and its
    tie-break plan sends the fewest bytes (then has the lowest latency) among optimal plans."""
    from solver.pipeline.exact.brute import all_assignments

    truth = brute_force(g, c)
    res, a = _dp(g, c)
    if "skipped" in res.stats:  # a data edge that is not an order edge: not applicable
        assert "order edge" in res.stats["skipped"] and res.lower == 0.0
        return
    if truth is None:  # no plan fits the capacity: the DP finds none and proves nothing
        assert a is None and res.lower == 0.0
        return
    assert res.lower <= truth.objective * (1 + TOL) + TOL
    assert a is not None and not validate(g, c, a)
    ev = evaluate(g, c, a)
    assert ev.objective == pytest.approx(truth.objective, rel=1e-9, abs=1e-12)
    assert res.optimal or truth.objective == 0.0
    best = (math.inf, math.inf)
    for b in all_assignments(g, c.devices):
        e = evaluate(g, c, b)
        if e.objective <= truth.objective * (1 + 1e-9) and not validate(g, c, b):
            best = min(best, (float(e.bytes_in.sum()), e.latency))
    assert (float(ev.bytes_in.sum()), ev.latency) == pytest.approx(best, rel=1e-9, abs=1e-12)


@settings(max_examples=scaled_examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_ideal_dp_equals_the_brute_force_optimum(prob):
    _check_dp_against_brute_force(*prob)


@st.composite
def decoders(draw):
    """Small decoder-like graphs: separators joined by gaps of parallel branches (chains of one
    or two nodes, sometimes with a tensor crossing between them), residual tensors that skip a
    gap (multicast to the gap and the next separator), weights shared by
    nodes of different gaps, memory limits and capacities."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layers = draw(st.integers(1, 3))
    names, work, size, edges, act = ["s0"], [float(rng.integers(0, 3))], [], [], []
    size.append(float(rng.integers(0, 4)))
    prev, gap_nodes = 0, []
    for lay in range(layers):
        ends = []
        for b in range(draw(st.integers(1, 2))):
            src = prev
            for depth in range(draw(st.integers(1, 2))):  # a branch is a chain of 1-2 nodes
                v = len(names)
                names.append(f"g{lay}{b}{depth}")
                work.append(float(rng.integers(0, 6)))
                size.append(float(rng.integers(0, 5)))
                edges.append((src, v))
                if depth and rng.random() < 0.5 and ends:
                    edges.append((ends[0], v))  # a tensor crossing to the other branch
                gap_nodes.append(v)
                src = v
            ends.append(src)
        s = len(names)
        names.append(f"s{lay + 1}")
        work.append(float(rng.integers(0, 4)))
        size.append(float(rng.integers(0, 4)))
        edges += [(v, s) for v in ends] + [(prev, s)]  # the residual skips the gap
        prev = s
        if len(names) >= 7:
            break
    n = len(names)
    act = rng.integers(0, 4, n).astype(float).tolist()
    params = [("p0", float(rng.integers(1, 6)), sorted(set(rng.choice(gap_nodes, 2).tolist())))]
    params.append(("p1", float(rng.integers(1, 6)), [int(rng.integers(0, n))]))
    g = Graph.build(names, work, size, edges, params=params, act=act, name="decoder")
    c = Cluster(
        "toy",
        draw(st.integers(1, 3)),
        fast_memory=float(rng.integers(2, 10)) if rng.random() < 0.5 else math.inf,
        capacity=float(rng.integers(8, 16)) if rng.random() < 0.3 else None,
        link_bandwidth=float(rng.choice([0.5, 1.0, 2.0])),
        slow_memory_bandwidth=float(rng.choice([0.5, 1.0, 4.0])),
    )
    return g, c


@settings(max_examples=scaled_examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(decoders())
def test_ideal_dp_equals_the_brute_force_optimum_on_decoder_chains(prob):
    g, c = prob
    assert separators(g).sum() >= 2  # the structure the DP is built for
    _check_dp_against_brute_force(g, c)


def test_ideal_dp_proves_the_optimum_of_a_gap_with_parallel_branches():
    # s0 -> {a, b} -> s1 -> {c} -> s2 (s0's output also skips to s1), k = 2, B = 1: the
    # optimum 23 is {s0, a, b, s1} | {c, s2} (work 22 + 1 sent), tied with a cut inside the
    # gap ({s0, a} | {b, s1, c, s2}: work 18 + 3 + 2 received); the relaxations prove 21
    g = Graph.build(
        ["s0", "a", "b", "s1", "c", "s2"],
        [1.0, 10.0, 10.0, 1.0, 6.0, 1.0],
        [3.0, 2.0, 2.0, 1.0, 1.0, 0.0],
        [(0, 1), (0, 2), (1, 3), (2, 3), (0, 3), (3, 4), (4, 5)],
    )
    c = Cluster("toy", 2, link_bandwidth=1.0)
    truth = brute_force(g, c).objective
    assert truth == pytest.approx(23.0)
    res, a = _dp(g, c)
    assert res.optimal and evaluate(g, c, a).objective == pytest.approx(23.0)
    assert res.lower == pytest.approx(23.0, rel=1e-8) and res.lower <= 23.0
    rep = certified_lower_bound(g, c, time_limit=2.0, ideals=False)
    # the relaxations stopped at 21 until the chain charged a boundary inside the gap its
    # interior cut (3 + 2: tests/pipeline/test_bounds_gap_io.py); now they prove 23 as well
    assert 21.0 < rep.value <= 23.0


def test_ideal_dp_meets_the_known_optimum_of_bert_l12():
    # an independent check on a real operator graph (783 nodes, 424 coarse, k = 6): the DP's
    # plan and bound both equal the optimum the dnn-partitioning paper's MIP proved
    from solver.frontends import load_graph, resolve_cluster

    key = "OperatorGraphs/bert_l-12_inference"
    g = load_graph(str(bench_path(key)))
    c = resolve_cluster(g, None, None)
    nodes, k, opt = KNOWN_OPTIMA[key]
    assert (g.n, c.devices) == (nodes, k)
    res, a = _dp(g, c)
    assert res.optimal and evaluate(g, c, a).objective == pytest.approx(opt, rel=1e-9)
    assert res.lower <= opt and res.lower == pytest.approx(opt, rel=1e-8)


@settings(max_examples=scaled_examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_bounds_with_an_incumbent_stay_below_the_optimum_and_stop_when_met(prob):
    """With a known plan's cost as the target, the report is still a proven bound (never above
    brute force) and, once the best bound meets the target, no further bound is computed."""
    g, c = prob
    truth = brute_force(g, c)
    if truth is None:
        return
    rep = certified_lower_bound(g, c, time_limit=1.0, target=truth.objective)
    assert rep.value <= truth.objective * (1 + TOL) + TOL
    assert rep.value == max(rep.bounds.values()) == rep.bounds[rep.binding]
    it = items(g)
    k = c.devices
    cheap = max(lower_bound(g, c), chain_bound(g, it, c, k), work_chain_bound(g, it, k))
    if truth.objective <= cheap * (1 + 1e-6):
        # met by the cheap bounds: the costly ones never ran, and say why
        assert set(rep.bounds) == {"universal", "chain", "work chain"}
        assert all(v.startswith("not needed") for v in rep.skipped.values())


def test_bounds_stop_at_the_incumbent_without_the_packings():
    """A chain of 5 layers (optimum 13 on 2 devices, found by the chain bound in microseconds):
    with the optimum as the target, the CP-SAT packings are skipped and said to be."""
    g = _chain(5, 10.0, 1.0)
    c = Cluster("toy", 2, fast_memory=20.0, slow_memory_bandwidth=1.0)
    truth = brute_force(g, c).objective
    rep = certified_lower_bound(g, c, time_limit=2.0, ideals=False, target=truth)
    assert rep.binding == "chain" and rep.value == pytest.approx(13.0, rel=1e-6)
    assert "decision" not in rep.bounds and "work packing" not in rep.bounds
    assert rep.skipped["decision"] == "not needed: chain meets the incumbent"
    assert rep.to_dict()["skipped"] == rep.skipped
    # without a target every bound runs on its own (the full report)
    full = certified_lower_bound(g, c, time_limit=2.0, ideals=False)
    assert not full.skipped and full.bounds["decision"] == pytest.approx(13.0, rel=1e-4)


def test_packing_search_above_a_proven_bound_returns_it_when_nothing_is_above():
    """5 items of 3 in 2 bins: the least capacity is 9 (3 + 3 + 3); from lo = 9 (a packing
    exists just above it) nothing more is proven and lo comes back; from lo = 4 the search
    finds 9 again, within its tolerance."""
    size, act = np.full(5, 3.0), np.zeros(5)
    assert smallest_capacity(size, act, 2, 9.0, 15.0, 5.0, probe_lo=True) == 9.0
    found = smallest_capacity(size, act, 2, 4.0, 15.0, 5.0, probe_lo=True)
    assert found == pytest.approx(9.0, rel=1e-4) and found < 9.0
    # a search capped by a known plan's cost never goes above it
    assert work_packing_bound(items(_chain(5, 0.0, 3.0)), 2, 2.0, 0.0, 8.5) <= 8.5


# ---------------------------------------------------------------------- the node-block bound
def _work_io(g, c, inside):
    """work + io_in + io_out of the node set ``inside`` by the evaluator (block 0 = the set)."""
    ev = evaluate(g, c, np.where(inside, 0, 1), k=2)
    return float(ev.work[0] + ev.io_in[0] + ev.io_out[0])


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_node_block_cut_is_the_cheapest_set_and_the_bound_is_below_the_optimum(prob):
    """m(v), one min cut, equals the least work + io over all 2^(n-1) sets holding v (by the
    evaluator); the pruned bound is the largest m(v) + overflow({v}) and never exceeds the
    brute-force optimum."""
    g, c = prob
    cn = cut_network(g, c)
    masks = (np.arange(2**g.n)[:, None] >> np.arange(g.n)[None, :]) & 1
    costs = np.array([_work_io(g, c, m.astype(bool)) for m in masks])
    for v in range(g.n):
        truth = costs[masks[:, v] == 1].min()
        assert min_block_cost(cn, v) == pytest.approx(truth, rel=1e-9, abs=1e-12), v
    cg, _ = coarse_view(g)
    ccn = cut_network(cg, c)
    every = max(min_block_cost(ccn, v) + own_overflow(cg, c)[v] for v in range(cg.n))
    res = node_block_bound(g, c, 10.0)
    assert res.complete and res.value == pytest.approx(every, rel=1e-9, abs=1e-12)
    best = brute_force(g, c)
    if best is not None:
        assert res.value <= best.objective * (1 + TOL) + TOL


def test_node_block_proves_the_optimum_of_resnet50_inference_at_8_blocks():
    """On resnet50 inference (604 operators) at k = 8 the cheapest block around one node costs
    exactly the optimum the exact DP over the ideals finds and proves."""
    g = load_graph(str(bench_path("OperatorGraphs/resnet50_inference")))
    c = dataclasses.replace(resolve_cluster(g, None, None), devices=8)
    res, a = _dp(g, c)
    opt = evaluate(g, c, a).objective
    assert res.optimal and not validate(g, c, a)
    bound = node_block_bound(g, c, 30.0)
    assert bound.value <= opt and bound.value == pytest.approx(opt, rel=1e-9)
    rep = certified_lower_bound(g, c, time_limit=5.0, target=opt)
    assert rep.binding == "node block" and rep.value == bound.value
    assert rep.skipped["decision"] == "not needed: node block meets the incumbent"
