"""The schedule simulator against the training model: GPipe's exact makespan, the cases where
the simulated makespan equals T, the bounds that always hold, and the in-flight counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.backends.schedule import (
    gantt_chart,
    simulate_schedule,
    simulate_training,
    simulate_training_plan,
    stage_order,
)
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.training import TrainingSpec, training_cost
from tests.conftest import scaled_examples


@st.composite
def stages(draw, max_p: int = 5, max_m: int = 8):
    """Random stage times (F, B), a schedule and microbatches."""
    p = draw(st.integers(1, max_p))
    m = draw(st.integers(1, max_m))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    F = rng.random(p) * rng.choice([0.5, 1.0, 3.0])
    B = rng.random(p) * rng.choice([0.5, 2.0])
    return F, B, m


def _lower(F, B, m, v: int = 1) -> float:
    """max(sum t, max over s of (t_0 + ... + t_{s-1}) / v + m t_s): no schedule beats it."""
    t = F + B
    return max(t.sum(), max(t[:s].sum() / v + m * t[s] for s in range(len(t))))


@settings(max_examples=scaled_examples(100))
@given(stages())
def test_gpipe_makespan_is_two_flow_shops(case):
    F, B, m = case
    spec = TrainingSpec("gpipe", m)
    run = simulate_schedule(F, B, spec)
    exact = F.sum() + (m - 1) * F.max() + B.sum() + (m - 1) * B.max()
    assert run.makespan == pytest.approx(exact, rel=1e-12)
    assert run.makespan >= spec.iteration_time(F + B) * (1 - 1e-12)  # so never below T


@settings(max_examples=scaled_examples(100))
@given(stages(), st.sampled_from(["gpipe", "1f1b"]))
def test_makespan_bounds_and_inflight(case, schedule):
    F, B, m = case
    spec = TrainingSpec(schedule, m)
    run = simulate_schedule(F, B, spec)
    assert run.makespan >= _lower(F, B, m) * (1 - 1e-12)
    assert [s.peak_inflight for s in run.stages] == spec.inflight(len(F)).tolist()
    assert [s.busy for s in run.stages] == pytest.approx((m * (F + B)).tolist())
    if (F + B)[-1] == (F + B).max():  # the last stage is the slowest: the bound is T
        assert run.makespan >= spec.iteration_time(F + B) * (1 - 1e-12)
    if schedule == "1f1b":  # the slotted timetable of docs/training.md
        assert run.makespan <= (m + len(F) - 1) * (F + B).max() * (1 + 1e-12)


@settings(max_examples=scaled_examples(100))
@given(stages())
def test_1f1b_equals_t_when_stage_times_are_equal(case):
    F, _, m = case
    B = 1.0 - np.minimum(F, 1.0)  # t_i = 1 on every stage, F and B differ between stages
    spec = TrainingSpec("1f1b", m)
    run = simulate_schedule(F, B, spec)
    assert run.makespan == pytest.approx(spec.iteration_time(F + B), rel=1e-12)


@settings(max_examples=scaled_examples(60))
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.floats(0.01, 2), st.floats(0, 2))
def test_every_schedule_equals_t_with_equal_forward_and_backward(p, groups, v, f, b):
    m = p * groups
    for spec in (
        TrainingSpec("gpipe", m),
        TrainingSpec("1f1b", m),
        TrainingSpec("interleaved", m, virtual_stages=v),
    ):
        run = simulate_schedule(np.full(p, f), np.full(p, b), spec)
        assert run.makespan == pytest.approx(spec.iteration_time(np.full(p, f + b)), rel=1e-12)


@settings(max_examples=scaled_examples(60))
@given(stages(max_p=4, max_m=3), st.integers(2, 3))
def test_interleaved_inflight_is_megatrons(case, v):
    F, B, groups = case
    m = len(F) * groups
    spec = TrainingSpec("interleaved", m, virtual_stages=v)
    run = simulate_schedule(F, B, spec)
    assert [s.peak_inflight for s in run.stages] == pytest.approx(spec.inflight(len(F)).tolist())
    assert run.makespan >= _lower(F, B, m, v) * (1 - 1e-12)


def test_1f1b_can_beat_and_miss_t():
    """T is not the 1F1B makespan in general: a slow first stage finishes before T, and
    uneven forwards and backwards can end after it."""
    spec = TrainingSpec("1f1b", 4)
    early = simulate_schedule(np.array([10.0, 1.0]), np.array([10.0, 1.0]), spec)
    assert early.makespan == 80.0  # stage 0 busy from start to end: m t_0
    assert spec.iteration_time(np.array([20.0, 2.0])) == 82.0
    late_spec = TrainingSpec("1f1b", 2)
    late = simulate_schedule(np.array([1.0, 5.0, 1.0]), np.array([5.0, 1.0, 2.0]), late_spec)
    assert late.makespan == 22.0
    assert late_spec.iteration_time(np.array([6.0, 6.0, 3.0])) == 21.0


def test_1f1b_order():
    spec = TrainingSpec("1f1b", 4)
    order = [f"{s.kind}{s.microbatch}" for s in stage_order(spec, 3, 0)]
    assert order == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    last = [f"{s.kind}{s.microbatch}" for s in stage_order(spec, 3, 2)]
    assert last == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


def test_interleaved_needs_whole_groups_of_microbatches():
    spec = TrainingSpec("interleaved", 3, virtual_stages=2)
    with pytest.raises(MtppError) as e:
        simulate_schedule(np.ones(2), np.ones(2), spec)
    assert str(e.value) == (
        "the interleaved schedule needs the microbatches (3) to be a multiple of the stages (2)"
    )


def test_simulated_memory_is_the_plans(tmp_path):
    rng = np.random.default_rng(3)
    n = 6
    g = Graph.build(
        [f"v{i}" for i in range(n)],
        rng.random(n),
        rng.random(n) * 4,
        [(i, i + 1) for i in range(n - 1)],
        params=[(f"w{i}", float(rng.random() * 5), [i]) for i in range(n)],
        stash=rng.random(n) * 3,
    )
    cl = Cluster("c", 3, link_bandwidth=2.0)
    for spec in (TrainingSpec("gpipe", 5), TrainingSpec("1f1b", 5)):
        cost = training_cost(g, cl, np.array([0, 0, 1, 1, 2, 2]), spec, k=3)
        run = simulate_training(cost)
        got = [s.peak_memory for s in run.stages]
        assert got == pytest.approx([s.memory for s in cost.stages], rel=1e-12)
    png = tmp_path / "gantt.png"
    gantt_chart(run, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@settings(max_examples=scaled_examples(25), deadline=None)
@given(st.integers(0, 2**31), st.integers(2, 7), st.sampled_from(["gpipe", "1f1b"]))
def test_training_plan_simulation_against_its_model(seed, m, schedule):
    """simulate_training_plan's record: the proven relation of makespan and T holds for a
    random plan, and the simulated in-flight counts and memory are the model's."""
    rng = np.random.default_rng(seed)
    n = 7
    g = Graph.build(
        [f"v{i}" for i in range(n)],
        rng.random(n),
        rng.random(n) * 4,
        [(i, i + 1) for i in range(n - 1)],
        params=[(f"w{i}", float(rng.random() * 5), [i]) for i in range(n)],
        work_backward=rng.random(n) * 3,
        stash=rng.random(n) * 3,
    )
    cl = Cluster("c", 3, link_bandwidth=float(rng.uniform(0.5, 4)))
    a = np.sort(rng.integers(0, 3, n))
    spec = TrainingSpec(schedule, m)
    ts = simulate_training_plan(g, cl, a, spec)
    T = training_cost(g, cl, a, spec).iteration_time
    assert ts.iteration_time == T and ts.ratio == pytest.approx(ts.makespan / T, rel=1e-12)
    rel = ts.relation
    assert rel.lower * (1 - 1e-12) <= ts.makespan <= rel.upper * (1 + 1e-12)
    if schedule == "gpipe":
        assert ts.makespan == pytest.approx(rel.exact, rel=1e-12)
        assert ts.makespan >= T * (1 - 1e-12)
    for s in ts.stages:
        assert s.inflight_simulated == s.inflight_model
        assert s.memory_simulated == pytest.approx(s.memory_model, rel=1e-12)
        assert 0 < s.busy_fraction <= 1
    d = ts.to_dict()
    assert d["iteration_time"] == T and d["makespan"] == ts.makespan
    assert d["relation"]["rule"].startswith("GPipe" if schedule == "gpipe" else "1F1B")


def test_equal_stages_simulate_to_t():
    """Stages of equal F and equal B: the makespan is T for every schedule (docs/training.md)."""
    n = 6
    g = Graph.build(
        [f"v{i}" for i in range(n)], [1.0] * n, [0.0] * n, [(i, i + 1) for i in range(n - 1)]
    )
    cl = Cluster("c", 3, link_bandwidth=1.0)
    a = np.repeat(np.arange(3), 2)
    for spec in (
        TrainingSpec("gpipe", 4),
        TrainingSpec("1f1b", 5),
        TrainingSpec("interleaved", 6, virtual_stages=2),
    ):
        ts = simulate_training_plan(g, cl, a, spec)
        assert ts.makespan == pytest.approx(ts.iteration_time, rel=1e-12)
