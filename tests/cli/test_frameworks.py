"""mtpp solve --granularity layer and mtpp export --format torch|torchtitan|megatron|deepspeed|vllm
through the command line: the plan's granularity record, the exact files of each format, and the
refusals (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import re
import sys

import pytest
from onnx import save

from solver.backends.frameworks import FORMATS
from solver.cli import main
from solver.cli.parsers import FRAMEWORK_FORMATS
from solver.pipeline.plan import OPTIMAL
from tests.badinput import assert_refused
from tests.pipeline.test_granularity import UNITS, layered_model

# links fast enough that splitting the 4-layer model pays off (cf. FAST_LINKS there)
FAST_CLUSTER = """name: fast
devices: 3
fast_memory: 900MB
compute: 250TFLOPS
memory_bandwidth: 47.5TB/s
link_bandwidth: 10TB/s
slow_memory_bandwidth: 20GB/s
"""
# embed + layers.0 | layers.1 + layers.2 | layers.3 + head (the split of
# tests/backends/test_frameworks.py)
BLOCK_OF_UNIT = {"embed": 0, "layers.0": 0, "layers.1": 1, "layers.2": 1, "layers.3": 2, "head": 2}
STAGES_121 = [["embed", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "head"]]
EXPECTED = {
    "torch": {
        "torch_pipeline.json": {
            "split_spec": {"layers.1": "BEGINNING", "layers.3": "BEGINNING"},
            "stages": STAGES_121,
        }
    },
    "torchtitan": {"torchtitan_pipeline.json": {"module_fqns_per_model_part": STAGES_121}},
    "deepspeed": {
        "deepspeed_partition.json": {"layers": list(UNITS), "parts": [0, 2, 4, 6]},
    },
    "megatron": {"megatron_layout.txt": "Et|t*2|tL"},  # its last line
    "vllm": {"vllm_pp_layer_partition.txt": "1,2,1\n"},
}


def unit_of_node(name: str) -> str:
    """The unit of a node of the legacy-named model (graph input and root glue: embed)."""
    parts = name.strip("/").split("/")
    if parts[0] == "layers":
        return f"layers.{parts[1]}"
    return parts[0] if parts[0] in UNITS else "embed"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The legacy-named 4-layer model, a cluster with fast links, a layer-granular plan of it
    (mtpp solve --granularity layer) and the same plan re-split 1/2/1 (its assignment edited)."""
    d = tmp_path_factory.mktemp("fw")
    save(layered_model("legacy"), str(d / "m.onnx"))
    (d / "fast.yaml").write_text(FAST_CLUSTER)
    argv = ["solve", d / "m.onnx", "--granularity", "layer", "--cluster", d / "fast.yaml"]
    assert main([str(a) for a in [*argv, "-m", "brute", "-q", "--out", d / "layer.json"]]) == 0
    plan = json.loads((d / "layer.json").read_text())
    plan["assignment"] = {n: BLOCK_OF_UNIT[unit_of_node(n)] for n in plan["assignment"]}
    (d / "plan121.json").write_text(json.dumps(plan))
    inside = dict(plan["assignment"], **{"/layers/0/proj/MatMul": 1})  # cuts layers.0
    (d / "inside.json").write_text(json.dumps(dict(plan, assignment=inside)))
    return d


def run_json(capsys, argv) -> dict:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_parser_formats_are_the_back_end_formats():
    assert FRAMEWORK_FORMATS == FORMATS


def test_solve_layer_granularity_json_states_units_and_price(files, capsys):
    argv = ["solve", files / "m.onnx", "--granularity", "layer", "--cluster", files / "fast.yaml"]
    out = run_json(capsys, [*argv, "-m", "brute", "-q", "--json"])
    rec = out["stats"]["granularity"]
    assert rec["mode"] == "layer" and rec["units"] == list(UNITS)
    assert rec["blocks"] == list(UNITS[1:5]) and rec["container"] == "layers"
    cost = rec["restriction_cost"]
    assert set(cost) == {
        "layer_objective",
        "layer_lower_bound",
        "layer_status",
        "operator_objective",
        "operator_lower_bound",
        "operator_status",
        "at_least",
        "at_most",
    }
    assert out["status"] == cost["layer_status"] == cost["operator_status"] == OPTIMAL
    assert cost["layer_objective"] == out["objective"]
    # brute force proves both: the price is exact, and cutting inside layers pays here
    assert cost["at_least"] == pytest.approx(cost["at_most"], rel=1e-9)
    price = out["objective"] - cost["operator_objective"]
    assert cost["at_least"] == pytest.approx(price, rel=1e-9) and price > 0
    blocks = {}  # the plan cuts only between units
    for name, block in out["assignment"].items():
        blocks.setdefault(unit_of_node(name), set()).add(block)
    assert all(len(b) == 1 for b in blocks.values())


