"""CP-SAT's training model (solver.pipeline.exact.cpsat_training): its T equals brute force
over every plan (and every placement on a cluster whose devices differ) and the training DP,
its lower bound never exceeds the optimum, hints are taken."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster, Topology
from solver.core.graph import Graph
from solver.core.training import TrainingSpec, training_cost
from solver.pipeline.exact.brute import all_assignments
from solver.pipeline.exact.cpsat_training import solve_training_cpsat
from solver.pipeline.training.exact import exact_training_plan
from tests.conftest import problems, scaled_examples

REL = 1e-9
SCHEDULES = {
    "gpipe": TrainingSpec("gpipe", 3),
    "1f1b": TrainingSpec("1f1b", 4),
    "interleaved": TrainingSpec("interleaved", 4, virtual_stages=2),
}


def _dag(n: int, seed: int, density: float = 0.3) -> Graph:
    """A random DAG: a chain with extra forward edges, shared weights, random stash and
    backward work, so blocks cut several tensors."""
    rng = np.random.default_rng(seed)
    edges = [(i, i + 1) for i in range(n - 1)]
    edges += [(i, j) for i in range(n) for j in range(i + 2, n) if rng.random() < density]
    params = [(f"w{i}", float(rng.random() * 4 + 0.5), [i]) for i in range(n)]
    params.append(("shared", float(rng.random() * 3), [0, n - 1]))
    return Graph.build(
        [f"v{i}" for i in range(n)],
        rng.random(n) * 2,
        rng.random(n) * 3,
        edges,
        params=params,
        work_backward=rng.random(n) * 4,
        stash=rng.random(n) * 5,
    )


def _placements(cluster: Cluster, k: int):
    if cluster.homogeneous:
        return [None]
    return [np.array(p) for p in itertools.permutations(range(cluster.devices), k)]


def _brute(g: Graph, cluster: Cluster, spec: TrainingSpec, k: int) -> float:
    """The least T over every valid plan of at most k blocks and every placement."""
    best = math.inf
    for a in all_assignments(g, k):
        for dev in _placements(cluster, k):
            c = training_cost(g, cluster, a, spec, k=k, placement=dev)
            if c.valid:
                best = min(best, c.iteration_time)
    return best


def _solve(g, cluster, spec, **kw):
    return solve_training_cpsat(g, cluster, spec, time_limit=60, workers=2, **kw)


def _largest_stage_memory(g, cluster, spec, k) -> float:
    free = _solve(g, replace(cluster, capacity=None), spec)
    assert free.optimal
    cost = training_cost(g, cluster, free.assignment, spec, k=k, placement=free.placement)
    return max(s.memory for s in cost.stages), free.iteration_time


def _check_exact(g, cluster, spec, k) -> float:
    best = _brute(g, cluster, spec, k)
    res = _solve(g, cluster, spec)
    if math.isinf(best):
        assert res.infeasible and res.assignment is None
        return best
    assert res.optimal, res.stats
    assert res.iteration_time == pytest.approx(best, rel=REL)
    assert res.lower <= best * (1 + REL)
    again = training_cost(g, cluster, res.assignment, spec, k=k, placement=res.placement)
    assert again.valid and again.iteration_time == res.iteration_time
    return best


# ---------------------------------------------------------------- vs brute force
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize(("n", "k", "seed"), [(5, 4, 0), (7, 3, 1), (8, 3, 2), (6, 4, 3)])
def test_equals_brute_force_and_memory_binds(schedule, n, k, seed):
    spec = SCHEDULES[schedule]
    g = _dag(n, seed)
    free = Cluster("c", k, link_bandwidth=2.0)
    used, loose_T = _largest_stage_memory(g, free, spec, k)
    assert _check_exact(g, free, spec, k) == pytest.approx(loose_T, rel=REL)
    tight = replace(free, capacity=0.85 * used)
    best = _check_exact(g, tight, spec, k)
    assert best > loose_T * (1 + 1e-6)  # the memory binds: the optimum moves


def test_position_decides_the_memory_under_1f1b():
    """1F1B's stage i keeps min(m, p - i) microbatches: at the least capacity any plan fits
    (found by brute force), the solver's plan fits with exactly those counts."""
    g = _dag(6, 11, density=0.0)
    spec = TrainingSpec("1f1b", 8)
    cl = Cluster("c", 3, link_bandwidth=4.0)
    least = min(
        max(s.memory for s in training_cost(g, cl, a, spec, k=3).stages)
        for a in all_assignments(g, 3)
    )
    tight = replace(cl, capacity=least * (1 + 1e-9))
    _check_exact(g, tight, spec, 3)
    res = _solve(g, tight, spec)
    stages = training_cost(g, tight, res.assignment, spec, k=3).stages
    assert [s.inflight for s in stages] == [float(len(stages) - i) for i in range(len(stages))]
    assert [s.block for s in stages] == list(range(3 - len(stages), 3))  # empty blocks first


