"""Pipeline vs sharding vs joint plans from an experiment YAML (the ``joint:`` key): the smoke
config end to end (records, plans, the simulator's check, the third table and its plot,
resume), the comparison table's logic on known records, refused ``joint:`` keys."""

from __future__ import annotations

import csv
import re
import shutil

import pytest

from solver.core.errors import MtppError
from solver.experiments.config import expand, load_config
from solver.experiments.driver import run_experiment
from solver.experiments.reports import joint_markdown, joint_wins
from solver.joint import load_joint_plan
from tests.badinput import assert_refused
from tests.conftest import ROOT
from tests.experiment_helpers import write

SMOKE = ROOT / "configs/experiments/joint_smoke.yaml"
SPACES = ("pipeline", "sharding", "joint")
TOL = 1e-9


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """joint_smoke.yaml run once into a fresh folder: (records, output folder)."""
    out = tmp_path_factory.mktemp("joint") / "out"
    return run_experiment(SMOKE, out, jobs=2, progress=False), out


def by_instance(recs: list[dict]) -> dict[tuple, dict[str, dict]]:
    groups: dict[tuple, dict[str, dict]] = {}
    for r in recs:
        groups.setdefault((r["graph"], r["memory"]), {})[r["space"]] = r
    return groups


def test_smoke_records_every_space_and_joint_is_never_worse(smoke):
    recs, out = smoke
    assert len(recs) == 2 * 2 * 3 and len({r["id"] for r in recs}) == 12
    groups = by_instance(recs)
    assert set(groups) == {
        (g, m)
        for g in ("transformer-heads2-hidden32-layers1-seq8-vocab64", "big-vocab")
        for m in (None, "200KB")
    }
    for (graph, memory), by in groups.items():
        assert set(by) == set(SPACES)
        for space, r in by.items():
            assert r["kind"] == "joint" and r["method"] == f"space-{space}" and r["k"] == 4
            if (graph, memory, space) == ("big-vocab", "200KB", "pipeline"):
                # the 256 KB embedding fits no single device under 200 KB: refused, named
                assert r["status"] == "ERROR" and r["objective"] is None
                assert "'Gather_" in r["error"] and "memory limit" in r["error"], r["error"]
                continue
            assert r["status"] in ("OPTIMAL", "FEASIBLE"), r
            obj = r["objective"]
            assert 0 < r["universal_bound"] <= obj * (1 + TOL)
            assert 0 < r["lower_bound"] <= obj * (1 + TOL) and r["bound_space"]
            assert r["gap"] == pytest.approx((obj - r["lower_bound"]) / obj, abs=1e-12)
            # the simulator rebuilds every stage from the model: its period is the objective
            assert r["sim_disagrees"] is False and r["sim_valid"] is True
            assert r["sim_period"] == pytest.approx(obj, rel=TOL)
            devices = [d for st in r["stages"] for d in st["devices"]]
            assert len(devices) == len(set(devices)) and set(devices) <= set(range(4))
            if space == "pipeline":
                assert all(len(st["devices"]) == 1 and st["mesh"] == "1" for st in r["stages"])
            if space == "sharding":
                assert len(r["stages"]) == 1 and sorted(devices) == [0, 1, 2, 3]
                assert r["stages"][0]["mesh"] in ("4", "2x2")
        # both pure spaces are inside the joint space
        others = [by[s]["objective"] for s in ("pipeline", "sharding") if by[s]["objective"]]
        assert by["joint"]["objective"] <= min(others) * (1 + TOL), (graph, memory)
    # the big vocabulary: splitting the table beats one device holding it (joint strictly
    # better than both pure spaces with the cluster's memory)
    big = groups[("big-vocab", None)]
    assert big["joint"]["objective"] < min(
        big["pipeline"]["objective"], big["sharding"]["objective"]
    ) * (1 - 1e-6)


