"""The experiment runner: validation before any run, results, resume, reports, notebook."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest

from solver.cli import main
from solver.core.errors import MtppError
from solver.experiments.config import load_config
from solver.experiments.driver import run_experiment
from tests.conftest import bench_path
from tests.experiment_helpers import write

ROOT = Path(__file__).resolve().parents[2]

SMALL = {
    "name": "tiny",
    "graphs": [
        {"dnnpart": "LayerGraphs/bert24_inference"},
        {"onnx": str(ROOT / "models/small/unet.onnx"), "work": "flops"},
        {"layered": 60, "params": {"width": 3}},
    ],
    "devices": [2, 3],
    "methods": [
        "cpsat",
        "slicegraph",
        {"name": "poprt", "options": {"optimal_perf": True}, "label": "poprt-opt"},
        "time",
    ],
    "time_limit": 10,
}


def test_run_reports_and_resume(tmp_path):
    bench_path("LayerGraphs/bert24_inference")
    cfg = write(tmp_path, SMALL)
    out = tmp_path / "out"
    recs = run_experiment(cfg, out, jobs=2, progress=False)
    assert len(recs) == 3 * 2 * 4 and all(r["status"] != "ERROR" for r in recs)
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert {r["method"] for r in rows} == {"cpsat", "slicegraph", "poprt-opt", "time"}
    for r in rows:
        # cpsat proves every one of these instances: all ratios are against a proven optimum
        assert float(r["ratio_to_exact"]) >= 1 - 1e-6
        assert float(r["gap_to_best_bound"]) >= -1e-9
        if r["method"] == "cpsat":
            assert r["status"] == "OPTIMAL" and float(r["ratio_to_exact"]) == pytest.approx(1)
        # cpsat proves every optimum; a heuristic whose plan meets the certified bound
        # (solver.pipeline.bounds) proves it too. Self-proved: this method is the only prover.
        assert r["exact_source"].startswith("OPTIMAL: ")
        provers = set(r["exact_source"].removeprefix("OPTIMAL: ").split(", "))
        assert "cpsat" in provers
        assert r["exact_self_only"] == str(provers == {r["method"]})
    # every instance has a proven optimum; how many only cpsat proved depends on how far the
    # certified bounds get within their time share, and is checked row by row above
    summary = (out / "summary.md").read_text()
    assert re.search(r"\| cpsat \| 1\.0000 \(n=3(, \d self)?\) \| 1\.0000 \(n=3", summary)
    for png in ("ratio_by_method.png", "time_vs_size.png"):
        assert (out / png).stat().st_size > 1000
    assert len(list((out / "plans").glob("*.json"))) == len(recs)
    # a killed run loses nothing finished: drop some results, resume re-runs only those
    runs = sorted((out / "runs").glob("*.json"))
    for p in runs[:5]:
        p.unlink()
    before = {p.name: p.stat().st_mtime_ns for p in runs[5:]}
    recs2 = run_experiment(cfg, out, jobs=1, resume=True, progress=False)
    assert len(recs2) == len(recs)
    assert {p.name: p.stat().st_mtime_ns for p in runs[5:]} == before
    with pytest.raises(MtppError, match="pass --resume"):
        run_experiment(cfg, out, progress=False)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"graphs": [{"onnx": "missing.onnx"}]}, "graphs.0.*no such file"),
        ({"methods": ["cpsat", "magic"]}, "methods.1.*unknown method 'magic'"),
        ({"clusters": ["tpu-v9"]}, "clusters.0.*no such file or preset"),
        ({"time_limit": -1}, "key 'time_limit'.*greater than 0"),
        ({"devices": [0]}, "devices"),
        ({"graphs": [{"dnnpart": "x", "zoo": "resnet50"}]}, "exactly one of"),
        ({"grahps": []}, "grahps"),
        ({"methods": [{"name": "cpsat", "timelimit": 3}]}, "methods.0.*timelimit"),
    ],
)
def test_bad_configs_are_refused_before_running(tmp_path, change, match, capsys):
    # graphs that need no benchmark data: the refusal must not depend on ../shared
    no_data = {**SMALL, "graphs": [g for g in SMALL["graphs"] if "dnnpart" not in g]}
    cfg = write(tmp_path, {**no_data, **change})
    with pytest.raises(MtppError, match=match):
        load_config(cfg)
    code = main(["experiment", str(cfg), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "path", sorted((ROOT / "configs/experiments").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_configs_validate(path):
    for key in re.findall(r"^\s*- dnnpart:\s*(\S+)", path.read_text(), re.M):
        bench_path(key)  # skips, naming the folder, where the benchmark data is absent
    cfg, _ = load_config(path)
    assert cfg.methods or cfg.shard or cfg.joint or cfg.training


def test_smoke_config_and_notebook(tmp_path):
    nbclient = pytest.importorskip("nbclient")
    import nbformat

    bench_path("LayerGraphs/bert24_inference")
    out = tmp_path / "smoke"
    assert (
        main(
            [
                "experiment",
                str(ROOT / "configs/experiments/smoke.yaml"),
                "-o",
                str(out),
                "-j",
                "2",
                "-q",
                "--json",
            ]
        )
        == 0
    )
    nb = nbformat.read(ROOT / "notebooks/heuristic_vs_exact.ipynb", as_version=4)
    os.environ["MTPP_RESULTS"] = str(out)
    try:
        nbclient.NotebookClient(
            nb,
            timeout=120,
            kernel_name="python3",
            resources={"metadata": {"path": str(ROOT / "notebooks")}},
        ).execute()
    finally:
        del os.environ["MTPP_RESULTS"]
    text = json.dumps(nb)
    assert "| cpsat |" in text and "runs from" in text