def _two_hosts(k: int, capacity: float | None = None) -> Cluster:
    """Two groups of devices with different compute and a slow link between them."""
    half = k // 2
    topo = Topology(
        (tuple(range(half)), tuple(range(half, k))),
        ("a", "b"),
        ((4.0, 0.0), (4.0, 0.0)),
        (0.5, 0.0),
        capacity=tuple([capacity] * half + [capacity and 1.5 * capacity] * (k - half)),
        compute=tuple([1.0] * half + [2.5] * (k - half)),
    )
    return Cluster("h", k, link_bandwidth=4.0, compute=1.0, capacity=capacity, topology=topo)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("seed", [21, 22])
def test_heterogeneous_placement_equals_brute_force(schedule, seed):
    spec = SCHEDULES[schedule]
    g = _dag(5, seed)
    free = _two_hosts(3)
    best_free = _check_exact(g, free, spec, 3)
    res = _solve(g, free, spec)
    used = max(
        s.memory
        for s in training_cost(g, free, res.assignment, spec, placement=res.placement).stages
    )
    tight = _two_hosts(3, capacity=0.55 * used)  # 0.55 on host a, 0.825 on host b
    best_tight = _check_exact(g, tight, spec, 3)
    assert best_free * (1 + 1e-6) < best_tight < math.inf


# ---------------------------------------------------------------- vs the training DP
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_equals_the_training_dp_on_chains(schedule):
    spec = SCHEDULES[schedule]
    g = _dag(30, 5, density=0.0)
    cl = Cluster("c", 4, link_bandwidth=3.0)
    used, _ = _largest_stage_memory(g, cl, spec, 4)
    values = []
    for cap in (None, 0.97 * used, 0.9 * used, 0.5 * used):
        c = replace(cl, capacity=cap)
        dp = exact_training_plan(g, c, 4, spec)
        res = _solve(g, c, spec)
        if dp.assignment is None:  # proven infeasible by both
            assert math.isinf(dp.lower) and res.infeasible
            continue
        assert dp.optimal and res.optimal
        assert res.iteration_time == pytest.approx(dp.value, rel=1e-6)
        assert res.lower <= dp.value * (1 + REL) and dp.lower <= res.iteration_time * (1 + REL)
        values.append(res.iteration_time)
    assert len(values) >= 2 and values[1] > values[0] * (1 + 1e-6)  # the memory binds


# ---------------------------------------------------------------- the bound, property
SPECS = [
    TrainingSpec("gpipe", 3),
    TrainingSpec("1f1b", 4),
    TrainingSpec("1f1b", 1),
    TrainingSpec("interleaved", 4, virtual_stages=2),
    TrainingSpec("interleaved", 2, virtual_stages=3),
]


