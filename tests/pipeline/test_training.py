"""Training plans: the model (T, per-stage memory), the exact DP against brute force, the
lower bound, the practitioners' splits, and the graph fields work_backward and stash."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster, Topology
from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.core.training import TrainingSpec, training_cost, training_lower_bound
from solver.frontends import native
from solver.pipeline.exact.brute import all_assignments
from solver.pipeline.training.exact import (
    TrainingDPDoesNotApply,
    exact_training_plan,
)
from solver.pipeline.training.splits import (
    by_parameter_counts,
    fewer_at_ends_counts,
    practitioner_splits,
    read_layers,
    uniform_counts,
)
from tests.conftest import problems, scaled_examples


def _chain(n: int, seed: int, names=None, **fields) -> Graph:
    rng = np.random.default_rng(seed)
    return Graph.build(
        names or [f"v{i}" for i in range(n)],
        rng.random(n),
        rng.random(n) * 3,
        [(i, i + 1) for i in range(n - 1)],
        params=[(f"w{i}", float(rng.random() * 4), [i]) for i in range(n)],
        **fields,
    )


# ---------------------------------------------------------------- graph fields
def test_defaults_are_twice_the_work_and_the_output_bytes():
    g = _chain(4, 0)
    assert g.work_backward is None and g.stash is None
    assert np.array_equal(g.backward_work, 2 * g.work)
    assert np.array_equal(g.stash_bytes, g.sizeout)


def test_given_fields_are_kept_and_checked():
    g = _chain(3, 1, work_backward=[1.0, 2.0, 3.0], stash=[5.0, 0.0, 7.0])
    assert g.backward_work.tolist() == [1.0, 2.0, 3.0]
    assert g.stash_bytes.tolist() == [5.0, 0.0, 7.0]
    with pytest.raises(MtppError, match=r"node 'v1': stash must be finite and >= 0, got -1.0"):
        _chain(3, 1, stash=[1.0, -1.0, 0.0])


def test_contraction_adds_stash_and_backward_work_up():
    g = Graph.build(
        ["a", "b", "c"], [1.0, 2.0, 4.0], [3.0, 5.0, 7.0], [(0, 1), (1, 2)], colocate=[[0, 1]]
    )
    cg, labels = coarse_view(g)
    assert cg.stash_bytes.tolist() == [8.0, 7.0]  # a's output is consumed inside: still stashed
    assert cg.backward_work.tolist() == [6.0, 8.0]
    g2 = replace(g, work_backward=np.array([1.0, 1.0, 9.0]))
    assert coarse_view(g2)[0].backward_work.tolist() == [2.0, 9.0]


def test_native_json_round_trip_and_unchanged_without_the_fields():
    plain = {"format": "mtpp-graph", "nodes": [{"name": "a", "work": 1.0, "sizeout": 2.0}]}
    assert set(native.to_dict(native.from_dict(plain))["nodes"][0]) == {
        "name",
        "work",
        "sizeout",
        "act",
    }
    data = {
        "format": "mtpp-graph",
        "nodes": [
            {"name": "a", "work": 1.0, "sizeout": 2.0, "stash": 9.0},
            {"name": "b", "work": 3.0, "work_backward": 4.0},
        ],
        "edges": [["a", "b"]],
    }
    g = native.from_dict(data)
    assert g.backward_work.tolist() == [2.0, 4.0]  # a omits it: 2 x work
    assert g.stash_bytes.tolist() == [9.0, 0.0]  # b omits it: its sizeout
    back = native.from_dict(native.to_dict(g))
    assert back.backward_work.tolist() == [2.0, 4.0]
    assert back.stash_bytes.tolist() == [9.0, 0.0]


# ---------------------------------------------------------------- model
def test_training_cost_by_hand():
    # a -> b -> c, a sends 4 bytes, b sends 2 bytes, B = 2 bytes/s
    g = Graph.build(
        ["a", "b", "c"],
        [1.0, 2.0, 3.0],
        [4.0, 2.0, 0.0],
        [(0, 1), (1, 2)],
        params=[("w", 10.0, [0]), ("u", 6.0, [1, 2])],
        stash=[1.0, 3.0, 5.0],
    )
    cl = Cluster("c", 3, link_bandwidth=2.0)
    spec = TrainingSpec("1f1b", 4, optimizer_state=4.0)
    cost = training_cost(g, cl, np.array([0, 2, 2]), spec, k=3)  # block 1 empty
    s0, s1 = cost.stages
    assert (s0.block, s1.block) == (0, 2)
    assert s0.forward == 1.0 + 2.0 and s0.backward == 2.0 + 2.0  # io out 4/2 twice
    assert s1.forward == 2.0 + 5.0 and s1.backward == 10.0 + 2.0
    assert (s0.inflight, s1.inflight) == (2.0, 1.0)  # min(m, p - i), p = 2
    ev = evaluate(g, cl, np.array([0, 2, 2]), k=3)
    assert s0.memory == 4 * 10.0 + ev.peak[0] + 2 * 1.0
    assert s1.memory == 4 * 6.0 + ev.peak[2] + 1 * 8.0
    assert cost.iteration_time == (7.0 + 19.0) + 3 * 19.0
    gp = training_cost(g, cl, np.array([0, 2, 2]), TrainingSpec("gpipe", 4), k=3)
    assert [s.inflight for s in gp.stages] == [4.0, 4.0]


def test_capacity_violation_names_the_stage():
    g = _chain(3, 2, stash=[100.0, 100.0, 100.0])
    cl = Cluster("c", 2, link_bandwidth=1.0, capacity=250.0)
    cost = training_cost(g, cl, np.array([0, 0, 1]), TrainingSpec("gpipe", 2), k=2)
    assert not cost.valid
    assert cost.violations[0].startswith("stage 0 (block 0) needs ")
    assert "2 x stash 200" in cost.violations[0]
    order = training_cost(g, cl, np.array([1, 0, 0]), TrainingSpec("gpipe", 1), k=2)
    assert any("goes from block 1 back to block 0" in v for v in order.violations)


def test_interleaved_time_and_memory():
    spec = TrainingSpec("interleaved", 8, virtual_stages=2)
    t = np.array([3.0, 5.0, 4.0, 2.0])
    assert spec.iteration_time(t) == pytest.approx(14 / 2 + (8 - 0.5) * 5)
    # Megatron's warm-up (p - i - 1) * 2 + (v - 1) * p, plus one, chunks of 1/v stash
    assert spec.inflight(4).tolist() == [(6 + 4 + 1) / 2, (4 + 4 + 1) / 2, 3.5, 2.5]
    assert TrainingSpec("interleaved", 8, 1).inflight(3).tolist() == [3.0, 2.0, 1.0]  # 1F1B


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "zb"}, "unknown schedule 'zb'; use one of gpipe, 1f1b, interleaved"),
        ({"microbatches": 0}, "the number of microbatches must be from 1 to 1,000,000, got 0"),
        ({"microbatches": 2.5}, "the number of microbatches must be a whole number, got 2.5"),
        ({"virtual_stages": 2}, "virtual stages > 1 need the interleaved schedule"),
        ({"optimizer_state": 0}, "the optimizer state factor must be a number > 0, got 0"),
    ],
)
def test_spec_refuses_bad_values(kwargs, message):
    with pytest.raises(MtppError) as e:
        TrainingSpec(**kwargs)
    assert str(e.value) == message


# ---------------------------------------------------------------- exact DP vs brute force
def _with_training_costs(g: Graph, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    wb = rng.random(g.n) * 4 if rng.random() < 0.7 else None
    stash = rng.integers(0, 6, g.n).astype(float) if rng.random() < 0.7 else None
    return replace(g, work_backward=wb, stash=stash)


def _brute(g: Graph, cluster: Cluster, spec: TrainingSpec, k: int):
    """The least T over every valid plan, and the least T ignoring memory."""
    best, free = math.inf, math.inf
    for a in all_assignments(g, k):
        c = training_cost(g, cluster, a, spec, k=k)
        if not any(not s.startswith("stage") for s in c.violations):
            free = min(free, c.iteration_time)
        if c.valid:
            best = min(best, c.iteration_time)
    return best, free


SPECS = [
    TrainingSpec("gpipe", 3),
    TrainingSpec("1f1b", 4),
    TrainingSpec("1f1b", 1),
    TrainingSpec("interleaved", 4, virtual_stages=2),
    TrainingSpec("interleaved", 2, virtual_stages=3),  # m = p on two stages: all forwards first
]


@settings(max_examples=scaled_examples(25))
@given(
    problems(max_nodes=6, max_k=3),
    st.integers(0, 2**31),
    st.sampled_from([None, 0.5, 0.7, 1.0]),
    st.sampled_from(range(len(SPECS))),
)
def test_exact_dp_matches_brute_force(problem, seed, tight, which):
    g0, cl0 = problem
    g = _with_training_costs(g0, seed)
    spec = SPECS[which]
    k = cl0.devices
    one_stage = training_cost(
        g, Cluster("x", k, link_bandwidth=cl0.link_bandwidth), np.zeros(g.n, int), spec, k=k
    )
    cap = None if tight is None else tight * one_stage.stages[0].memory
    cl = replace(cl0, capacity=cap) if cap is None or cap > 0 else replace(cl0, capacity=None)
    best, free = _brute(g, cl, spec, k)
    sol = exact_training_plan(g, cl, k, spec)
    if math.isinf(best):
        assert sol.assignment is None and math.isinf(sol.lower)
    else:
        assert sol.cost.valid
        assert sol.value == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert sol.optimal
        assert sol.lower <= best * (1 + 1e-9) + 1e-12
    bound = training_lower_bound(g, cl, k, spec)
    assert bound <= free * (1 + 1e-9) + 1e-12  # a bound for every plan, memory or not
    least_max_f = min(evaluate(g, cl, a, k=k).objective for a in all_assignments(g, k))
    with_f = training_lower_bound(g, cl, k, spec, max_f_bound=least_max_f)
    assert bound <= with_f <= free * (1 + 1e-9) + 1e-12


def test_dp_with_a_known_plan_prunes_and_agrees():
    g = _chain(9, 3, stash=[2.0] * 9)
    cl = Cluster("c", 3, link_bandwidth=2.0, capacity=60.0)
    spec = TrainingSpec("1f1b", 8)
    full = exact_training_plan(g, cl, 3, spec)
    pruned = exact_training_plan(g, cl, 3, spec, upper=full.value * 1.01)
    assert pruned.value == pytest.approx(full.value, rel=1e-12)
    assert pruned.blocks < full.blocks and pruned.optimal
    # an upper bound below the optimum leaves nothing better: the bound stays honest
    low = exact_training_plan(g, cl, 3, spec, upper=full.value * 0.9)
    assert low.lower <= full.value * 0.9


def test_memory_binds_and_position_matters():
    """1F1B's first stage keeps p microbatches: the optimum moves weight to later stages."""
    g = _chain(8, 4, stash=[3.0] * 8)
    free = Cluster("c", 4, link_bandwidth=4.0)
    spec = TrainingSpec("1f1b", 8)
    loose = exact_training_plan(g, free, 4, spec)
    used = max(s.memory for s in loose.cost.stages)
    tight = exact_training_plan(g, replace(free, capacity=0.8 * used), 4, spec)
    assert tight.optimal and tight.cost.valid
    assert tight.value > 1.1 * loose.value  # the memory binds
    brute, _ = _brute(g, replace(free, capacity=0.8 * used), spec, 4)
    assert tight.value == pytest.approx(brute, rel=1e-9)


