"""Outputs never destroy what the user did not ask to replace: export folders, Gantt charts;
and absurd or invalid simulate options are refused before anything is allocated or written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from solver.backends import export as onnx_export
from solver.cli import main
from tests.backends.test_export import random_mlp
from tests.badinput import assert_refused, snapshot

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def inputs(tmp_path, capsys):
    """tmp/in/{mlp.onnx, plan.json} and a folder tmp/work/sub holding a file of the user's."""
    folder = tmp_path / "in"
    folder.mkdir()
    model = random_mlp(folder / "mlp.onnx")
    plan = folder / "plan.json"
    assert main(["solve", str(model), "-m", "time", "-k", "3", "--out", str(plan), "-q"]) == 0
    (tmp_path / "work" / "sub").mkdir(parents=True)
    (tmp_path / "work" / "keep.txt").write_text("mine")
    capsys.readouterr()
    return model, plan


def _export(model, plan, out, *extra) -> list[str]:
    return ["export", str(model), str(plan), "--out", str(out), "-k", "3", *extra]


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
def test_export_never_replaces_the_current_folder_or_a_parent(
    inputs, tmp_path, capsys, monkeypatch, force
):
    model, plan = inputs
    monkeypatch.chdir(tmp_path / "work" / "sub")
    for out in (".", "..", tmp_path / "work"):
        assert_refused(
            capsys,
            _export(model, plan, out, *force),
            r"current folder or one of its parents|not empty",
            watch=tmp_path,
        )
    monkeypatch.chdir(tmp_path / "work")
    assert_refused(capsys, _export(model, plan, ".", "--force"), "current folder", watch=tmp_path)
    assert (tmp_path / "work" / "keep.txt").read_text() == "mine"


def test_export_never_replaces_a_folder_holding_an_input(inputs, tmp_path, capsys):
    model, plan = inputs
    for out in (tmp_path / "in", tmp_path):
        assert_refused(
            capsys, _export(model, plan, out, "--force"), "holds the input", watch=tmp_path
        )
    assert model.stat().st_size > 0 and plan.stat().st_size > 0


@pytest.mark.parametrize("which", ["model", "plan"])
def test_export_out_naming_an_input_file_is_refused(inputs, tmp_path, capsys, which):
    model, plan = inputs
    target = model if which == "model" else plan
    for force in ([], ["--force"]):
        assert_refused(
            capsys,
            _export(model, plan, target, *force),
            "would replace an input",
            watch=tmp_path,
        )
    assert target.is_file()


def test_export_out_under_a_file_or_naming_a_file_is_refused(inputs, tmp_path, capsys):
    model, plan = inputs
    (tmp_path / "notes.txt").write_text("x")
    assert_refused(
        capsys, _export(model, plan, tmp_path / "notes.txt"), "is a file", watch=tmp_path
    )
    assert_refused(
        capsys, _export(model, plan, tmp_path / "notes.txt" / "o"), "is a file", watch=tmp_path
    )


def test_export_refuses_a_non_empty_folder_without_force(inputs, tmp_path, capsys):
    model, plan = inputs
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    assert_refused(capsys, _export(model, plan, out), r"not empty.*--force", watch=tmp_path)
    assert (out / "old.txt").read_text() == "old"


def test_export_fills_an_empty_folder_and_force_replaces_whole(inputs, tmp_path, capsys):
    model, plan = inputs
    out = tmp_path / "out"
    out.mkdir()
    assert main(_export(model, plan, out)) == 0
    first = sorted(p.name for p in out.iterdir())
    assert first == [
        "annotated.onnx",
        "sharding.yaml",
        "stage0.onnx",
        "stage1.onnx",
        "stage2.onnx",
        "stages.json",
    ]
    (out / "old.txt").write_text("old")
    assert main(_export(model, plan, out, "--force")) == 0
    assert sorted(p.name for p in out.iterdir()) == first  # old.txt went with the old folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out", "work"]  # no temp left
    assert out.stat().st_mode & 0o777 != 0o700  # the usual permissions, not mkdtemp's


