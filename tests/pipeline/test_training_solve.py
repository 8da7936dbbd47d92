"""mtpp's solve of training plans (solver.pipeline.training.solve through registry.solve): the
least iteration time T against brute force over every plan for each schedule, memory that
binds, OPTIMAL only with a proof, and what is refused."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster, Topology
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.training import TrainingSpec, training_cost, training_lower_bound
from solver.pipeline import registry
from solver.pipeline.exact.brute import all_assignments
from solver.pipeline.options import SolveOptions
from solver.pipeline.plan import FEASIBLE, OPTIMAL, read_plan_training, save_plan
from solver.pipeline.training import solve as training_solve
from solver.pipeline.training.exact import TrainingDPDoesNotApply, layer_training_plan
from tests.conftest import problems, scaled_examples

SPECS = [
    TrainingSpec("gpipe", 3),
    TrainingSpec("1f1b", 4),
    TrainingSpec("1f1b", 1),
    TrainingSpec("interleaved", 4, virtual_stages=2),
]


def _chain(n: int, seed: int, **fields) -> Graph:
    rng = np.random.default_rng(seed)
    return Graph.build(
        [f"v{i}" for i in range(n)],
        rng.random(n),
        rng.random(n) * 3,
        [(i, i + 1) for i in range(n - 1)],
        params=[(f"w{i}", float(rng.random() * 4), [i]) for i in range(n)],
        **fields,
    )


def _with_training_costs(g: Graph, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    return replace(g, work_backward=rng.random(g.n) * 4, stash=rng.random(g.n) * 5)


def _brute(g: Graph, cluster: Cluster, spec: TrainingSpec) -> float:
    """The least T over every valid plan on the cluster's devices (inf: none fits)."""
    best = math.inf
    for a in all_assignments(g, cluster.devices):
        cost = training_cost(g, cluster, a, spec)
        if cost.valid:
            best = min(best, cost.iteration_time)
    return best


def _solve(g, cluster, spec, method="cpsat", time_limit=20.0):
    return registry.solve(g, cluster, method, SolveOptions(time_limit=time_limit, training=spec))


@settings(max_examples=scaled_examples(20), deadline=None)
@given(
    problems(max_nodes=6, max_k=3),
    st.integers(0, 2**31),
    st.sampled_from([None, 0.6, 0.9]),
    st.sampled_from(range(len(SPECS))),
)
def test_cpsat_training_plan_is_the_brute_force_optimum(problem, seed, tight, which):
    g0, cl0 = problem
    g = _with_training_costs(g0, seed)
    spec = SPECS[which]
    free = replace(cl0, capacity=None)
    one = training_cost(g, free, np.zeros(g.n, dtype=np.int64), spec)
    cap = None if tight is None else tight * one.stages[0].memory
    cluster = replace(cl0, capacity=cap if cap else None)
    best = _brute(g, cluster, spec)
    plan = _solve(g, cluster, spec)
    if math.isinf(best):
        assert plan is None
        return
    assert plan is not None and plan.training is not None
    assert plan.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert plan.training.valid and plan.training.spec == spec
    assert plan.lower_bound <= best * (1 + 1e-9) + 1e-12
    assert plan.status == OPTIMAL  # proven by the DP (homogeneous, few ideals) or enumeration
    assert plan.stats["bound"]["binding"] in plan.stats["bound"]["certified"]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.schedule}-m{s.microbatches}")
def test_heuristic_plans_are_priced_and_bounded_but_not_claimed(spec):
    g = _chain(7, 11, stash=[1.5] * 7)
    cluster = Cluster("c", 3, link_bandwidth=2.0)
    best = _brute(g, cluster, spec)
    for method in ("time", "slicegraph", "poprt"):
        plan = _solve(g, cluster, spec, method)
        assert plan.method == method and plan.training is not None
        T = training_cost(g, cluster, plan.assignment, spec).iteration_time
        assert plan.objective == pytest.approx(T, rel=1e-12) and plan.objective >= best * (1 - 1e-9)
        assert plan.lower_bound <= best * (1 + 1e-9)
        assert plan.status == (
            OPTIMAL if plan.lower_bound >= plan.objective * (1 - 1e-6) else FEASIBLE
        )


