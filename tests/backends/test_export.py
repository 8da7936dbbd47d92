"""The exporter: annotated model, stage models that reproduce the original, sharding YAML."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from solver.backends import export as onnx_export
from solver.backends.export import export_plan
from solver.backends.simulate import simulate
from solver.backends.verify import compare_output
from solver.cli import main
from solver.core.cluster import load_cluster
from solver.core.cost import evaluate
from solver.frontends import load_graph
from solver.pipeline.heuristics.manual import manual_assignment, parse_sharding
from solver.pipeline.options import SolveOptions
from solver.pipeline.registry import solve

ROOT = Path(__file__).resolve().parents[2]
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = [
    LIGHT / "light_resnet50.onnx",
    LIGHT / "light_inception_v1.onnx",
    ROOT / "models/small/transformer.onnx",
    ROOT / "models/small/decoder.onnx",
    ROOT / "models/small/unet.onnx",
    ROOT / "models/small/inception.onnx",
]


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_four_device_split_exports_and_reproduces_outputs(path, tmp_path):
    g = load_graph(path)
    c = load_cluster("ipu-pod", devices=4)
    plan = solve(g, c, "time")  # spreads the work over all four devices
    assert len(set(plan.assignment.tolist())) == 4
    out = tmp_path / "sharded"
    report = export_plan(path, g, plan.assignment, out, verify=True)
    assert report["verify"]["ok"] and report["verify"]["max_abs_diff"] <= 1e-4
    ann = onnx.load(str(out / "annotated.onnx"))
    onnx.checker.check_model(ann)
    for node in ann.graph.node:
        names = {a.name for a in node.attribute}
        assert {"__ipu_number", "__pipeline_stage"} <= names
    # every tensor goes forward in the annotated model
    dev = {
        o: a.i
        for n in ann.graph.node
        for a in n.attribute
        if a.name == "__ipu_number"
        for o in n.output
    }
    for n in ann.graph.node:
        d = next(a.i for a in n.attribute if a.name == "__ipu_number")
        assert all(dev.get(x, 0) <= d for x in n.input if x in dev)
    assert sorted(p.name for p in out.glob("stage*.onnx")) == [f"stage{s}.onnx" for s in range(4)]
    # the sharding YAML reads back to the same plan
    points = parse_sharding(yaml.safe_load((out / "sharding.yaml").read_text()))
    device, _ = manual_assignment(g, points)
    assert device.tolist() == plan.assignment.tolist()
    # and the simulator agrees with the evaluator on this plan
    sim = simulate(g, c, plan.assignment, requests=30)
    assert sim.period == pytest.approx(evaluate(g, c, plan.assignment).objective, rel=1e-9)


def test_export_cli_replaces_folder_atomically_and_verifies(tmp_path, capsys):
    model = ROOT / "models/small/resnet.onnx"
    plan = tmp_path / "plan.json"
    assert main(["solve", str(model), "-m", "time", "-k", "3", "--out", str(plan), "-q"]) == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    capsys.readouterr()
    argv = ["export", str(model), str(plan), "--out", str(out), "--verify", "--json", "-k", "3"]
    assert main(argv) == 2  # a non-empty folder needs --force
    assert "--force" in capsys.readouterr().err and (out / "stale.txt").read_text() == "old"
    code = main([*argv, "--force"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["verify"]["ok"] and report["verify"]["problems"] == []
    assert not (out / "stale.txt").exists() and (out / "annotated.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "plan.json"]  # no leftovers


def test_export_refuses_non_onnx_and_backward_plans(tmp_path, capsys):
    code = main(
        ["export", "examples/tiny_transformer.json", "x.json", "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "needs the ONNX model" in capsys.readouterr().err
    g = load_graph(ROOT / "models/small/unet.onnx")
    a = np.zeros(g.n, dtype=int)
    a[g.topo_order[: g.n // 2]] = 1  # the first half after the second: backwards
    from solver.core.errors import MtppError

    with pytest.raises(MtppError, match="later device"):
        export_plan(ROOT / "models/small/unet.onnx", g, a, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_optimal_plan_round_trip_through_export(tmp_path):
    path = LIGHT / "light_inception_v1.onnx"
    g = load_graph(path)
    c = load_cluster("ipu-pod", devices=4)
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=30))
    report = export_plan(path, g, plan.assignment, tmp_path / "opt", verify=True)
    assert report["verify"]["ok"]


def test_real_pipelined_run_of_two_stages(tmp_path, capsys):
    model = ROOT / "models/small/transformer.onnx"
    plan = tmp_path / "plan.json"
    assert main(["solve", str(model), "-m", "time", "-k", "2", "--out", str(plan), "-q"]) == 0
    capsys.readouterr()
    assert main(["run", str(model), str(plan), "--requests", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stages"] == 2
    for key in ("measured", "simulated", "unsplit"):
        assert out[key]["throughput"] > 0 and out[key]["latency"] > 0


def test_external_weights_stay_external(tmp_path):
    src = onnx.load(str(ROOT / "models/small/transformer.onnx"))
    ext = tmp_path / "model" / "ext.onnx"
    ext.parent.mkdir()
    onnx.save(
        src,
        str(ext),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.onnx.data",
        size_threshold=1024,
    )
    g = load_graph(ext)
    plan = solve(g, load_cluster("ipu-pod", devices=2), "time")
    out = tmp_path / "sharded"
    report = export_plan(ext, g, plan.assignment, out, verify=True)
    assert report["verify"]["ok"]
    for s in range(2):
        assert (out / f"stage{s}.onnx.data").stat().st_size > 0
        assert (out / f"stage{s}.onnx").stat().st_size < 100_000  # weights are not inline


# ---------------------------------------------------------------------- verify must catch errors
def random_mlp(path: Path, batch: str | int = 2, seed: int = 0, last: str = "MatMul") -> Path:
    """x -> MatMul -> Add -> Relu -> MatMul -> Add -> Relu -> ``last`` -> y with random weights,
    so that every weight and every edge changes the output (``batch`` may be a dim name)."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "b1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "W2"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h2", "b2"], ["a2"], name="add2"),
        helper.make_node("Relu", ["a2"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r2", "W3"], ["h3"], name="mm3"),
        helper.make_node(last, ["h3"] if last != "MatMul" else ["h3", "W4"], ["y"], name="last"),
    ]
    inits = [w("W1", 8, 16), w("b1", 16), w("W2", 16, 16), w("b2", 16), w("W3", 16, 4)]
    inits += [w("W4", 4, 3)] if last == "MatMul" else []
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, None])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def mlp_and_plan(tmp_path, capsys):
    model = random_mlp(tmp_path / "mlp.onnx")
    plan = tmp_path / "plan.json"
    assert main(["solve", str(model), "-m", "time", "-k", "3", "--out", str(plan), "-q"]) == 0
    capsys.readouterr()
    return model, plan


