"""The stage-sum training bound (docs/training.md, "The stage-sum training bound"): its value by
hand on one operator, below the brute-force optimum of the joint training space, and the plans
its interval solves give the upper programme."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from solver.cli.solve import print_joint_plan
from solver.core.cluster import Cluster
from solver.core.result import OPTIMAL
from solver.core.training import TrainingSpec
from solver.joint import training as jt
from solver.joint.planner import JointSearch
from solver.joint.segment import make_segment
from solver.joint.training_bound import STAGE_SUM, StageSumPricer, interval_model
from solver.spmd.model import from_proto
from solver.spmd.program import Planner, evaluate
from solver.spmd.training import TrainingSpec as ShardTraining
from tests.joint.test_planner import two_hosts
from tests.joint.test_training import brute_force, chain_model, flat_two


def one_matmul(rows: int = 4, width: int = 6):
    """y = x[rows, width] @ w[width, width], random weights."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, width])
    w = numpy_helper.from_array(
        np.random.default_rng(5).standard_normal((width, width)).astype(np.float32), "w"
    )
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "one", [x], [y], [w]
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def pricer_of(sm, cluster, spec, memory=None, stride: int = 1) -> StageSumPricer:
    search = JointSearch(sm, cluster, memory, "joint", math.inf, None, 0)
    search.cuts = jt.thinned(search.cuts, stride)
    pricer = StageSumPricer(jt.TrainingSearch(search, spec))
    pricer.price_all(math.inf)
    return pricer


def test_the_bound_by_hand_on_one_matmul():
    """One MatMul on 2 flat devices, compute-bound: on both devices (w split by columns, or
    the contraction split: no sync, its partial output not reduced in an interval) the program
    is 2 x F / 2 (forward, and dW only: x is a model input), on one 2 x F; T >= b x F + a x F
    with F = flops / c, which the plan on both devices meets."""
    sm = from_proto(one_matmul(), {})
    c = Cluster("flat-two", 2, compute=1e9, memory_bandwidth=1e15, link_bandwidth=1e8)
    spec = TrainingSpec("1f1b", 4)
    a, b = spec.time_weights
    f = 2 * 4 * 6 * 6 / 1e9
    pricer = pricer_of(sm, c, spec)
    # 2 sub-mesh kinds (one device, both devices) x 2 sync weights, every solve proven
    assert pricer.stats["sources"] == {"exact": 4}
    got = pricer.bound(cap=10.0).value
    assert got == pytest.approx((a + b) * f, rel=2e-4)
    assert got <= (a + b) * f * (1 + 1e-12)
    plan = jt.plan_joint_training(sm, c, spec, time_limit=60)
    assert plan.objective == pytest.approx((a + b) * f, rel=1e-9)
    assert plan.status == OPTIMAL
    assert plan.stats["bounds"][STAGE_SUM] == pytest.approx(got)


def test_the_sync_weight_enters_the_interval_bound_by_hand():
    """x[8, 2] @ w[2, 2] on 2 devices with a slow link: splitting the rows (data parallel)
    halves the compute and pays the AllReduce of dW; the interval bound at sync weight mu is
    min over the strategies of program + mu sync, checked against every strategy priced."""
    sm = from_proto(one_matmul(rows=8, width=2), {})
    c = Cluster("flat-two", 2, compute=1e9, memory_bandwidth=1e15, link_bandwidth=1e6)
    spec = TrainingSpec("gpipe", 2)
    pricer = pricer_of(sm, c, spec)
    seg = make_segment(sm, 0, 1)
    m = next(i for i, mesh in enumerate(pricer.search.meshes) if mesh.size == 2)
    planner = Planner(interval_model(seg), pricer.search.meshes[m].mesh, c, ShardTraining(4.0))
    priced = []
    for sh in planner.candidates(0):
        prog = evaluate(planner, {"mm": sh.strategy})
        sync = math.fsum(prog.training.sync_time)
        priced.append((prog.objective - sync, sync))
    assert any(s > 0 for _, s in priced)  # some strategy synchronises
    for weighted in (False, True):
        mu = pricer.mu(m) if weighted else 0.0
        want = min(p + mu * s for p, s in priced)
        got = pricer.bounds[pricer.interval_key(0, m, weighted)].value
        assert got == pytest.approx(want, rel=1e-6)
    a, b = spec.time_weights
    assert pricer.mu(m) == pytest.approx(1 / (a + b))  # w = 2 / 2


