"""The exporter: annotated model, stage models that reproduce the original, sharding YAML."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from solver.cli import main
from solver.cluster import load_cluster
from solver.cost import evaluate
from solver.heuristics.manual import manual_assignment, parse_sharding
from solver.io import load_graph
from solver.io.onnx_export import export_plan
from solver.methods import SolveOptions, solve
from solver.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
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
    code = main(
        ["export", str(model), str(plan), "--out", str(out), "--verify", "--json", "-k", "3"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["verify"]["ok"]
    assert not (out / "stale.txt").exists() and (out / "annotated.onnx").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no leftovers


def test_export_refuses_non_onnx_and_backward_plans(tmp_path, capsys):
    code = main(
        ["export", "examples/tiny_transformer.json", "x.json", "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "needs the ONNX model" in capsys.readouterr().err
    g = load_graph(ROOT / "models/small/unet.onnx")
    a = np.zeros(g.n, dtype=int)
    a[g.topo_order[: g.n // 2]] = 1  # the first half after the second: backwards
    from solver.errors import MtppError

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
