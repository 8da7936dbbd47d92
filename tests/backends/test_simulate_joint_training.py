"""The schedule simulation of joint training plans (docs/backends.md, "Joint training plans"):
makespan against T by the documented relation, the gradient sync once per stage after its
last backward, the peak in-flight counts and memory against the plan's."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from solver.backends.simulate_joint import simulate_training_stages
from solver.core.training import TrainingSpec
from solver.joint.plan import JointTraining, TrainingStage


def training(schedule: str, m: int, forward, backward, sync, base=None, stash=None):
    """A JointTraining with these per-stage terms, T and memory as the planner computes them."""
    p = len(forward)
    spec = TrainingSpec(schedule, m, 1, 4.0)
    inflight = spec.inflight(p)
    base = [1000.0 * (i + 1) for i in range(p)] if base is None else base
    stash = [10.0 * (p - i) for i in range(p)] if stash is None else stash
    rows = tuple(
        TrainingStage(
            f,
            b,
            f + b,
            y,
            w,
            s,
            float(q),
            w + float(q) * s,
            None,
        )
        for f, b, y, w, s, q in zip(forward, backward, sync, base, stash, inflight, strict=True)
    )
    t = [r.time for r in rows]
    T = math.fsum(t) + (m - 1) * max(t) + max(sync)
    return JointTraining(schedule, m, 4.0, T, rows)


def devices(p: int) -> list[tuple[int, ...]]:
    return [(2 * i, 2 * i + 1) for i in range(p)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 3, 6])
def test_equal_stages_give_makespan_equal_to_t(schedule, p, m):
    tr = training(schedule, m, [0.3] * p, [0.7] * p, [0.25] * p)
    sim = simulate_training_stages(tr, devices(p))
    assert sim.makespan == pytest.approx(tr.iteration_time, rel=1e-12)
    assert sim.ratio == pytest.approx(1.0, rel=1e-12)


def test_1f1b_with_equal_t_and_sync_gives_t_even_when_f_and_b_differ():
    tr = training("1f1b", 5, [0.2, 0.5, 0.1], [0.8, 0.5, 0.9], [0.4, 0.4, 0.4])
    sim = simulate_training_stages(tr, devices(3))
    assert sim.makespan == pytest.approx(tr.iteration_time, rel=1e-12)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_random_stages_keep_the_documented_relation(schedule):
    rng = np.random.default_rng(7)  # fixed: the same instances every run
    for _ in range(60):
        p, m = int(rng.integers(1, 6)), int(rng.integers(1, 8))
        F, B = rng.uniform(0.1, 2.0, p), rng.uniform(0.1, 3.0, p)
        y = rng.uniform(0.0, 1.5, p)
        tr = training(schedule, m, F, B, y)
        sim = simulate_training_stages(tr, devices(p))
        rel = sim.relation
        # the sync after each stage's own last backward; stage 0 ends last
        ends = [s.pipeline_end for s in sim.stages]
        assert ends[0] == pytest.approx(sim.pipeline_makespan) and max(ends) == ends[0]
        assert sim.makespan == pytest.approx(max(e + r for e, r in zip(ends, y, strict=True)))
        assert sim.pipeline_makespan + y[0] - 1e-12 <= sim.makespan
        assert sim.makespan <= sim.pipeline_makespan + y.max() + 1e-12
        assert rel.lower - 1e-9 <= sim.makespan <= rel.upper + 1e-9
        pipe_T = tr.iteration_time - y.max()  # T without the sync
        if schedule == "gpipe":  # exact pipeline: (sum F + (m-1) max F) + (sum B + (m-1) max B)
            exact = F.sum() + (m - 1) * F.max() + B.sum() + (m - 1) * B.max()
            assert sim.pipeline_makespan == pytest.approx(exact)
            assert exact >= pipe_T - 1e-9
        else:
            assert sim.pipeline_makespan <= (m + p - 1) * (F + B).max() + 1e-9


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_peak_in_flight_and_memory_are_the_plans(schedule):
    p, m = 4, 3
    tr = training(schedule, m, [0.3, 0.2, 0.5, 0.1], [0.6, 0.9, 0.4, 0.3], [0.1, 0.0, 0.2, 0.05])
    sim = simulate_training_stages(tr, devices(p))
    expected = [m] * p if schedule == "gpipe" else [min(m, p - i) for i in range(p)]
    assert [s.inflight_simulated for s in sim.stages] == expected
    assert [s.inflight_model for s in sim.stages] == expected
    for s, r in zip(sim.stages, tr.stages, strict=True):
        assert s.memory_simulated == pytest.approx(r.memory)
        assert s.memory_simulated == pytest.approx(r.base + expected[s.stage] * r.stash)
    assert sim.valid and sim.violations == ()
    assert [s.devices for s in sim.stages] == devices(p)


def test_a_stage_over_its_capacity_is_a_violation():
    tr = training("gpipe", 2, [0.1, 0.1], [0.2, 0.2], [0.0, 0.0], base=[100.0, 100.0])
    rows = list(tr.stages)
    rows[1] = replace(rows[1], capacity=50.0)
    tr = JointTraining(tr.schedule, tr.microbatches, 4.0, tr.iteration_time, tuple(rows))
    sim = simulate_training_stages(tr, devices(2))
    assert not sim.valid
    assert sim.violations == ("stage 1: 120 bytes per device in the run exceed its capacity 50",)