def test_dp_refuses_heterogeneous_clusters_and_too_many_ideals():
    g = _chain(4, 5)
    topo = Topology(((0, 1),), ("a",), ((1.0, 0.0),), None, compute=(1.0, 2.0))
    het = Cluster("h", 2, link_bandwidth=1.0, topology=topo)
    with pytest.raises(TrainingDPDoesNotApply, match="devices and links that are alike"):
        exact_training_plan(g, het, 2, TrainingSpec())
    wide = Graph.build([f"v{i}" for i in range(14)], [1.0] * 14, [1.0] * 14, [])
    with pytest.raises(TrainingDPDoesNotApply, match="more than 3,000 ideals"):
        exact_training_plan(wide, Cluster("c", 2, link_bandwidth=1.0), 2, TrainingSpec())


# ---------------------------------------------------------------- splits
def test_layers_from_module_names():
    names = ["embed"] + [f"model.layers.{i}.{p}" for i in range(3) for p in ("attn", "mlp")]
    names += ["norm", "lm_head"]
    g = _chain(len(names), 6, names=names)
    layers = read_layers(g)
    assert layers.source == "module names" and layers.count == 3
    assert layers.of_node.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]


def test_layers_from_separators():
    g = Graph.build(
        [f"v{i}" for i in range(5)], [1.0] * 5, [1.0] * 5, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    )
    layers = read_layers(g)
    assert layers.source == "separators"
    assert layers.of_node.tolist() == [0, 1, 1, 1, 2]