def test_solve_layer_granularity_prints_the_restriction_cost(files, capsys):
    argv = ["solve", files / "m.onnx", "--granularity", "layer", "--cluster", files / "fast.yaml"]
    capsys.readouterr()
    assert main([str(a) for a in [*argv, "-m", "idealdp", "-q"]]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(
        r"layer-granular: 6 modules, cuts only between them; the status and bound above are "
        r"over such plans\. Operator-level: objective \S+ s \(OPTIMAL\), bound \S+ s; the "
        r"restriction costs between \S+ s and \S+ s",
        out,
    ), out


def test_solved_layer_plan_exports_as_its_stages(files, tmp_path, capsys):
    plan = json.loads((files / "layer.json").read_text())
    stages: list[list[str]] = []
    last = None
    for name, block in plan["assignment"].items():  # program order
        unit = unit_of_node(name)
        if block != last:
            stages.append([])
            last = block
        if unit not in stages[-1]:
            stages[-1].append(unit)
    argv = ["export", files / "m.onnx", files / "layer.json", "--format", "torchtitan"]
    run_json(capsys, [*argv, "--out", tmp_path / "t", "--json"])
    written = json.loads((tmp_path / "t" / "torchtitan_pipeline.json").read_text())
    assert written == {"module_fqns_per_model_part": stages} and len(stages) > 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_format_writes_the_expected_files(files, tmp_path, capsys, fmt):
    out_dir = tmp_path / "out"
    argv = ["export", files / "m.onnx", files / "plan121.json", "--format", fmt]
    rep = run_json(capsys, [*argv, "--out", out_dir, "--json"])
    (name,) = EXPECTED[fmt]
    assert rep == {"format": fmt, "out": str(out_dir), "files": [name, "README.md"]}
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([name, "README.md"])
    text = (out_dir / name).read_text()
    want = EXPECTED[fmt][name]
    if name.endswith(".json"):
        assert json.loads(text) == want
    elif fmt == "megatron":
        assert text.splitlines()[-1] == want
    else:
        assert text == want
    assert "```" in (out_dir / "README.md").read_text()


def test_export_format_replaces_a_folder_only_with_force(files, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    argv = [
        "export",
        files / "m.onnx",
        files / "plan121.json",
        "--format",
        "vllm",
        "--out",
        out_dir,
    ]
    assert_refused(capsys, argv, r"folder exists and is not empty.*--force", watch=tmp_path)
    capsys.readouterr()
    assert main([str(a) for a in [*argv, "--force"]]) == 0
    assert "wrote " in capsys.readouterr().out
    assert sorted(p.name for p in out_dir.iterdir()) == ["README.md", "vllm_pp_layer_partition.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name != "out"]  # no temporary folder left


# ---------------------------------------------------------------------- refusals
def test_layer_granularity_needs_module_names(tmp_path, capsys):
    model = layered_model("legacy")
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
    save(model, str(tmp_path / "plain.onnx"))
    assert_refused(
        capsys,
        ["solve", tmp_path / "plain.onnx", "--granularity", "layer", "-k", "2", "-m", "brute"],
        "^mtpp: error: "
        + re.escape(
            f"{tmp_path / 'plain.onnx'}: --granularity layer needs module names in the ONNX "
            "nodes (the dynamo exporter's name scopes or the legacy exporter's /module/path/Op "
            "names), and 0 of 12 nodes have one; export the model from torch"
        )
        + "$",
        watch=tmp_path,
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            [],
            "{graph}: --granularity layer needs an ONNX model exported from torch (its nodes "
            "name their modules); a JSON graph has no module information",
        ),
        (["-m", "joint"], "--granularity layer applies to pipeline methods, not --method joint"),
        (
            ["-m", "manual", "--sharding", "s.yaml"],
            "--granularity layer does not apply to "
            "--method manual (its sharding points fix the cuts); drop --granularity",
        ),
    ],
)
def test_layer_granularity_refusals(tmp_path, capsys, extra, message):
    graph = tmp_path / "g.json"
    graph.write_text("{}")  # refused before it is read
    line = assert_refused(
        capsys, ["solve", graph, "--granularity", "layer", *extra], ".", watch=tmp_path
    )
    assert line == "mtpp: error: " + message.format(graph=graph)


def test_format_refuses_a_plan_that_cuts_inside_a_module(files, tmp_path, capsys):
    argv = ["export", files / "m.onnx", files / "inside.json", "--format", "vllm"]
    line = assert_refused(capsys, [*argv, "--out", tmp_path / "o"], ".", watch=[files, tmp_path])
    assert line == (
        f"mtpp: error: {files / 'inside.json'}: the plan cuts inside module layers.0 (blocks 0 "
        "and 1); solve with --granularity layer for a plan a framework can run"
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "option, value",
    [("--verify", None), ("--verify-memory-ok", None), ("--tolerance", "1e-3"), ("--seed", "3")],
)
def test_format_refuses_the_onnx_check(files, tmp_path, capsys, option, value):
    argv = ["export", files / "m.onnx", files / "plan121.json", "--format", "torch"]
    argv += ["--out", tmp_path / "o", option, *([value] if value else [])]
    line = assert_refused(capsys, argv, ".", watch=[files, tmp_path])
    assert line == (
        f"mtpp: error: {option} applies to --format onnx (it runs the stage models), not "
        f"--format torch; drop {option}"
    )


def test_format_refuses_a_joint_plan(files, tmp_path, capsys):
    joint = tmp_path / "joint.json"
    joint.write_text(json.dumps({"format": "mtpp-joint-plan"}))  # refused before it is checked
    argv = ["export", files / "m.onnx", joint, "--format", "megatron", "--out", tmp_path / "o"]
    line = assert_refused(capsys, argv, ".", watch=[files, tmp_path])
    assert line == (
        f"mtpp: error: {joint}: --format megatron takes a pipeline plan that cuts only between "
        "modules (mtpp solve MODEL --granularity layer --out PLAN), not a joint plan; export a "
        "joint plan with --format onnx or dtensor"
    )


def test_format_refuses_an_operator_sharding_plan(files, tmp_path, capsys):
    spmd = tmp_path / "plan.json"
    spmd.write_text(json.dumps({"format": "mtpp-shard-plan"}))  # as mtpp shard --out writes it
    argv = ["export", files / "m.onnx", spmd, "--format", "torch", "--out", tmp_path / "o"]
    line = assert_refused(capsys, argv, ".", watch=[files, tmp_path])
    assert line.startswith(
        f"mtpp: error: {spmd}: a 'mtpp-shard-plan' file is not a plan; expected a plan: a JSON "
        'with "format": "mtpp-plan"'
    )


def test_unknown_format_is_refused_by_the_parser(files, tmp_path, capsys):
    argv = ["export", files / "m.onnx", files / "plan121.json", "--format", "jax"]
    assert_refused(
        capsys, [*argv, "--out", tmp_path / "o"], r"--format: invalid choice: 'jax'", watch=tmp_path
    )


# ---------------------------------------------------------------------- --format dtensor
def test_dtensor_refuses_a_pipeline_plan(files, tmp_path, capsys):
    argv = ["export", files / "m.onnx", files / "plan121.json", "--format", "dtensor"]
    line = assert_refused(capsys, [*argv, "--out", tmp_path / "o"], ".", watch=[files, tmp_path])
    assert line == (
        f"mtpp: error: {files / 'plan121.json'}: --format dtensor takes an operator-sharding plan "
        "(mtpp shard MODEL --out DIR writes DIR/plan.json, format 'mtpp-shard-plan') or a joint "
        "plan"
    )


def test_dtensor_refuses_the_onnx_check(files, tmp_path, capsys):
    argv = ["export", files / "m.onnx", files / "plan121.json", "--format", "dtensor"]
    argv += ["--out", tmp_path / "o", "--verify"]
    line = assert_refused(capsys, argv, ".", watch=[files, tmp_path])
    assert line.endswith("--verify applies to --format onnx (it runs the stage models), not "
                         "--format dtensor; drop --verify")  # fmt: skip


# ---------------------------------------------------------------------- mtpp run --backend torch
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--backend torch needs --module FILE.py:FACTORY, a function that builds the torch "
             "module that was exported to MODEL.onnx"),
        (["--module", "f.py:build", "--requests", "5"],
         "--requests applies to --backend onnx; use --microbatches with torch"),
        (["--module", "f.py:build", "--microbatches", "0"],
         "--microbatches must be from 1 to 1024, got 0"),
    ],
)  # fmt: skip
def test_torch_backend_refusals(files, tmp_path, capsys, extra, message):
    argv = ["run", "--backend", "torch", files / "m.onnx", files / "plan121.json", *extra]
    line = assert_refused(capsys, argv, ".", watch=[files, tmp_path])
    assert line == f"mtpp: error: {message}"


@pytest.mark.parametrize("option", [["--module", "f.py:build"], ["--microbatches", "2"],
                                    ["--schedule", "gpipe"]])  # fmt: skip
def test_torch_options_need_the_torch_backend(files, tmp_path, capsys, option):
    argv = ["run", files / "m.onnx", files / "plan121.json", *option]
    line = assert_refused(capsys, argv, ".", watch=[files, tmp_path])
    name = option[0]
    assert line == f"mtpp: error: {name} applies to --backend torch; add it or drop {name}"


def test_torch_backend_without_torch_names_the_extra(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    argv = ["run", "--backend", "torch", "--module", "f.py:build", files / "m.onnx"]
    line = assert_refused(capsys, [*argv, files / "plan121.json"], ".", watch=[files, tmp_path])
    assert line == (
        "mtpp: error: --backend torch needs PyTorch, which is not installed: pip install "
        '"mtpp[torch]"'
    )
