"""What a new user hit trying joint plans and clusters (helper J's QA pass): ``mtpp evaluate``
of a joint plan, plan files given to the wrong command, fp16 models and If nodes through
``export --verify``, and the warning when an exported pipeline plan is placed elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import llama
from solver.backends.export_joint import export_joint
from solver.backends.verify import compare, default_tolerance
from solver.cli import main
from solver.frontends.onnx.modelgen import transformer
from solver.joint.plan import save_joint_plan
from solver.spmd.config import from_attributes
from solver.spmd.model import load_model
from tests.badinput import assert_refused
from tests.joint.test_stages import build_plan, halves, two_groups

ROOT = Path(__file__).resolve().parents[2]


def run(*argv) -> int:
    """``mtpp argv`` (paths as strings); returns the exit code."""
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A random-weight 2-layer transformer, a joint plan of it on two hosts (halves, Megatron
    per stage) saved next to it, and a pipeline plan of the same model."""
    folder = tmp_path_factory.mktemp("qa")
    m, _ = transformer(layers=2, hidden=64, heads=4, seq=16, vocab=100, batch=2, seed=11)
    model = folder / "t.onnx"
    onnx.save(m, model)
    sm = load_model(model)
    plan = build_plan(sm, two_groups(), halves(sm), path=str(model))
    joint = folder / "joint.json"
    save_joint_plan(plan, joint)
    pipeline = folder / "pipe.json"
    assert run("solve", model, "-k", "2", "--method", "time", "-q", "--out", pipeline) == 0
    return model, joint, pipeline, plan