def test_interrupted_forced_export_keeps_the_old_folder(inputs, tmp_path, capsys, monkeypatch):
    model, plan = inputs
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_export, "_build_stage", interrupted)
    before = snapshot(tmp_path)
    assert main(_export(model, plan, out, "--force")) == 130
    assert snapshot(tmp_path) == before  # the old folder whole, no temp folder left


@pytest.mark.parametrize(
    "option, match",
    [
        (["--tolerance", "nan"], r"--tolerance must be a finite number >= 0, got nan"),
        (["--tolerance=-1"], r"--tolerance must be a finite number >= 0, got -1"),
        (["--seed=-1"], r"--seed must be >= 0, got -1"),
    ],
)
def test_export_refuses_bad_verify_options(inputs, tmp_path, capsys, option, match):
    model, plan = inputs
    argv = _export(model, plan, tmp_path / "out", "--verify", *option)
    assert_refused(capsys, argv, match, watch=tmp_path)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------- simulate
@pytest.fixture
def graph_and_plan(tmp_path, capsys):
    graph = tmp_path / "graph.json"
    shutil.copy(ROOT / "examples" / "tiny_transformer.json", graph)
    plan = tmp_path / "plan.json"
    assert main(["solve", str(graph), "-m", "time", "-k", "4", "--out", str(plan), "-q"]) == 0
    capsys.readouterr()
    return graph, plan


def test_simulate_refuses_bad_gantt_paths(graph_and_plan, tmp_path, capsys):
    graph, plan = graph_and_plan
    (tmp_path / "notes.txt").write_text("x")
    for gantt, match in [
        (tmp_path / "missing" / "g.png", "does not exist"),
        (tmp_path / "notes.txt" / "g.png", "is a file, not a folder"),
        (tmp_path / "g.xyz", r"ending in one of .*\.png"),
        (tmp_path / "g", r"ending in one of .*\.svg"),
        (tmp_path, "is a folder"),
        (graph, "would overwrite an input"),
        (plan, "would overwrite an input"),
    ]:
        argv = ["simulate", graph, plan, "--gantt", gantt]
        assert_refused(capsys, argv, match, watch=tmp_path)


@pytest.mark.parametrize(
    "option, match",
    [
        (["--requests", "100000000"], r"--requests 100000000 .*simulation steps"),
        (["--requests", "1000000"], r"1000000 on 4 devices means 4,000,000 simulation steps"),
        (["--requests", "0"], r"--requests must be >= 1"),
        (["--latency", "nan"], r"--latency must be a finite number of seconds >= 0, got nan"),
        (["--latency", "inf"], r"--latency must be a finite .* got inf"),
        (["--latency=-1e-6"], r"--latency must be a finite .* got -1e-06"),
    ],
)
def test_simulate_refuses_absurd_options(graph_and_plan, tmp_path, capsys, option, match):
    graph, plan = graph_and_plan
    argv = ["simulate", graph, plan, *option, "--gantt", tmp_path / "g.png"]
    assert_refused(capsys, argv, match, watch=tmp_path)


def test_gantt_is_written_whole_or_not_at_all(graph_and_plan, tmp_path, capsys, monkeypatch):
    graph, plan = graph_and_plan
    svg = tmp_path / "g.svg"
    assert main(["simulate", str(graph), str(plan), "--gantt", str(svg), "--json"]) == 0
    assert svg.read_text().lstrip().startswith("<?xml")  # the format the suffix names
    assert svg.stat().st_mode & 0o777 != 0o600
    old = svg.read_bytes()
    from matplotlib.figure import Figure

    def broken(self, fh, **kw):
        fh.write(b"half a picture")
        raise RuntimeError("disk\nfull")

    monkeypatch.setattr(Figure, "savefig", broken)
    assert_refused(
        capsys,
        ["simulate", graph, plan, "--gantt", svg],
        r"g\.svg: cannot write the Gantt chart \(disk full\)",
        watch=tmp_path,
    )
    assert svg.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.svg", "graph.json", "plan.json"]