def test_smoke_plans_load_and_reprice(smoke):
    """Every plan file is a joint plan that re-evaluates to the recorded objective."""
    recs, out = smoke
    models = {p.name.rsplit("-", 1)[0]: p for p in (out / "models").glob("*.onnx")}
    for r in recs:
        plan_file = out / "plans" / f"{r['id']}.json"
        if r["objective"] is None:
            assert not plan_file.exists()
            continue
        plan = load_joint_plan(plan_file, model=models[r["graph"]])
        assert plan.space == r["space"] and plan.status == r["status"]
        assert plan.objective == pytest.approx(r["objective"], rel=TOL)
        assert [list(s.devices) for s in plan.stages] == [st["devices"] for st in r["stages"]]


def test_smoke_summary_table_plot_and_resume(smoke, tmp_path):
    recs, out = smoke
    summary = (out / "summary.md").read_text()
    assert "## Pipeline vs sharding vs joint plans" in summary
    assert "heuristics against the exact optimum" not in summary  # no pipeline-method runs
    by = by_instance(recs)[("big-vocab", "200KB")]
    ratio = by["sharding"]["objective"] / by["joint"]["objective"]
    row = re.search(r"^\| big-vocab \| 0\.319 MB \| two-by-two \| 200KB \| (.*)$", summary, re.M)
    assert row, summary
    cells = [c.strip() for c in row.group(1).split("|")]
    assert cells[0] == "ERROR [1]"
    assert cells[1].startswith(f"{by['sharding']['objective']:.4g} (x{ratio:.3f}, gap ")
    assert cells[2].startswith(f"{by['joint']['objective']:.4g} (x1.000, gap ")
    assert cells[3:5] == ["joint", f"{ratio:.3f}x faster"]
    assert re.search(r"^\[1\] big-vocab, pipeline: operator 'Gather_\d+'", summary, re.M)
    assert "- sharding: one stage holding all" in summary
    assert re.search(r"Joint strictly faster .*: [1-4] of 4 rows \(.*big-vocab", summary)
    assert summary.count("| agrees |") == 11 and "DISAGREES" not in summary
    png = (out / "joint_vs_spaces.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert sorted(r["space"] for r in rows) == sorted(SPACES * 4)
    # joint runs prove no optimum: only the bound valid for every joint plan is used
    assert all(r["exact_optimum"] == "" for r in rows)
    # resume: nothing runs again
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = {p.name: p.stat().st_mtime_ns for p in (copy / "runs").glob("*.json")}
    assert len(run_experiment(SMOKE, copy, resume=True, progress=False)) == 12
    assert {p.name: p.stat().st_mtime_ns for p in (copy / "runs").glob("*.json")} == before


def _rec(graph, space, obj, sim=None, **kw) -> dict:
    return {
        "kind": "joint",
        "graph": graph,
        "cluster": "c",
        "memory": None,
        "space": space,
        "method": f"space-{space}",
        "status": "ERROR" if obj is None else "FEASIBLE",
        "objective": obj,
        "lower_bound": None if obj is None else obj / 2,
        "gap": None if obj is None else 0.5,
        "universal_bound": 1.0,
        "bound_space": f"{space} plans",
        "sim_period": sim if sim is not None else obj,
        "sim_disagrees": sim is not None,
        "stages": [{"devices": [0, 1, 2, 3], "mesh": "2x2"}],
        **kw,
    }


def test_table_names_the_winner_ties_and_simulator_disagreements():
    recs = [
        _rec("a", "pipeline", 4.0),
        _rec("a", "sharding", 3.0),
        _rec("a", "joint", 2.0),
        _rec("b", "pipeline", 2.0),
        _rec("b", "sharding", 3.0),
        _rec("b", "joint", 2.0),
        _rec("c", "pipeline", None, error="operator 'E' fits on no stage"),
        _rec("c", "sharding", 3.0),
        _rec("c", "joint", 2.0, sim=2.5),  # faster, but the simulator disagrees
    ]
    wins = joint_wins(recs)
    assert [(w["graph"], w["speedup"]) for w in wins] == [("a", 1.5)]
    text = joint_markdown(recs)
    lines: dict[str, str] = {}  # the first line of each model: the comparison table's row
    for ln in text.splitlines():
        if ln.startswith("| "):
            lines.setdefault(ln.split(" | ")[0], ln)
    assert lines["| a"].endswith(
        "| 4 (x2.000, gap 50.0%) | 3 (x1.500, gap 50.0%) | 2 (x1.000, gap 50.0%) "
        "| joint | 1.500x faster | 1 (best 50.0% above) |"
    )
    assert "| pipeline = joint | equal |" in lines["| b"]
    assert "| ERROR [1] |" in lines["| c"]
    assert "[1] c, pipeline: operator 'E' fits on no stage" in text
    assert "DISAGREES: 2.5 s (+2.50e-01)" in text
    assert "1 of 3 rows (a on c, memory capacity: 1.500x)." in text


def smoke_data() -> dict:
    import yaml

    return yaml.safe_load(SMOKE.read_text())


@pytest.mark.parametrize(
    "change, match",
    [
        ({"spaces": ["magic"]}, r"joint\.spaces\.0"),
        ({"spaces": []}, r"joint\.spaces.*at least 1"),
        ({"spaces": ["joint", "joint"]}, r"joint\.spaces\.1.*the same as"),
        ({"memory": ["lots"]}, r"joint\.memory\.0"),
        ({"memory": ["1MB", 1000000]}, r"joint\.memory\.1.*the same as"),
        ({"time_limit": -1}, r"joint\.time_limit"),
        ({"requests": 1}, r"joint\.requests"),
        ({"space": ["joint"]}, r"joint\.space.*Extra inputs"),
    ],
)
def test_bad_joint_keys_are_refused(tmp_path, capsys, change, match):
    data = smoke_data()
    data["joint"].update(change)
    cfg = write(tmp_path, data)
    argv = ["experiment", str(cfg), "--output", str(tmp_path / "out"), "-q"]
    assert_refused(capsys, argv, match, watch=tmp_path)


def test_joint_needs_an_onnx_graph_and_ids_cover_what_defines_a_run(tmp_path):
    with pytest.raises(MtppError, match="key 'joint': plans ONNX models"):
        load_config(write(tmp_path, {"graphs": [{"layered": 10}], "joint": {}}))
    with pytest.raises(MtppError, match="give 'methods'.*'joint'"):
        load_config(write(tmp_path, {"graphs": [{"layered": 10}]}))

    def ids(data) -> dict[tuple, str]:
        cfg, base = load_config(write(tmp_path, data))
        runs = expand(cfg, base)
        assert len(runs) == cfg.size()
        return {(r["graph_index"], r["memory"], r["space"]): r["id"] for r in runs}

    data = smoke_data()
    first = ids(data)
    assert len(first) == len(set(first.values())) == 12
    data["graphs"][1]["name"] = "renamed"  # a display name is not part of the id
    assert ids(data) == first
    data["joint"]["memory"] = [None, "300KB"]
    second = ids(data)
    assert {k: v for k, v in second.items() if k[1] is None} == {
        k: v for k, v in first.items() if k[1] is None
    }
    assert not set(second.values()) & {v for k, v in first.items() if k[1] == "200KB"}
    data["joint"]["time_limit"] = 3
    assert not set(ids(data).values()) & set(second.values())


def test_joint_runs_on_ray_as_locally(tmp_path):
    """The Ray backend runs the same joint runs and records the same results."""
    pytest.importorskip("ray")
    data = smoke_data()
    data["graphs"] = data["graphs"][1:]  # the big vocabulary: the pipeline is refused at 200KB
    cfg = write(tmp_path, data)
    local = run_experiment(cfg, tmp_path / "local", jobs=2, progress=False)
    ray = run_experiment(cfg, tmp_path / "ray", backend="ray", progress=False)
    assert len(ray) == 6 and {r["status"] for r in ray} >= {"OPTIMAL", "ERROR"}
    want = {r["id"]: (r["status"], r["objective"], r.get("sim_period")) for r in local}
    have = {r["id"]: (r["status"], r["objective"], r.get("sim_period")) for r in ray}
    assert have.keys() == want.keys()
    for rid, (status, obj, sim) in have.items():
        assert status == want[rid][0]
        if obj is not None:  # the same optimum (possibly another plan reaching it)
            assert obj == pytest.approx(want[rid][1], rel=TOL) and sim == pytest.approx(obj)
    summary = (tmp_path / "ray" / "summary.md").read_text()
    assert "| big-vocab | 0.319 MB | two-by-two | 200KB | ERROR [1] |" in summary