@settings(max_examples=scaled_examples(20))
@given(
    problems(max_nodes=6, max_k=3),
    st.integers(0, 2**31),
    st.sampled_from([None, 0.5, 0.8]),
    st.sampled_from(range(len(SPECS))),
    st.floats(0.001, 0.05),
)
def test_bound_never_above_the_optimum(problem, seed, tight, which, limit):
    g0, cl0 = problem
    rng = np.random.default_rng(seed)
    g = replace(g0, work_backward=rng.random(g0.n) * 3, stash=rng.random(g0.n) * 4)
    spec, k = SPECS[which], cl0.devices
    one = training_cost(g, replace(cl0, capacity=None), np.zeros(g.n, int), spec, k=k)
    cl = replace(cl0, capacity=None if tight is None else tight * one.stages[0].memory or None)
    best = _brute(g, cl, spec, k)
    full = solve_training_cpsat(g, cl, spec, time_limit=30, workers=1)
    cut = solve_training_cpsat(g, cl, spec, time_limit=limit, workers=1)  # may stop early
    for res in (full, cut):
        assert res.lower <= best * (1 + REL) + 1e-12
        if res.assignment is not None:
            assert res.iteration_time >= best * (1 - REL)
    if math.isinf(best):
        assert full.infeasible
    else:
        assert full.optimal and full.iteration_time == pytest.approx(best, rel=REL)


# ---------------------------------------------------------------- hints, upper, progress
def test_hint_with_empty_blocks_last_is_taken_shifted():
    g = _dag(7, 8)
    cl = Cluster("c", 4, link_bandwidth=2.0)
    spec = TrainingSpec("1f1b", 6)
    hint = np.array([0, 0, 0, 1, 1, 1, 1])  # two empty blocks, last
    T_hint = training_cost(g, cl, hint, spec, k=4).iteration_time
    built_too_late = solve_training_cpsat(g, cl, spec, time_limit=1e-9, hint=hint)
    assert built_too_late.status == "NOT_SOLVED" and not built_too_late.optimal
    assert built_too_late.assignment.tolist() == [2, 2, 2, 3, 3, 3, 3]  # empty blocks first
    assert built_too_late.iteration_time == pytest.approx(T_hint, rel=1e-12)
    res = _solve(g, cl, spec, hint=hint)
    assert res.optimal and res.iteration_time <= T_hint * (1 + 1e-12)
    assert res.iteration_time == pytest.approx(_brute(g, cl, spec, 4), rel=REL)


def test_invalid_hint_is_ignored_and_upper_cuts_honestly():
    g = _dag(6, 9)
    cl = Cluster("c", 3, link_bandwidth=2.0)
    spec = TrainingSpec("gpipe", 4)
    best = _brute(g, cl, spec, 3)
    backwards = np.array([2, 2, 1, 1, 0, 0])  # breaks the order edges
    res = _solve(g, cl, spec, hint=backwards)
    assert res.optimal and res.iteration_time == pytest.approx(best, rel=REL)
    # an upper bound below the optimum (no plan known): nothing found, the bound stays <= it
    low = _solve(g, cl, spec, upper=0.9 * best)
    assert low.assignment is None and not low.infeasible
    assert low.lower <= 0.9 * best


class _Recorder:
    def __init__(self):
        self.updates: list[tuple[float, float]] = []

    def note(self, text: str) -> None:
        pass

    def update(self, objective: float, bound: float, elapsed: float | None = None) -> None:
        self.updates.append((objective, bound))


def test_progress_reports_re_priced_incumbents():
    g = _dag(8, 10)
    cl = Cluster("c", 4, link_bandwidth=2.0)
    spec = TrainingSpec("1f1b", 8)
    rec = _Recorder()
    res = _solve(g, cl, spec, progress=rec)
    assert rec.updates and rec.updates[-1][0] == res.iteration_time
    for objective, bound in rec.updates:
        assert bound <= res.iteration_time * (1 + REL) and objective >= res.iteration_time
