"""The exact DP over the separator chain on Llama-shaped decoders (issue 11): it finds the
optimum CP-SAT proves, it certifies heuristic plans, and a proven optimum skips the CP-SAT
search with the DP's own tie-break (least transferred bytes, then latency)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models import llama
from solver.core.cost import evaluate, validate
from solver.core.graph import coarse_view
from solver.frontends import load_graph, resolve_cluster
from solver.pipeline.dp.chain_ideals import chain_ideal_dp, ideal_chain
from solver.pipeline.exact.cpsat import CpsatOptions, solve_cpsat
from solver.pipeline.options import SolveOptions
from solver.pipeline.plan import OPTIMAL
from solver.pipeline.registry import solve
from solver.pipeline.runners import quick_assignment

ROOT = Path(__file__).resolve().parents[2]

# slow compute and a slow link: work and transfers are of the same order, as for the 7B on
# IPUs (with ipu-pod's figures a tiny model is all transfer and its optimum is one block)
SLOW = """name: slow
devices: 4
fast_memory: 900MB
compute: 1GFLOPS
memory_bandwidth: 1TB/s
link_bandwidth: 10MB/s
slow_memory_bandwidth: 20GB/s
"""


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """An 8-layer Llama-shaped decoder (410 nodes, random weights) and its cluster file."""
    d = tmp_path_factory.mktemp("llm")
    shape = llama.LlamaShape(layers=8, hidden=32, mlp=48, heads=4, kv_heads=2, vocab=64, seq=8)
    model = llama.write(shape, d / "decoder.onnx", random_weights=True, seed=5)
    cluster = d / "slow.yaml"
    cluster.write_text(SLOW)
    return model, cluster


def _load(decoder, k: int, layers: int | None = None):
    model, cluster = decoder
    g = load_graph(str(model), cluster=str(cluster), devices=k)
    return g, resolve_cluster(g, str(cluster), k)


def test_the_dp_finds_the_optimum_cpsat_proves(decoder):
    g, c = _load(decoder, 4)
    cg, labels = coarse_view(g)
    res = chain_ideal_dp(cg, c, 4, 0.0, 60.0)
    assert res.optimal and "stopped" not in res.stats
    _, hint = quick_assignment(g, c)
    proof = solve_cpsat(g, c, hint, CpsatOptions(time_limit=60.0, workers=2, tie_break=False))
    assert proof.status == OPTIMAL  # CP-SAT's own proof, independent of the DP
    a = res.assignment[labels]
    assert not validate(g, c, a)
    assert evaluate(g, c, a).objective == pytest.approx(proof.objective, rel=1e-9)
    assert res.lower <= proof.objective and res.lower == pytest.approx(proof.objective, rel=1e-8)
    # CP-SAT's bound is its own: the DP's value lies within it
    assert proof.lower_bound <= res.value * (1 + 1e-9)


def test_a_proven_optimum_skips_the_search_with_an_exact_tie_break(decoder):
    g, c = _load(decoder, 16)
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=60.0, workers=2))
    assert plan.status == OPTIMAL and plan.gap <= 1e-6
    assert "exact DP over the ideals" in plan.stats["proof"]
    assert "model_variables" not in plan.stats  # no CP-SAT model was built
    cg, labels = coarse_view(g)
    res = ideal_chain(g, c, 16, 0.0, 60.0)  # the result the solve used (cached on the graph)
    assert res.optimal and plan.objective == pytest.approx(res.value, rel=1e-12)
    tb = plan.stats["tie_break"]["summary"]
    assert "exact DP" in tb
    # the tie-break never sends more than the first optimal plan it started from
    first = evaluate(g, c, res.before_tie_break[labels])
    assert plan.evaluation.bytes_in.sum() <= first.bytes_in.sum()
    assert plan.objective <= first.objective
    # without the tie-break, the first optimal plan as it was found
    raw = solve(g, c, "cpsat", SolveOptions(time_limit=60.0, workers=2, extra={"tie_break": False}))
    assert raw.status == OPTIMAL and np.array_equal(raw.assignment, res.before_tie_break[labels])
    assert raw.stats["tie_break"]["summary"] == "tie-break skipped (tie_break=false)"


def test_heuristic_plans_get_the_exact_gap(decoder):
    g, c = _load(decoder, 16)
    plan = solve(g, c, "time", SolveOptions(time_limit=60.0))
    opt = ideal_chain(g, c, 16, 0.0, 60.0).value  # the result the bound used (cached)
    assert plan.stats["bound"]["binding"] == "ideals"
    assert plan.lower_bound == pytest.approx(opt, rel=1e-8) and plan.lower_bound <= opt
    assert plan.objective > opt * 1.01  # the time-balanced split is not optimal here ...
    assert plan.gap == pytest.approx((plan.objective - opt) / plan.objective, rel=1e-6)


def test_a_run_stopped_by_its_deadline_resumes_to_the_same_optimum(decoder):
    g, c = _load(decoder, 16)
    cg, _ = coarse_view(g)
    ref = chain_ideal_dp(cg, c, 16, 0.0, 60.0)
    state: dict = {}
    stops = 0
    res = chain_ideal_dp(cg, c, 16, 0.0, 0.3, state=state)
    while not res.optimal and stops < 100:
        assert "stopped" in res.stats and res.lower <= ref.value
        stops += 1
        res = chain_ideal_dp(cg, c, 16, res.lower, 0.3, state=state)
    assert stops > 0 and res.optimal and state == {}  # done: the tables are dropped
    assert res.value == pytest.approx(ref.value, rel=1e-12)