# ---------------------------------------------------------------------- mtpp evaluate
def test_evaluate_reprices_a_joint_plan(files, capsys):
    model, joint, _, plan = files
    capsys.readouterr()
    assert run("evaluate", model, joint, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "mtpp-joint-plan" and out["valid"] and out["repriced"]
    assert out["objective"] == plan.objective and out["violations"] == []
    assert [s["devices"] for s in out["stages"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert run("evaluate", joint) == 0  # alone: the plan names its model
    text = capsys.readouterr().out
    assert "re-priced" in text and "0-3" in text and "4-7" in text


def test_evaluate_refuses_a_tampered_joint_plan(files, capsys, tmp_path):
    model, joint, _, _ = files
    data = json.loads(Path(joint).read_text())
    data["stages"][1]["program_time"] *= 0.5
    data["stages"][1]["time"] = sum(
        data["stages"][1][k] for k in ("program_time", "io_in", "io_out")
    )
    data["objective"] = max(s["time"] for s in data["stages"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert_refused(capsys, ["evaluate", model, bad], r"bad.json: stage 1", watch=tmp_path)
    assert_refused(capsys, ["evaluate", model, joint, "--memory", "1KB"], "bytes per device")


@pytest.mark.parametrize("command", ["simulate", "evaluate", "export"])
def test_a_pipeline_plan_alone_is_refused_naming_the_fix(files, capsys, command, tmp_path):
    _, _, pipeline, _ = files
    argv = [command, pipeline] + (["--out", tmp_path / "x"] if command == "export" else [])
    assert_refused(
        capsys,
        argv,
        rf"pipe.json is a pipeline plan.*mtpp {command} GRAPH .*pipe.json$",
        watch=tmp_path,
    )


def test_export_takes_a_joint_plan_alone(files, capsys, tmp_path):
    _, joint, _, _ = files
    out = tmp_path / "stages"
    assert run("export", joint, "--out", out) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "README.txt",
        "manifest.json",
        "plan.json",
        "stage_0",
        "stage_1",
    ]
    assert (out / "plan.json").read_bytes() == Path(joint).read_bytes()


# ---------------------------------------------------------------------- verify tolerance
def test_default_tolerance_follows_the_type():
    assert default_tolerance(np.zeros(2, np.float32), 5.0) == pytest.approx(5e-4)
    assert default_tolerance(np.zeros(2, np.float32), 0.1) == pytest.approx(1e-4)
    assert default_tolerance(np.zeros(2, np.float16), 5.0) == pytest.approx(5e-2)
    assert default_tolerance(np.zeros(2, np.int64), 5.0) == 0.0
    assert default_tolerance(np.zeros(2, bool), 1.0) == 0.0
    ref = np.array([1, 2, 3], np.int64)
    assert compare(ref, ref, None)["ok"]
    assert not compare(ref, ref + np.array([0, 0, 1]), None)["ok"]  # integers: exact
    half = np.array([1.0, -2.0], np.float16)
    assert compare(half, half + np.float16(2e-3), None)["ok"]
    assert not compare(half.astype(np.float32), half + np.float16(2e-3), None)["ok"]


def test_fp16_model_verifies_through_the_chain(tmp_path):
    """A random-weight fp16 Llama: its stages differ from onnxruntime by a few half ulps
    (above the fp32 tolerance, which failed it before), far below the fp16 one."""
    shape = llama.LlamaShape(layers=2, hidden=32, mlp=48, heads=4, kv_heads=2, vocab=64, seq=8)
    path = llama.write(shape, tmp_path / "l.onnx", random_weights=True, seed=3)
    sm = load_model(path)
    plan = build_plan(sm, two_groups(), halves(sm), path=str(path))
    manifest = export_joint(plan, path, tmp_path / "out", verify=True)
    v = manifest["verify"]
    assert v["ok"], v["failure"]
    ((name, c),) = v["outputs"].items()
    assert sm.dtypes[name] == np.float16
    assert c["tolerance"] == pytest.approx(1e-2 * max(1.0, c["max_abs_diff"] / c["max_rel_diff"]))
    scale = max(1.0, c["max_abs_diff"] / c["max_rel_diff"])
    assert 1e-4 * scale < c["max_abs_diff"] <= c["tolerance"]  # fp32's tolerance would fail it


# ---------------------------------------------------------------------- If nodes
def _if_model(path: Path) -> None:
    """x @ W, then If(sum > 0): Relu else Neg, then @ W again (random W)."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 8]) for n in ("t", "e")]
    then_g = helper.make_graph([helper.make_node("Relu", ["y"], ["t"])], "then", [], [out[0]])
    else_g = helper.make_graph([helper.make_node("Neg", ["y"], ["e"])], "else", [], [out[1]])
    zero = numpy_helper.from_array(np.array(0, np.float32))
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
        helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0, name="rs"),
        helper.make_node("Constant", [], ["zero"], value=zero, name="c0"),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g, name="if"),
        helper.make_node("MatMul", ["z", "W"], ["out"], name="mm2"),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 8]) for n in ("x", "out")]
    g = helper.make_graph(nodes, "ifmodel", io[:1], io[1:], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_an_if_node_strategy_survives_the_stage_files(tmp_path):
    """The If's only data input is a scalar: its strategy ((),) was written as '(())', which
    reads back as no input at all, and export --verify refused its own files."""
    path = tmp_path / "if.onnx"
    _if_model(path)
    sm = load_model(path)
    cluster = two_groups()
    plan = build_plan(sm, cluster, [(0, len(sm.ops), (0,))], path=str(path))
    assert plan.stages[0].strategies["if"] == ((),)
    export_joint(plan, path, tmp_path / "out")
    written = load_model(tmp_path / "out" / "stage_0" / "annotated.onnx")
    assert from_attributes(written)["if"] == ((),)
    assert from_attributes(written) == {k: tuple(v) for k, v in plan.stages[0].strategies.items()}


# ---------------------------------------------------------------------- placed pipeline plans


def test_run_refuses_a_joint_plan_naming_what_checks_it(files, capsys, tmp_path):
    """mtpp run runs pipeline plans: a joint plan gets one line saying which commands take it."""
    model, joint, _, _ = files
    assert_refused(
        capsys,
        ["run", model, joint],
        r"joint.json: a joint plan, and this command takes pipeline plans; check a joint plan "
        r"with mtpp evaluate, mtpp simulate or mtpp export --verify$",
        watch=tmp_path,
    )
