"""Training configs of an experiment (the ``training:`` key): schedules x microbatches x memory
x methods; each run's plan and the practitioners' splits priced beside it, their ratio to the
certified optimum in a table and a plot; refused ``training:`` keys."""

from __future__ import annotations

import csv

import pytest

from solver.core.cluster import load_cluster
from solver.core.errors import MtppError
from solver.core.result import OPTIMAL
from solver.core.training import TrainingSpec
from solver.experiments.config import expand, load_config
from solver.experiments.driver import run_experiment
from solver.experiments.reports import SplitRatio, enrich, split_ratio, training_instances
from solver.experiments.store import load_done
from solver.frontends import load_graph
from solver.pipeline.training.splits import practitioner_splits
from tests.conftest import ROOT
from tests.experiment_helpers import write

SMOKE = ROOT / "configs/experiments/training_smoke.yaml"
TOL = 1e-9


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """training_smoke.yaml run once: (records, output folder)."""
    out = tmp_path_factory.mktemp("training") / "out"
    return run_experiment(SMOKE, out, jobs=1, progress=False), out


def test_every_setting_runs_and_the_splits_are_priced_on_the_same_problem(smoke):
    recs, out = smoke
    assert len(recs) == 2 * 2 * 2 and len({r["id"] for r in recs}) == 8
    settings = {(r["schedule"], r["microbatches"], r["memory"]) for r in recs}
    assert settings == {
        (s, m, x) for s in ("gpipe", "1f1b") for m in (1, 8) for x in (None, "60MB")
    }
    model = next((out / "models").glob("*.onnx"))
    g = load_graph(model, training_costs=True, cluster="ipu-pod")
    for r in recs:
        assert r["kind"] == "training" and r["method"] == "train-cpsat" and r["k"] == 4
        assert r["status"] == OPTIMAL, r
        cl = load_cluster("ipu-pod", 4)
        if r["memory"]:
            cl = cl.with_memory(60e6)
        spec = TrainingSpec(r["schedule"], r["microbatches"], 1, 4.0)
        for s in practitioner_splits(g, cl, 4, spec):
            got = r["splits"][s.name]
            assert got["layers_per_stage"] == list(s.layers_per_stage)
            want = s.cost.iteration_time if s.cost.valid else None
            assert got["iteration_time"] == pytest.approx(want, rel=1e-12)
            # the certified optimum is never above a valid plan
            assert want is None or r["objective"] <= want * (1 + TOL)


def test_memory_that_binds_moves_gpipe_and_not_1f1b(smoke):
    recs, _ = smoke
    t = {(r["schedule"], r["microbatches"], r["memory"]): r["objective"] for r in recs}
    assert t[("gpipe", 8, "60MB")] > t[("gpipe", 8, None)] * 1.05  # 8 stashes per stage
    assert t[("1f1b", 8, "60MB")] == pytest.approx(t[("1f1b", 8, None)], rel=TOL)


def test_the_table_and_the_plot(smoke):
    recs, out = smoke
    text = (out / "summary.md").read_text()
    assert "## Training plans: the practitioners' splits against the certified optimum" in text
    assert (out / "training_splits.png").stat().st_size > 1000
    rows = training_instances(recs_enriched(out))
    assert len(rows) == 8
    for row in rows:
        for name in ("uniform", "fewer-at-ends", "by-parameters"):
            ratio = split_ratio(row, name)
            t = row["splits"][name]["iteration_time"]
            if t is None:
                assert ratio == SplitRatio(None, None, fits=False)
                continue
            assert ratio.low == ratio.high == pytest.approx(t / row["objective"], rel=1e-12)
            assert f"| {ratio.text()} " in text or f"| {ratio.text()} |" in text
    with open(out / "results.csv") as fh:
        first = next(csv.DictReader(fh))
    assert first["schedule"] in ("gpipe", "1f1b") and first["microbatches"] in ("1", "8")


def recs_enriched(out):
    """The records of the smoke run, enriched as the reports read them."""
    return enrich(list(load_done(out).values()))


def test_an_unproven_ratio_is_an_interval_and_a_split_that_breaks_memory_says_so():
    row = {
        "splits": {"uniform": {"iteration_time": 12.0}, "by-parameters": {"iteration_time": None}},
        "exact_optimum": None,
        "_best": {"objective": 10.0},
        "best_bound": 8.0,
    }
    assert split_ratio(row, "uniform") == SplitRatio(1.2, 1.5, fits=True)
    assert split_ratio(row, "uniform").text() == "1.200-1.500"
    assert split_ratio(row, "by-parameters").text() == "does not fit"
    assert split_ratio(row, "fewer-at-ends") is None
    proven = dict(row, exact_optimum=10.0)
    assert split_ratio(proven, "uniform").text() == "1.200"


BASE = {
    "name": "t",
    "graphs": [{"layered": 12, "params": {"width": 1}}],
    "clusters": ["ipu-pod"],
    "devices": [2],
}


def test_expand_crosses_the_settings_and_interleaved_alone_takes_virtual_stages(tmp_path):
    training = {
        "schedules": ["1f1b", "interleaved"],
        "microbatches": [4, 8],
        "virtual_stages": [1, 2],
        "memory": [None, "1GB"],
        "methods": ["cpsat", "time"],
    }
    cfg, base = load_config(write(tmp_path, {**BASE, "training": training}))
    runs = expand(cfg, base)
    # 1f1b: v = 1 only; interleaved: v in {1, 2}: 3 x 2 microbatches x 2 memory x 2 methods
    assert len(runs) == cfg.size() == 24 and len({r["id"] for r in runs}) == 24
    assert {r["method"] for r in runs} == {"train-cpsat", "train-time"}
    assert {(r["schedule"], r["virtual_stages"]) for r in runs} == {
        ("1f1b", 1),
        ("interleaved", 1),
        ("interleaved", 2),
    }


@pytest.mark.parametrize(
    "training, message",
    [
        ({"schedules": ["zb"]}, "key 'training.schedules.0'"),
        ({"microbatches": [0]}, "key 'training.microbatches.0'"),
        ({"memory": ["lots"]}, "key 'training.memory.0'"),
        ({"methods": ["nope"]}, "key 'training.methods.0': unknown method 'nope'"),
        (
            {"microbatches": [4, 4]},
            "key 'training.microbatches.1': the same as training.microbatches.0",
        ),
    ],
)
def test_bad_training_keys_are_refused_naming_the_key(tmp_path, training, message):
    with pytest.raises(MtppError, match=message.replace(".", r"\.").replace("'", "'")):
        load_config(write(tmp_path, {**BASE, "training": training}))