def _corrupt_stages(monkeypatch, corrupt) -> list[str]:
    """Let the exporter build every stage, then damage each with ``corrupt(model, stage)``
    (which returns what it changed, or None to leave that stage alone)."""
    build, seen = onnx_export._build_stage, []

    def damaged(model, st, shapes):
        m = build(model, st, shapes)
        what = corrupt(m, st["stage"])
        if what:
            seen.append(what)
        return m

    monkeypatch.setattr(onnx_export, "_build_stage", damaged)
    return seen


def _export_verify(model, plan, out, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    argv = ["export", str(model), str(plan), "--out", str(out), "--verify", "--json", "-k", "3"]
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_verify_passes_on_the_honest_export(mlp_and_plan, tmp_path, capsys):
    model, plan = mlp_and_plan
    code, report = _export_verify(model, plan, tmp_path / "out", capsys)
    assert code == 0 and report["verify"]["ok"] and report["verify"]["max_abs_diff"] <= 1e-6
    assert len([st for st in report["stages"] if st["file"]]) == 3
    v = report["verify"]
    assert v["tolerance"] is None and v["tolerance_per_output"] == {"y": 1e-4}  # float32
    assert v["over_tolerance"] == []


def test_float32_keeps_1e4_and_an_explicit_tolerance_wins(
    mlp_and_plan, tmp_path, capsys, monkeypatch
):
    """A small perturbation of one fp32 weight (an output difference between 1e-4 and 1e-2)
    fails the float32 default and passes an explicit --tolerance 0.01."""
    model, plan = mlp_and_plan

    def nudge(m, s):
        if s != 1:
            return None
        t = next(t for t in m.graph.initializer if len(t.dims) == 2)
        arr = numpy_helper.to_array(t).copy()
        arr += (3e-5 * np.random.default_rng(7).standard_normal(arr.shape)).astype(arr.dtype)
        t.CopyFrom(numpy_helper.from_array(arr, t.name))
        return t.name

    seen = _corrupt_stages(monkeypatch, nudge)
    code, report = _export_verify(model, plan, tmp_path / "out", capsys)
    v = report["verify"]
    assert len(seen) == 1 and 1e-4 < v["max_abs_diff"] < 1e-2
    assert code == 1 and not v["ok"] and v["problems"] == []
    assert v["tolerance_per_output"] == {"y": 1e-4} and v["over_tolerance"] == ["y"]
    argv = ["export", model, plan, "--out", tmp_path / "o2", "--verify", "-k", "3"]
    assert main([str(x) for x in [*argv, "--tolerance", "0.01"]]) == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrap 80 columns
    assert "(tolerance 0.01) OK" in text
    assert main([str(x) for x in [*argv, "--force"]]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "(tolerance 0.0001, the default for the output type) MISMATCH" in text
    assert "y: max abs diff" in text and "exceeds its tolerance 0.0001" in text


def test_integer_outputs_are_compared_exactly_by_default(tmp_path, capsys):
    """An ArgMax output (int64) beside the float one: exact by default, 1e-4 for the float."""
    src = onnx.load(str(random_mlp(tmp_path / "mlp.onnx")))
    src.graph.node.append(helper.make_node("ArgMax", ["y"], ["idx"], name="am", axis=1))
    src.graph.output.append(helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 1]))
    model = tmp_path / "two.onnx"
    onnx.save(src, str(model))
    plan = tmp_path / "plan.json"
    assert main(["solve", str(model), "-m", "time", "-k", "3", "--out", str(plan), "-q"]) == 0
    code, report = _export_verify(model, plan, tmp_path / "out", capsys)
    v = report["verify"]
    assert code == 0 and v["ok"] and v["per_output"]["idx"] == 0.0
    assert v["tolerance_per_output"] == {"y": 1e-4, "idx": 0.0}
    argv = ["export", model, plan, "--out", tmp_path / "o2", "--verify", "-k", "3"]
    assert main([str(x) for x in argv]) == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrap 80 columns
    assert "default tolerance by output type: 0.0001 for 1 output, exact for 1 output" in text