def test_memory_that_binds_moves_the_optimum():
    """1F1B's first stage keeps the most microbatches: a capacity below the free optimum's
    largest stage memory gives another plan, still the brute-force optimum and proven."""
    g = _chain(8, 4, stash=[3.0] * 8)
    spec = TrainingSpec("1f1b", 8)
    free = Cluster("c", 4, link_bandwidth=4.0)
    loose = _solve(g, free, spec)
    used = max(s.memory for s in loose.training.stages)
    tight_cluster = replace(free, capacity=0.8 * used)
    tight = _solve(g, tight_cluster, spec)
    assert loose.status == tight.status == OPTIMAL
    assert tight.objective > 1.1 * loose.objective
    assert tight.objective == pytest.approx(_brute(g, tight_cluster, spec), rel=1e-9)
    assert all(s.memory <= 0.8 * used * (1 + 1e-12) for s in tight.training.stages)
    assert not np.array_equal(tight.assignment, loose.assignment)


def test_no_plan_fits_is_proven():
    g = _chain(5, 2, stash=[2.0] * 5)
    cluster = Cluster("c", 2, link_bandwidth=1.0, capacity=1.0)
    assert _brute(g, cluster, TrainingSpec("gpipe", 4)) == math.inf
    assert _solve(g, cluster, TrainingSpec("gpipe", 4)) is None


def test_one_device_is_the_one_plan():
    g = _chain(5, 3)
    spec = TrainingSpec("1f1b", 6)
    plan = _solve(g, Cluster("c", 1, link_bandwidth=1.0), spec)
    (stage,) = plan.training.stages
    assert plan.status == OPTIMAL
    assert plan.objective == pytest.approx(6 * stage.time, rel=1e-12)  # T = m t for one stage
    assert stage.time == pytest.approx(g.work.sum() + g.backward_work.sum(), rel=1e-12)


def test_optimal_only_with_a_proof(monkeypatch):
    """Without the exact DP and without CP-SAT's training model, only the analytic bound is
    left: the plan is FEASIBLE unless that bound meets it, and the bound is below the optimum."""

    def no_dp(*args, **kwargs):
        raise TrainingDPDoesNotApply("test: the DP is off")

    monkeypatch.setattr(training_solve, "exact_training_plan", no_dp)
    monkeypatch.setattr(training_solve, "chain_training_plan", no_dp)
    monkeypatch.setattr(training_solve, "_cpsat", lambda *args, **kwargs: [])
    g = _chain(7, 5, stash=[1.0] * 7)
    cluster = Cluster("c", 3, link_bandwidth=1.0)
    spec = TrainingSpec("1f1b", 4)
    plan = _solve(g, cluster, spec)
    best = _brute(g, cluster, spec)
    assert plan.lower_bound <= best * (1 + 1e-9)
    assert plan.lower_bound < plan.objective * (1 - 1e-6)
    assert plan.status == FEASIBLE
    assert plan.stats["bound"]["binding"] == "training average/neighbourhood bound"
    assert plan.stats["training_solve"]["notes"]["training ideal DP"] == "test: the DP is off"


def test_the_bound_uses_the_bottleneck_bound_only_for_a_state_factor_of_one_or_more():
    g = _chain(6, 8)
    cluster = Cluster("c", 2, link_bandwidth=1.0)
    half = TrainingSpec("1f1b", 4, optimizer_state=0.5)
    plan = _solve(g, cluster, half)
    assert "not used" in plan.stats["training_solve"]["notes"]["bottleneck bound"]
    assert plan.stats["bound"]["certified"]["training average/neighbourhood bound"] == (
        pytest.approx(training_lower_bound(g, cluster, 2, half), rel=1e-12)
    )


def test_heterogeneous_cluster_gets_a_valid_plan_and_an_honest_bound():
    g = _chain(5, 6)
    topo = Topology(((0, 1, 2),), ("a",), ((1.0, 0.0),), None, compute=(1.0, 2.0, 1.0))
    cluster = Cluster("h", 3, link_bandwidth=1.0, topology=topo)
    spec = TrainingSpec("gpipe", 2)
    plan = _solve(g, cluster, spec, time_limit=10.0)
    best = min(
        training_cost(g, cluster, a, spec).iteration_time for a in all_assignments(g, 3)
    )  # block b on device b; other placements may do better
    assert plan.training.valid
    assert plan.lower_bound <= plan.objective
    assert plan.objective <= best * (1 + 1e-9) or plan.status != OPTIMAL


