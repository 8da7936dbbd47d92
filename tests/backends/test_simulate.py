"""The simulator confirms the evaluator: period = max f(S) when pipelined without overlap."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.backends.simulate import MAX_EVENTS, draw_gantt, simulate
from solver.core.cluster import Cluster
from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.pipeline.exact.brute import all_assignments
from tests.conftest import problems, scaled_examples


def plan_of(prob, seed):
    g, c = prob
    plans = all_assignments(g, c.devices)
    return plans[np.random.default_rng(seed).integers(len(plans))]


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7), st.integers(0, 2**16))
def test_period_equals_objective_and_modes_are_ordered(prob, seed):
    g, c = prob
    a = plan_of(prob, seed)
    obj = evaluate(g, c, a).objective
    pipe = simulate(g, c, a, requests=40)
    assert pipe.period == pytest.approx(obj, rel=1e-9, abs=1e-12)
    over = simulate(g, c, a, requests=40, overlap=True)
    assert over.period <= pipe.period * (1 + 1e-12) + 1e-15
    seq = simulate(g, c, a, requests=40, mode="sequential")
    assert seq.throughput <= pipe.throughput * (1 + 1e-12)
    assert seq.period == pytest.approx(evaluate(g, c, a).f.sum(), rel=1e-9, abs=1e-12)


def test_period_is_the_bottleneck_for_any_number_of_requests():
    """a -> b on blocks 0 and 1 (f = 4 + 2 sent, and 2 received + 3), c alone on block 2
    (f = 6.1). Request r leaves block 1 at 6 (r + 1) + 0.25 + 5 and block 2 at 6.1 (r + 1):
    block 1 finishes last for 52 requests, and the gaps between requests leaving the
    pipeline (6) are not the period (6.1)."""
    g = Graph.build(["a", "b", "c"], [4.0, 3.0, 6.1], [2.0, 0.0, 0.0], [(0, 1)])
    c = Cluster("flat", 3, link_bandwidth=1.0, link_latency=0.25)
    assert evaluate(g, c, [0, 1, 2]).f.tolist() == pytest.approx([6.0, 5.0, 6.1], rel=1e-12)
    for requests in (3, 40, 200):
        for overlap in (False, True):
            sim = simulate(g, c, [0, 1, 2], requests=requests, overlap=overlap)
            assert sim.period == pytest.approx(6.1, rel=1e-12), (requests, overlap)
    sim = simulate(g, c, [0, 1, 2], requests=40)
    assert sim.makespan == pytest.approx(40 * 6 + 5.25, rel=1e-12)  # block 1 is last
    assert simulate(g, c, [0, 1, 2], requests=2).period == pytest.approx(2 * 6 + 5.25)


def test_hand_example_latency_memory_and_gantt(tmp_path):
    # a -> b -> c on three devices, 2 s of work each, 4-byte tensors at 2 B/s
    g = Graph.build(
        ["a", "b", "c"],
        [2.0, 2.0, 2.0],
        [4.0, 4.0, 0.0],
        [(0, 1), (1, 2)],
        params=[("w", 10.0, [1])],
    )
    c = Cluster("t", 3, link_bandwidth=2.0, link_latency=0.5)
    sim = simulate(g, c, [0, 1, 2], requests=20)
    assert sim.period == pytest.approx(2 + 2 + 2)  # block b: receive 2 + work 2 + send 2
    # first request: a (2 + send 2), latency .5, b (2 + 2 + 2), .5, c (2 + 2)
    assert sim.latency_first == pytest.approx(4 + 0.5 + 6 + 0.5 + 4)
    assert sim.peak_memory.tolist() == [4.0, 10.0 + 8.0, 4.0]  # b holds its input and output
    assert sim.valid and 0 < sim.busy[1] <= 1
    png = tmp_path / "gantt.png"
    draw_gantt(sim, 3, str(png))
    assert png.stat().st_size > 1000


def test_thousand_requests_of_a_large_plan_is_quick():
    rng = np.random.default_rng(0)
    n = 1000
    edges = [(i, j) for j in range(1, n) for i in rng.choice(j, size=min(j, 2), replace=False)]
    g = Graph.build([f"n{i}" for i in range(n)], rng.random(n), rng.random(n) * 100, edges)
    c = Cluster("t", 8, link_bandwidth=1e3)
    a = np.empty(n, dtype=int)
    a[g.topo_order] = np.arange(n) * 8 // n
    sim = simulate(g, c, a, requests=1000)
    assert sim.period == pytest.approx(evaluate(g, c, a).objective, rel=1e-9)


def _chain() -> tuple[Graph, Cluster]:
    g = Graph.build(["a", "b", "c"], [1.0, 1.0, 1.0], [4.0, 4.0, 0.0], [(0, 1), (1, 2)])
    return g, Cluster("t", 3, link_bandwidth=2.0)


@pytest.mark.parametrize("latency", [float("nan"), float("inf"), -1.0])
def test_simulate_refuses_a_latency_that_is_not_a_time(latency):
    g, c = _chain()
    with pytest.raises(MtppError, match=r"--latency must be a finite number of seconds >= 0"):
        simulate(g, c, [0, 1, 2], latency=latency)


def test_simulate_refuses_absurd_sizes_before_allocating():
    g, c = _chain()
    too_many = MAX_EVENTS // 3 + 1
    with pytest.raises(MtppError, match=rf"--requests {too_many} on 3 devices means"):
        simulate(g, c, [0, 1, 2], requests=too_many)
    with pytest.raises(MtppError, match=r"--requests must be >= 1"):
        simulate(g, c, [0, 1, 2], requests=0)


def test_gantt_title_is_plain_text(tmp_path):
    g, c = _chain()
    sim = simulate(g, c, [0, 1, 2], requests=5)
    pdf = tmp_path / "g.pdf"
    draw_gantt(sim, 3, pdf, title="$x^{$ [red]")  # broken mathtext, rich markup
    assert pdf.read_bytes().startswith(b"%PDF")
    assert [p.name for p in tmp_path.iterdir()] == ["g.pdf"]