def test_default_tolerance_by_type():
    from solver.backends.verify import elem_tolerance as default_tolerance

    T = TensorProto
    assert [default_tolerance(t) for t in (T.FLOAT, T.DOUBLE, T.COMPLEX64)] == [1e-4] * 3
    assert [default_tolerance(t) for t in (T.FLOAT16, T.BFLOAT16)] == [1e-2, 1e-2]
    assert [default_tolerance(t) for t in (T.INT64, T.INT8, T.BOOL, T.STRING, 0)] == [0.0] * 5


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_verify_fails_on_a_perturbed_weight(mlp_and_plan, tmp_path, capsys, monkeypatch, stage):
    model, plan = mlp_and_plan

    def perturb(m, s):
        if s != stage:
            return None
        t = m.graph.initializer[0]
        arr = numpy_helper.to_array(t).copy()
        arr += 0.1 * np.random.default_rng(stage).standard_normal(arr.shape).astype(arr.dtype)
        t.CopyFrom(numpy_helper.from_array(arr, t.name))
        return t.name

    seen = _corrupt_stages(monkeypatch, perturb)
    code, report = _export_verify(model, plan, tmp_path / "out", capsys)
    assert len(seen) == 1, "the stage was not corrupted"
    assert code == 1 and not report["verify"]["ok"]
    assert report["verify"]["max_abs_diff"] > 1e-4


def test_verify_fails_on_a_dropped_edge(mlp_and_plan, tmp_path, capsys, monkeypatch):
    """The first Add becomes an Identity of its first input: the bias edge is dropped, the
    shapes stay right, only the values can tell."""
    model, plan = mlp_and_plan

    def drop_bias(m, s):
        for node in m.graph.node:
            if node.op_type == "Add" and not seen:
                node.op_type = "Identity"
                del node.input[1:]
                return node.name
        return None

    seen = _corrupt_stages(monkeypatch, drop_bias)
    code, report = _export_verify(model, plan, tmp_path / "out", capsys)
    assert len(seen) == 1
    assert code == 1 and report["verify"]["problems"] == []  # no NaN, no shape error
    assert report["verify"]["max_abs_diff"] > 1e-4


def test_verify_fails_on_nan(tmp_path, capsys):
    model = random_mlp(tmp_path / "log.onnx", last="Log")  # log of negative numbers: NaN
    plan = tmp_path / "plan.json"
    assert main(["solve", str(model), "-m", "time", "-k", "3", "--out", str(plan), "-q"]) == 0
    code, report = _export_verify(model, plan, tmp_path / "out", capsys)
    assert code == 1 and not report["verify"]["ok"]
    assert report["verify"]["problems"] == ["y: the original model output has NaN"]
    assert report["verify"]["per_output"] == {"y": None}  # named, never a NaN in the JSON
    assert report["verify"]["max_abs_diff"] is None


def test_compare_output_checks_shape_dtype_and_nan():
    ref = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert compare_output("y", ref, ref + 0.25) == (0.25, None)
    assert (
        compare_output("y", ref, ref[:1])[1] == "y: shape [1, 3] from the stages, [2, 3] expected"
    )
    assert compare_output("y", ref[:1], np.broadcast_to(ref[:1], (2, 3)))[0] is None
    assert "dtype int64" in compare_output("y", ref, ref.astype(np.int64))[1]
    bad = ref.copy()
    bad[1, 2] = np.nan
    assert compare_output("y", ref, bad) == (None, "y: the stages output has NaN")
    assert compare_output("y", bad, bad) == (None, "y: the original model output has NaN")
    inf = ref.copy()
    inf[0, 0] = np.inf
    assert compare_output("y", inf, inf) == (0.0, None)
    assert compare_output("y", inf, ref)[0] is None
    assert compare_output("m", ref > 2, ref > 2) == (0.0, None)
    assert compare_output("m", ref > 2, ref > 3) == (1.0, None)