def test_a_heuristic_plan_over_the_training_memory_is_refused():
    g = _chain(6, 9, stash=[4.0] * 6)
    spec = TrainingSpec("gpipe", 16)
    plan = _solve(g, Cluster("c", 3, link_bandwidth=1.0), spec, "time")
    worst = max(s.memory for s in plan.training.stages)
    with pytest.raises(MtppError, match=r"^time's plan does not fit the training memory \(stage"):
        _solve(g, Cluster("c", 3, link_bandwidth=1.0, capacity=0.9 * worst), spec, "time")


def test_inference_plans_are_unchanged():
    g = _chain(6, 10)
    cluster = Cluster("c", 2, link_bandwidth=1.0)
    plan = registry.solve(g, cluster, "cpsat", SolveOptions(time_limit=10))
    d = plan.to_dict()
    assert plan.training is None and "training" not in d and "objective_kind" not in d
    assert d["objective"] == plan.evaluation.objective


def test_plan_file_records_the_spec(tmp_path):
    g = _chain(6, 12)
    spec = TrainingSpec("interleaved", 4, virtual_stages=2, optimizer_state=8.0)
    plan = _solve(g, Cluster("c", 2, link_bandwidth=1.0), spec)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    data = json.loads(path.read_text())
    assert data["objective_kind"] == "iteration_time"
    assert data["objective"] == data["training"]["iteration_time"] == plan.objective
    assert read_plan_training(data, path) == spec
    assert read_plan_training({"format": "mtpp-plan"}, path) is None
    data["training"]["virtual_stages"] = 2.5
    with pytest.raises(MtppError, match=r"plan.json: 'training': the number of virtual stages"):
        read_plan_training(data, path)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.schedule}-m{s.microbatches}")
def test_best_whole_layer_split_is_the_best_over_every_run_of_layers(spec):
    """The training DP over layer prefixes equals the best of every split into runs of whole
    layers (stages of 1..k runs), memory included; it is a warm start, never a bound."""
    layers, per = 6, 2
    names = [f"model.layers.{i // per}.op{i % per}" for i in range(layers * per)]
    stash = np.random.default_rng(14).random(layers * per) * 6
    g0 = _chain(layers * per, 13, stash=stash)
    g = replace(g0, names=tuple(names))
    of_node = np.arange(g.n) // per
    k = 3
    free = Cluster("c", k, link_bandwidth=1.5)
    loose = layer_training_plan(g, free, k, spec, of_node)
    top = max(s.memory for s in loose.cost.stages)
    below = [m for m in _run_split_memories(g, free, k, spec, of_node) if m < top * (1 - 1e-9)]
    for cap in (None, top, max(below), 0.5 * min(below)):
        cluster = replace(free, capacity=cap)
        best = _best_run_split(g, cluster, k, spec, of_node)
        sol = layer_training_plan(g, cluster, k, spec, of_node)
        assert sol.lower == 0.0  # a restricted problem's bound is no bound
        if math.isinf(best):
            assert sol.assignment is None and cap == 0.5 * min(below)
            continue
        assert sol.cost.valid and sol.value == pytest.approx(best, rel=1e-9)
        if cap == max(below):  # the memory binds: the free optimum does not fit
            assert sol.value > loose.value * (1 + 1e-9)


def _splits(of_node, k):
    layers = int(of_node.max()) + 1
    for p in range(1, k + 1):
        for cuts in combinations(range(1, layers), p - 1):
            yield np.searchsorted(np.array(cuts, dtype=int), of_node, side="right")


def _run_split_memories(g, cluster, k, spec, of_node) -> list[float]:
    return [
        max(s.memory for s in training_cost(g, cluster, a, spec).stages)
        for a in _splits(of_node, k)
    ]


def _best_run_split(g, cluster, k, spec, of_node) -> float:
    """The least T over every split of the layers into 1..k runs (brute force)."""
    costs = [training_cost(g, cluster, a, spec) for a in _splits(of_node, k)]
    return min((c.iteration_time for c in costs if c.valid), default=math.inf)