@pytest.mark.parametrize(
    ("schedule", "m", "cluster"),
    [
        ("gpipe", 4, "two-hosts"),
        ("1f1b", 4, "two-hosts"),
        ("1f1b", 1, "flat-two"),
        ("gpipe", 2, "flat-two"),
    ],
)
def test_the_bound_is_below_brute_force(schedule, m, cluster, monkeypatch):
    """Every plan of the space (every cut, sub-mesh sequence and strategy): the stage-sum bound
    is at most the least T, with and without enumerating the pairs' strategies."""
    sm = from_proto(chain_model(batch=8, width=6, seed=2), {})
    c = two_hosts() if cluster == "two-hosts" else flat_two()
    spec = TrainingSpec(schedule, m, optimizer_state=4.0)
    want = brute_force(sm, c, spec)
    got = pricer_of(sm, c, spec).bound(cap=10 * want).value
    assert 0 < got <= want * (1 + 1e-9)
    monkeypatch.setattr(jt, "EVERY_COMBINATION_UP_TO", 0)
    plan = jt.plan_joint_training(sm, c, spec, time_limit=60)
    assert plan.stats["bounds"][STAGE_SUM] == pytest.approx(min(got, plan.objective), rel=2e-4)
    assert plan.lower_bound <= want * (1 + 1e-9) <= plan.objective * (1 + 2e-9)


def test_the_interval_plans_are_offered_to_the_upper_programme():
    """The interval solves' plans put together are plans of the segment (one strategy per
    operator) that the upper programme prices."""
    sm = from_proto(chain_model(), {})
    c = two_hosts()
    pricer = pricer_of(sm, c, TrainingSpec("1f1b", 4))
    s = pricer.search
    m = next(i for i, mesh in enumerate(s.meshes) if mesh.size == 2)
    plans = pricer.segment_plans(0, len(s.cuts) - 1, m)
    assert plans
    for plan in plans:
        assert list(plan) == [op.name for op in sm.ops]


def test_an_optimal_plan_over_every_second_cut_names_the_restricted_space(capsys):
    """cut_stride 2 keeps every second cut point: the status names that space, not the joint
    space, and the plan's stats say the stride."""
    sm = from_proto(chain_model(), {})
    plan = jt.plan_joint_training(sm, flat_two(), TrainingSpec("1f1b", 4), cut_stride=2)
    assert plan.status == OPTIMAL
    assert plan.stats["cut_stride"] == 2
    print_joint_plan(plan)
    out = capsys.readouterr().out
    assert "OPTIMAL (optimal over joint space, one in every 2 cut points)" in out
    full = jt.plan_joint_training(sm, flat_two(), TrainingSpec("1f1b", 4))
    assert "cut_stride" not in full.stats
    print_joint_plan(full)
    assert "(optimal over joint space)" in capsys.readouterr().out


class RecordingProgress:
    """A progress that records what the planner reports (SolveProgress compares the bound)."""

    def __init__(self) -> None:
        self.updates: list[tuple] = []
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def update(self, objective: float, bound: float, elapsed=None) -> None:
        self.updates.append((objective, bound))


def test_the_progress_gets_numbers_and_the_bound_step_is_noted():
    """Every update carries a number for the bound (-inf: none yet), as SolveProgress
    compares it with its own; the stage-sum bound's solves are named."""
    progress = RecordingProgress()
    sm = from_proto(chain_model(), {})
    jt.plan_joint_training(sm, flat_two(), TrainingSpec("1f1b", 4), progress=progress)
    assert progress.updates
    assert all(isinstance(b, float) for _, b in progress.updates)
    assert "stage-sum bound: exact sharding of each cut interval" in progress.notes


def test_small_intervals_are_solved_when_the_fair_share_is_under_a_second():
    """A deadline that leaves each interval much less than SOLVE_MIN_SECONDS: the intervals are
    still solved exactly (each takes a fraction of a second) while the time lasts, and once it
    is gone an interval keeps its least own time (never a claim without a solve)."""
    sm = from_proto(chain_model(batch=8, width=6, seed=2), {})
    search = JointSearch(sm, two_hosts(), None, "joint", math.inf, None, 0)
    spec = TrainingSpec("1f1b", 4, optimizer_state=4.0)
    pricer = StageSumPricer(jt.TrainingSearch(search, spec))
    ticks = iter(np.arange(0.0, 1000.0, 0.01))  # each clock reading 10 ms later
    pricer.price_all(deadline=0.5, clock=lambda: float(next(ticks)))
    sources = pricer.stats["sources"]
    assert sources.get("exact", 0) >= 1
    full = pricer_of(sm, two_hosts(), spec)
    for key, got in pricer.bounds.items():
        assert got.value <= full.bounds[key].value * (1 + 1e-9)
        if got.source == "least own time":
            assert got.strategies is None