def test_split_counts():
    assert uniform_counts(10, 4) == [3, 3, 2, 2]
    assert fewer_at_ends_counts(32, 4) == [8, 9, 8, 7]  # torchtitan: 34 units, ends give one back
    assert fewer_at_ends_counts(6, 1) == [6]
    rng = np.random.default_rng(7)
    for _ in range(30):
        w = rng.random(int(rng.integers(2, 8)))
        p = int(rng.integers(1, len(w) + 1))
        counts = by_parameter_counts(w, p)
        assert sum(counts) == len(w) and min(counts) >= 1
        got = max(part.sum() for part in np.split(w, np.cumsum(counts)[:-1]))
        best = min(max(part.sum() for part in np.split(w, cuts)) for cuts in _all_cuts(len(w), p))
        assert got == pytest.approx(best)


def _all_cuts(L: int, p: int):
    for cuts in combinations(range(1, L), p - 1):
        yield list(cuts)


def test_practitioner_splits_are_valid_plans_no_better_than_the_optimum():
    names = ["embed"] + [f"model.layers.{i}.{p}" for i in range(4) for p in ("attn", "mlp")]
    names += ["head"]
    g = _chain(len(names), 8, names=names)
    cl = Cluster("c", 3, link_bandwidth=2.0)
    spec = TrainingSpec("1f1b", 6)
    splits = practitioner_splits(g, cl, 3, spec)
    assert [s.name for s in splits] == ["uniform", "fewer-at-ends", "by-parameters"]
    best = exact_training_plan(g, cl, 3, spec)
    for s in splits:
        assert s.cost.valid and sum(s.layers_per_stage) == 4
        again = training_cost(g, cl, s.assignment, spec, k=3)
        assert again.iteration_time == s.cost.iteration_time
        assert best.value <= s.cost.iteration_time * (1 + 1e-12)
    assert splits[0].layers_per_stage == (2, 1, 1)
    assert splits[1].layers_per_stage == (1, 2, 1)
