"""mtpp report PLAN [MODEL] --html FILE: a page for every kind of plan (pipeline with and
without its model, training, joint, sharded), an existing FILE replaced only with --force, and
one-line refusals (exit 2) that change nothing."""

from __future__ import annotations

import json

import onnx
import pytest
import yaml

from solver.cli import main
from solver.frontends.onnx.modelgen import transformer
from tests.backends.test_report_html import parse
from tests.badinput import assert_refused
from tests.cli_runner import run_cli


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A random-weight transformer and its plans, each written by mtpp: pipeline (inference
    and training), joint, sharded, and a manual sharding."""
    d = tmp_path_factory.mktemp("report")
    m, _ = transformer(layers=2, hidden=32, heads=2, seq=8, vocab=50, batch=2, seed=3)
    onnx.save(m, d / "t.onnx")
    solve = ["solve", d / "t.onnx", "-q", "--json", "--cluster", "dgx-a100", "-k", "3"]
    for argv in (
        [*solve, "-m", "time", "--out", d / "pipeline.json"],
        [*solve, "-m", "time", "--schedule", "1f1b", "--microbatches", "4"]
        + ["--out", d / "training.json"],
        [*solve, "--method", "joint", "--workers", "1", "--time-limit", "5"]
        + ["--out", d / "joint.json"],
        ["shard", d / "t.onnx", "-k", "4", "--json", "--out", d / "shard"],
    ):
        assert main([str(a) for a in argv]) == 0, argv
    pipeline = json.loads((d / "pipeline.json").read_text())
    points = [{"node": n, "device": b, "stage": b} for n, b in pipeline["assignment"].items()]
    (d / "manual.yaml").write_text(yaml.safe_dump(points))
    return d


def report(capsys, argv) -> tuple[dict, object]:
    """Run mtpp report --json; its summary and the parsed page."""
    code, out, err = run_cli(capsys, ["report", *argv, "--json"])
    assert code == 0, err
    summary = json.loads(out)
    return summary, parse(open(summary["html"], encoding="utf-8").read())


def _cells(page, row) -> list:
    """The td elements of ``row`` (those up to the next tr)."""
    start = next(i for i, el in enumerate(page.elements) if el is row) + 1
    out = []
    for el in page.elements[start:]:
        if el.tag == "tr":
            break
        out += [el] if el.tag == "td" else []
    return out


def stage_numbers(page) -> list[int]:
    return [int(r.attrs["data-stage"]) for r in page.find("tr", class_="stage")]


def test_a_pipeline_plan_with_its_model(plans, capsys, tmp_path):
    summary, page = report(
        capsys, [plans / "pipeline.json", plans / "t.onnx", "--html", tmp_path / "p.html"]
    )
    data = json.loads((plans / "pipeline.json").read_text())
    assert summary == {
        "html": str(tmp_path / "p.html"),
        "kind": "pipeline",
        "stages": 3,
        "operators": 0,
        "gantt": True,
        "graph": True,
    }
    assert stage_numbers(page) == [b["block"] for b in data["blocks"]]
    for ident in (
        "stage-table",
        "stage-bars",
        "sequence-strip",
        "graph-figure",
        "bound-ladder",
        "gantt",
    ):
        assert page.find("table", id=ident) or page.find("svg", id=ident), ident
    assert len(page.find("circle", class_="node")) == data["graph"]["nodes"]


def test_a_pipeline_plan_alone_shows_what_its_file_records(plans, capsys, tmp_path):
    summary, page = report(capsys, [plans / "pipeline.json", "--html", tmp_path / "p.html"])
    data = json.loads((plans / "pipeline.json").read_text())
    assert (summary["kind"], summary["gantt"], summary["graph"]) == ("pipeline", False, False)
    assert stage_numbers(page) == [b["block"] for b in data["blocks"]]
    assert page.find("svg", id="bound-ladder") and page.find("svg", id="sequence-strip")
    assert "give the MODEL" in page.find("section", id="notes")[0].text


def test_a_training_plan_shows_its_schedule(plans, capsys, tmp_path):
    summary, page = report(capsys, [plans / "training.json", "--html", tmp_path / "t.html"])
    data = json.loads((plans / "training.json").read_text())
    stages = data["training"]["stages"]
    assert summary["kind"] == "training" and summary["gantt"]
    assert stage_numbers(page) == [s["block"] for s in stages]
    assert len(page.find("rect", class_="bar")) == 2 * 4 * len(stages)


def test_a_joint_plan_finds_its_model(plans, capsys, tmp_path):
    summary, page = report(capsys, [plans / "joint.json", "--html", tmp_path / "j.html"])
    data = json.loads((plans / "joint.json").read_text())
    assert (summary["kind"], summary["gantt"]) == ("joint", True)
    assert stage_numbers(page) == [s["index"] for s in data["stages"]]
    names = [r.text for r in page.find("rect", class_="rung")]
    assert any(n.startswith("universal bound") for n in names)


def test_a_joint_plan_whose_model_is_gone_has_no_timeline(plans, capsys, tmp_path):
    data = json.loads((plans / "joint.json").read_text())
    data["model"]["path"] = str(tmp_path / "gone.onnx")
    (tmp_path / "joint.json").write_text(json.dumps(data))
    summary, page = report(capsys, [tmp_path / "joint.json", "--html", tmp_path / "j.html"])
    assert (summary["kind"], summary["gantt"]) == ("joint", False)
    assert stage_numbers(page) == [s["index"] for s in data["stages"]]
    note = page.find("section", id="notes")[0].text
    assert "no timeline: the model this plan names was not found; give it: mtpp report" in note


def test_a_sharded_plan_lists_its_operators_and_mesh(plans, capsys, tmp_path):
    summary, page = report(capsys, [plans / "shard" / "plan.json", "--html", tmp_path / "s.html"])
    data = json.loads((plans / "shard" / "plan.json").read_text())
    assert (summary["kind"], summary["stages"]) == ("spmd", 0)
    rows = page.find("tr", class_="operator")
    assert summary["operators"] == len(rows) == len(data["operators"])
    names = [cells[0].text for cells in (_cells(page, r) for r in rows)]
    assert names == [op["name"] for op in data["operators"]]
    assert page.find("svg", id="mesh-figure")


def test_a_manual_sharding_with_its_graph(plans, capsys, tmp_path):
    summary, page = report(
        capsys,
        [
            plans / "manual.yaml",
            plans / "t.onnx",
            "--html",
            tmp_path / "m.html",
            "--cluster",
            "dgx-a100",
            "-k",
            "3",
        ],
    )
    assert (summary["kind"], summary["stages"]) == ("pipeline", 3)


def test_an_existing_file_is_replaced_only_with_force(plans, capsys, tmp_path):
    out = tmp_path / "p.html"
    out.write_text("mine")
    argv = ["report", plans / "pipeline.json", "--html", out]
    assert_refused(
        capsys,
        argv,
        "^mtpp: error: .*p.html: file exists; choose a new name for the HTML report, or pass "
        "--force to replace it$",
        watch=tmp_path,
    )
    assert out.read_text() == "mine"
    code, out_text, err = run_cli(capsys, [*argv, "--force"])
    assert code == 0, err
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert out_text.startswith("wrote ")


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing folder", r"the folder .*nowhere does not exist; create it first$"),
        ("input", r"the HTML report would overwrite an input file; choose another name$"),
        ("manual alone", r"a manual sharding records no costs; give the graph: mtpp report "),
        ("shard with model", r"a sharded plan holds every operator it reports; drop "),
        ("not a plan", r"t.onnx: "),
        ("no plan file", r"nothing.json"),
        ("bad schedule", r"bad.json: 'training': unknown schedule 'zigzag'; use one of "),
        ("joint's model", r"t.onnx: the HTML report would overwrite an input file; choose "),
    ],
)
def test_bad_requests_are_refused_in_one_line(plans, capsys, tmp_path, case, match):
    html = tmp_path / "r.html"
    training = json.loads((plans / "training.json").read_text())
    training["training"]["schedule"] = "zigzag"
    (tmp_path / "bad.json").write_text(json.dumps(training))
    argv = {
        "missing folder": [plans / "pipeline.json", "--html", tmp_path / "nowhere" / "r.html"],
        "input": [plans / "pipeline.json", "--html", plans / "pipeline.json"],
        "manual alone": [plans / "manual.yaml", "--html", html],
        "shard with model": [plans / "shard" / "plan.json", plans / "t.onnx", "--html", html],
        "not a plan": [plans / "t.onnx", "--html", html],
        "no plan file": [tmp_path / "nothing.json", "--html", html],
        "bad schedule": [tmp_path / "bad.json", "--html", html],
        "joint's model": [plans / "joint.json", "--html", plans / "t.onnx", "--force"],
    }[case]
    assert_refused(capsys, ["report", *argv], match, watch=[tmp_path, plans])


def test_html_is_required(plans, capsys):
    assert_refused(capsys, ["report", plans / "pipeline.json"], r"required: --html")
