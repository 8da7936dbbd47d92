"""The single dispatch of the back ends (solver.backends.dispatch): each command's table names
the kinds it takes, and a call through it gives what the kind's own back end gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from solver.backends import dispatch
from solver.backends.schedule import simulate_training_plan
from solver.backends.simulate import simulate
from solver.backends.simulate_joint import simulate_joint
from solver.core.cluster import load_cluster
from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.training import TrainingSpec, training_cost
from solver.frontends import load_graph
from solver.frontends.onnx.modelgen import transformer
from solver.joint.stages import stage_programs
from solver.pipeline.registry import certified_bound, solve
from solver.spmd.mesh import mesh_on
from solver.spmd.model import load_model
from solver.spmd.program import Planner
from solver.spmd.program import evaluate as evaluate_program
from solver.spmd.propagate import propagate
from solver.spmd.report import plan_dict
from tests.backends.test_export import random_mlp
from tests.joint.test_stages import build_plan, halves, two_groups


def test_every_command_names_the_kinds_it_takes():
    assert set(dispatch.EVALUATE) == {"pipeline", "spmd", "joint"}
    assert set(dispatch.SIMULATE) == {"pipeline", "joint"}  # no simulator of one SPMD program
    assert set(dispatch.EXPORT) == {"pipeline", "spmd", "joint"}
    assert dispatch.PipelinePlan.kind == "pipeline" and dispatch.SpmdPlan.kind == "spmd"
    assert dispatch.JointPlanFiles.kind == "joint"


# ---------------------------------------------------------------------- pipeline
@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    path = random_mlp(tmp_path_factory.mktemp("dispatch") / "mlp.onnx", seed=3)
    g = load_graph(path)
    cluster = load_cluster("ipu-pod", devices=3)
    plan = solve(g, cluster, "time")
    return dispatch.PipelinePlan(g, cluster, plan.assignment, model_path=path)


def test_pipeline_plan_through_the_dispatch(pipeline, tmp_path):
    p = pipeline
    ev = dispatch.evaluate(p)
    assert ev.kind == "pipeline" and ev.valid
    assert ev.objective == evaluate(p.graph, p.cluster, p.assignment).objective
    options = dispatch.SimulateOptions(requests=20, mode="sequential")
    got = dispatch.simulate(p, options)
    want = simulate(p.graph, p.cluster, p.assignment, requests=20, mode="sequential")
    assert got.kind == "pipeline" and got.sim.to_dict() == want.to_dict()
    out = dispatch.export(p, dispatch.ExportOptions(tmp_path / "out", verify=True, seed=1))
    assert out.kind == "pipeline" and out.report["verify"]["ok"]
    assert json.loads((tmp_path / "out/stages.json").read_text()) == out.report
    assert (tmp_path / "out/annotated.onnx").is_file()


def test_a_bad_pipeline_plan_is_invalid_not_priced_as_valid(pipeline):
    p = pipeline
    backwards = dispatch.PipelinePlan(p.graph, p.cluster, p.assignment.max() - p.assignment)
    ev = dispatch.evaluate(backwards)
    assert not ev.valid and ev.violations  # the blocks now run against the graph order


# ---------------------------------------------------------------------- spmd
@pytest.fixture(scope="module")
def spmd(pipeline):
    sm = load_model(pipeline.model_path)
    cluster = load_cluster("ipu-pod", devices=2)
    planner = Planner(sm, mesh_on(cluster, [0, 1], (2,)), cluster)
    strategies = propagate(planner, {"mm1": ((1, 2), (2, 1))})  # a split contraction
    program = evaluate_program(planner, strategies)
    record = plan_dict(planner, program, "given", "FEASIBLE")
    return dispatch.SpmdPlan(planner, strategies, record)


def test_spmd_plan_through_the_dispatch(spmd, pipeline, tmp_path):
    ev = dispatch.evaluate(spmd)
    assert ev.kind == "spmd" and ev.valid
    assert ev.objective == spmd.record["objective"] > 0
    options = dispatch.ExportOptions(tmp_path / "out", inputs=(pipeline.model_path,))
    out = dispatch.export(spmd, options)
    assert sorted(p.name for p in out.out_dir.iterdir()) == [
        "annotated.onnx",
        "plan.json",
        "strategies.yaml",
    ]
    assert json.loads((tmp_path / "out/plan.json").read_text())["strategies"]["mm1"] == [
        [1, 2],
        [2, 1],
    ]
    before = (tmp_path / "out/plan.json").read_bytes()
    with pytest.raises(MtppError, match=r"out: folder exists and is not empty; choose a new --out"):
        dispatch.export(spmd, options)  # the folder is not replaced without force
    assert (tmp_path / "out/plan.json").read_bytes() == before


def test_a_kind_without_a_back_end_is_refused_in_one_line(spmd):
    with pytest.raises(MtppError) as e:
        dispatch.simulate(spmd)
    assert str(e.value) == "mtpp simulate takes pipeline or joint plans, not spmd plans"


# ---------------------------------------------------------------------- joint
@pytest.fixture(scope="module")
def joint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dispatch_joint")
    m, _ = transformer(layers=2, hidden=64, heads=4, seq=16, vocab=100, batch=2, seed=7)
    path = folder / "t.onnx"
    onnx.save(m, path)
    sm = load_model(path)
    plan = build_plan(sm, two_groups(), halves(sm), path=str(path))
    return dispatch.JointPlanFiles(plan, sm, Path(path))


def test_joint_plan_through_the_dispatch(joint, tmp_path):
    ev = dispatch.evaluate(joint)
    assert ev.kind == "joint" and ev.valid and ev.objective == joint.plan.objective
    got = dispatch.simulate(joint, dispatch.SimulateOptions(requests=12))
    want = simulate_joint(joint.plan, joint.sm, requests=12)
    assert got.kind == "joint" and got.detail.stages == want.stages
    assert got.sim.period == pytest.approx(joint.plan.objective, rel=1e-9)
    out = dispatch.export(joint, dispatch.ExportOptions(tmp_path / "out", verify=True, seed=2))
    assert out.report["verify"]["ok"], out.report["verify"]["failure"]
    assert [s["folder"] for s in out.report["stages"]] == ["stage_0", "stage_1"]
    programs = stage_programs(joint.plan, joint.sm)
    assert [s["program_time"] for s in out.report["stages"]] == [
        p.program.objective for p in programs
    ]


@pytest.mark.parametrize(
    "option, value", [("mode", "sequential"), ("overlap", True), ("latency", 1e-6)]
)
def test_a_joint_plan_refuses_the_pipeline_simulation_options(joint, option, value):
    options = dispatch.SimulateOptions(requests=5, **{option: value})
    flag = "--" + option
    with pytest.raises(MtppError) as e:
        dispatch.simulate(joint, options)
    assert str(e.value) == f"{flag} does not apply to a joint plan; drop it"


def test_evaluate_finds_a_joint_stage_over_the_memory_limit(joint):
    tight = dispatch.JointPlanFiles(joint.plan, joint.sm, joint.model_path)
    limit = joint.plan.memory_limit
    try:
        joint.plan.memory_limit = 1.0  # one byte per device: no stage fits
        ev = dispatch.evaluate(tight)
    finally:
        joint.plan.memory_limit = limit
    assert [v.split(":")[0] for v in ev.violations] == ["stage 0", "stage 1"]
    assert all(re.search(r"\d+ bytes per device exceed the limit 1$", v) for v in ev.violations)
    assert not ev.valid and np.isfinite(ev.objective)


# ---------------------------------------------------------------------- evaluate's status
def test_pipeline_evaluation_recomputes_the_bound_and_checks_the_claim(pipeline):
    p = pipeline
    ev = dispatch.evaluate(p)  # no file content: nothing claimed
    bound = certified_bound(p.graph, p.cluster, 10.0).value
    assert ev.plan.lower_bound == pytest.approx(min(bound, ev.objective), rel=1e-12)
    assert ev.claim["claim"] == "none (the file states no status or bound)"
    assert ev.plan.status == ("OPTIMAL" if bound >= ev.objective * (1 - 1e-6) else "FEASIBLE")
    too_high = {"status": "FEASIBLE", "lower_bound": ev.objective * 2, "objective": ev.objective}
    claimed = dispatch.PipelinePlan(p.graph, p.cluster, p.assignment, data=too_high)
    refused = dispatch.evaluate(dispatch.PipelinePlan(**{**vars(claimed), "claims_apply": True}))
    assert refused.claim_refused and refused.claim["claim"].startswith("invalid: ")
    elsewhere = dispatch.evaluate(claimed)  # made for another cluster: not checked
    assert not elsewhere.claim_refused
    assert elsewhere.claim["claim"].startswith("not applicable: evaluated on another cluster")


def test_an_invalid_joint_plan_is_invalid_and_its_file_status_kept_as_claimed(joint):
    limit, status = joint.plan.memory_limit, joint.plan.status
    try:
        joint.plan.memory_limit = 1.0
        ev = dispatch.evaluate(joint)
    finally:
        joint.plan.memory_limit = limit
    assert ev.plan.status == "INVALID" and joint.plan.status == status  # the plan read is kept
    assert ev.claim == {"claimed_status": status, "used": False}
    assert dispatch.evaluate(joint).claim == {"claimed_status": status, "used": True}


# ---------------------------------------------------------------------- training plans
def test_a_training_plan_is_priced_and_simulated_under_its_schedule(pipeline):
    p, spec = pipeline, TrainingSpec("gpipe", 4)
    plan = dispatch.PipelinePlan(p.graph, p.cluster, p.assignment, training=spec)
    cost = training_cost(p.graph, p.cluster, p.assignment, spec)
    ev = dispatch.evaluate(plan)
    assert ev.objective == cost.iteration_time == ev.plan.objective
    assert ev.valid == cost.valid and ev.plan.training.spec == spec
    got = dispatch.simulate(plan)
    want = simulate_training_plan(p.graph, p.cluster, p.assignment, spec)
    assert got.kind == "pipeline" and got.sim is None
    assert got.detail.to_dict() == want.to_dict() and got.valid == want.valid


@pytest.mark.parametrize(
    "option, value", [("requests", 7), ("mode", "sequential"), ("overlap", True)]
)
def test_a_training_plan_refuses_the_request_simulation_options(pipeline, option, value):
    p = pipeline
    plan = dispatch.PipelinePlan(p.graph, p.cluster, p.assignment, training=TrainingSpec())
    with pytest.raises(MtppError) as e:
        dispatch.simulate(plan, dispatch.SimulateOptions(**{option: value}))
    assert str(e.value) == f"--{option} does not apply to a training plan; drop it"
