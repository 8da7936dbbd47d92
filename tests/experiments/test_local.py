"""mtpp experiment is safe and honest: Ctrl-C, torn records, run ids, proofs, paths, bad input."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import yaml

import solver.experiments.driver as ex
import solver.experiments.local as local
from solver.core.errors import MtppError
from solver.experiments import benchdata
from solver.pipeline.plan import ERROR, FEASIBLE, INVALID, OPTIMAL
from tests.badinput import assert_refused
from tests.conftest import bench_path
from tests.experiment_helpers import FAST, jsonl_ids, run_cli, write

ROOT = Path(__file__).resolve().parents[2]
_real_execute = local._execute


# ---------------------------------------------------------------------- Ctrl-C
def _slow_unless_time(desc, *args):
    """A worker that hangs on every run but the 'time' method's (a straggler to terminate)."""
    if desc["method"] != "time":
        time.sleep(120)
    return _real_execute(desc, *args)


def test_ctrl_c_records_finished_runs_stops_workers_and_resume_finishes(
    tmp_path, monkeypatch, capsys
):
    cfg = write(tmp_path, {**FAST, "devices": [2]})
    out = tmp_path / "out"
    calls = []
    real_wait = local.wait

    def wait_then_interrupt(*a, **kw):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt  # Ctrl-C after the first finished run
        return real_wait(*a, **kw)

    monkeypatch.setattr(local, "wait", wait_then_interrupt)
    monkeypatch.setattr(local, "_execute", _slow_unless_time)
    t0 = time.perf_counter()
    assert run_cli(cfg, "-o", out, "-j", 2) == 130
    assert time.perf_counter() - t0 < 30  # the sleeping worker was terminated, not awaited
    assert multiprocessing.active_children() == []
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"mtpp: interrupted: 1 of 2 runs recorded in {out}; run the same command "
        "with --resume to continue"
    ]
    assert len(list((out / "runs").glob("*.json"))) == 1
    (rec,) = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    assert rec["method"] == "time" and rec["status"] == FEASIBLE
    assert jsonl_ids(out) == [rec["id"]]
    assert "| time |" in (out / "summary.md").read_text()  # reports of what finished
    assert len((out / "results.csv").read_text().splitlines()) == 2
    monkeypatch.undo()
    assert run_cli(cfg, "-o", out, "--resume") == 0
    ids = jsonl_ids(out)
    assert len(ids) == 2 and len(set(ids)) == 2 and ids[0] == rec["id"]


def test_interrupt_from_the_library_is_a_keyboard_interrupt(tmp_path, monkeypatch):
    cfg = write(tmp_path, FAST)
    monkeypatch.setattr(local, "wait", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt) as info:
        ex.run_experiment(cfg, tmp_path / "out", progress=False)
    assert isinstance(info.value, ex.ExperimentInterrupted)
    assert (info.value.recorded, info.value.total) == (0, 4)
    assert (tmp_path / "out" / "summary.md").exists()
    assert multiprocessing.active_children() == []


def _die_on_uniform(desc, *args):
    """A worker killed on the 'uniform' runs (as the kernel's out-of-memory killer would)."""
    if desc["method"] == "uniform":
        os._exit(9)
    return _real_execute(desc, *args)


def test_a_dead_worker_ends_with_one_line_and_resume_finishes(tmp_path, monkeypatch, capsys):
    cfg = write(tmp_path, FAST)
    out = tmp_path / "out"
    monkeypatch.setattr(local, "_execute", _die_on_uniform)
    assert run_cli(cfg, "-o", out) == 2
    assert multiprocessing.active_children() == []
    (line,) = capsys.readouterr().err.strip().splitlines()
    recorded = len(list((out / "runs").glob("*.json")))
    assert f"worker process died (killed, or out of memory?); {recorded} of 4 runs" in line
    assert recorded < 4 and all(
        json.loads(p.read_text())["method"] == "time" for p in (out / "runs").glob("*.json")
    )
    monkeypatch.undo()
    assert run_cli(cfg, "-o", out, "--resume") == 0
    assert len(set(jsonl_ids(out))) == len(jsonl_ids(out)) == 4


# ---------------------------------------------------------------------- resume
@pytest.fixture
def finished(tmp_path):
    """A finished 4-run experiment: (config, output folder)."""
    cfg = write(tmp_path, FAST)
    out = tmp_path / "out"
    assert run_cli(cfg, "-o", out) == 0
    assert len(jsonl_ids(out)) == 4
    return cfg, out


def test_resume_survives_a_torn_last_line(finished, capsys):
    cfg, out = finished
    victim = sorted((out / "runs").glob("*.json"))[0]
    victim.unlink()  # killed between its two writes: its run is done again
    with open(out / "results.jsonl", "a") as fh:
        fh.write('{"id": "older-run", "status": "OPTIMAL"}\n')  # not ours: kept as it is
        fh.write('{"id": "0123", "graph": "lay')  # Ctrl-C in the middle of an append
    capsys.readouterr()
    assert run_cli(cfg, "-o", out, "--resume") == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results.jsonl: dropped 1 torn line" in err[0]
    ids = jsonl_ids(out)  # every line parses again, one per run, the redone one at the end
    assert ids[-2:] == ["older-run", victim.stem] and victim.exists()
    assert sorted(ids[:-2] + ids[-1:]) == sorted(p.stem for p in (out / "runs").glob("*.json"))


@pytest.mark.parametrize("content", ["", '{"id": "ab', "[]", '{"id": "someone-else"}'])
def test_resume_redoes_a_corrupt_or_empty_run_record(finished, capsys, content):
    cfg, out = finished
    runs = sorted((out / "runs").glob("*.json"))
    runs[1].write_text(content)
    keep = {p: p.read_text() for p in runs if p != runs[1]}
    before = {p: p.stat().st_mtime_ns for p in keep}
    capsys.readouterr()
    assert run_cli(cfg, "-o", out, "--resume") == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(runs[1]) in err[0] and "done again" in err[0]
    assert json.loads(runs[1].read_text())["id"] == runs[1].stem  # redone
    assert {p: p.stat().st_mtime_ns for p in keep} == before  # the others untouched
    ids = jsonl_ids(out)
    assert len(ids) == 4 and sorted(ids) == sorted(p.stem for p in runs)


# ---------------------------------------------------------------------- run ids
def ids_of(tmp_path, data) -> list[dict]:
    cfg, base = ex.load_config(write(tmp_path, data))
    return ex.expand(cfg, base)


def test_run_ids_include_dims_work_params_source_and_inline_cluster_content(tmp_path):
    onnx = str(ROOT / "models/small/transformer.onnx")
    graphs = [
        {"layered": 30, "name": "g"},
        {"layered": 30, "name": "g", "params": {"width": 3}},
        {"layered": 31, "name": "g"},
        {"onnx": onnx, "name": "g"},
        {"onnx": onnx, "name": "g", "dims": {"batch": 2}},
        {"onnx": onnx, "name": "g", "work": "flops"},
    ]
    inline = {"fast_memory": "1GB", "link_bandwidth": "10GB/s", "devices": 2}
    clusters = [inline, {**inline, "link_bandwidth": "20GB/s"}]
    runs = ids_of(tmp_path, {**FAST, "graphs": graphs, "clusters": clusters, "devices": [2]})
    assert len(runs) == 6 * 2 * 2
    assert len({r["id"] for r in runs}) == len(runs)
    assert len({r["graph"] for r in runs}) == 6  # same name: shown apart as g#0 .. g#5
    names = {r["cluster"] for r in runs}
    assert len(names) == 2 and all(n.startswith("inline-") for n in names)
    # the ids are stable: the same config expands to the same ids
    again = ids_of(tmp_path / "again", {**FAST, "graphs": graphs, "clusters": clusters})
    assert {r["id"] for r in runs} <= {r["id"] for r in again}


def test_two_unnamed_inline_clusters_keep_separate_records(tmp_path):
    inline = {"fast_memory": "1GB", "link_bandwidth": "10GB/s", "devices": 2}
    clusters = [inline, {**inline, "link_bandwidth": "1GB/s"}]
    data = {**FAST, "clusters": clusters, "devices": [2], "methods": ["time"]}
    recs = ex.run_experiment(write(tmp_path, data), tmp_path / "out", progress=False)
    assert len(recs) == 2 and len(list((tmp_path / "out/runs").glob("*.json"))) == 2
    assert len({r["cluster"] for r in recs}) == 2
    slow, fast = sorted(recs, key=lambda r: r["objective"], reverse=True)
    assert slow["objective"] > fast["objective"]  # really solved on two different clusters


def test_run_ids_follow_file_content_not_file_name(tmp_path):
    from solver.frontends.native import to_dict
    from solver.frontends.workloads import layered_dag

    for sub, n in (("a", 20), ("b", 21)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "g.json").write_text(json.dumps(to_dict(layered_dag(n))))
    graphs = [{"json": "a/g.json"}, {"json": "b/g.json"}]
    runs = ids_of(tmp_path, {**FAST, "graphs": graphs, "devices": [2], "methods": ["time"]})
    assert len({r["id"] for r in runs}) == 2
    # two different models with one name both keep their records
    out = tmp_path / "out"
    recs = ex.run_experiment(write(tmp_path, {**FAST, "graphs": graphs}), out, progress=False)
    assert len(recs) == 8 and len(list((out / "runs").glob("*.json"))) == 8
    assert {r["nodes"] for r in recs} == {20, 21}


def test_duplicate_entries_are_refused(tmp_path):
    for change, key in [
        ({"graphs": [{"layered": 30}, {"layered": 30, "name": "x"}]}, "graphs.1"),
        ({"devices": [2, 2]}, "devices.1"),
        ({"methods": ["time", {"name": "uniform", "label": "time"}]}, "methods.1"),
    ]:
        with pytest.raises(MtppError, match=rf"key '{key}': the same as"):
            ex.load_config(write(tmp_path, {**FAST, **change}))


# ---------------------------------------------------------------------- proven optima
def rec(method, status, obj, lb, inst="g", k=2, **kw):
    name = kw.pop("method_name", method)
    return dict(
        method=method,
        method_name=name,
        status=status,
        objective=obj,
        lower_bound=lb,
        graph=inst,
        graph_key=inst,
        cluster_key="c",
        k=k,
        cluster_spec="ipu-pod",
        **kw,
    )


def by_method(rows):
    return {r["method"]: r for r in rows}


def test_no_optimum_without_a_proof():
    rows = by_method(
        ex.enrich([rec("time", FEASIBLE, 10.0, 8.0), rec("slicegraph", FEASIBLE, 9.0, 8.5)])
    )
    assert all(r["exact_optimum"] is None and r["ratio_to_exact"] is None for r in rows.values())


def test_optimal_record_proves_only_its_own_instance_and_flags_self_proof():
    rows = ex.enrich(
        [
            rec("cpsat", OPTIMAL, 8.0, 8.0),
            rec("time", FEASIBLE, 10.0, 6.0),
            rec("time", FEASIBLE, 10.0, 6.0, k=3),  # another k: nothing proved there
            rec("time", FEASIBLE, 12.0, 6.0, inst="h"),  # another graph
        ]
    )
    assert [r["exact_optimum"] for r in rows] == [8.0, 8.0, None, None]
    assert rows[1]["ratio_to_exact"] == pytest.approx(1.25)
    assert [r["exact_self_only"] for r in rows] == [True, False, False, False]
    text = ex.summary_markdown(rows, "t")
    assert "| cpsat | 1.0000 (n=1, 1 self) | - | 1.0000 (n=1, 1 self) |" in text
    assert "| time | 1.2500 (n=1) | - | 1.2500 (n=1) |" in text


def test_bound_meeting_a_plan_is_a_proof_from_two_methods():
    rows = by_method(
        ex.enrich([rec("slicegraph", FEASIBLE, 9.0, 7.0), rec("idealdp", FEASIBLE, 9.5, 9.0)])
    )
    assert rows["slicegraph"]["exact_optimum"] == 9.0
    assert rows["slicegraph"]["exact_source"] == "bound of idealdp meets plan of slicegraph"
    assert not rows["slicegraph"]["exact_self_only"]
    assert rows["idealdp"]["ratio_to_exact"] == pytest.approx(9.5 / 9.0)
    assert rows["idealdp"]["exact_self_only"]  # the proof rests on idealdp's own bound
    # one method meeting its own bound proves the optimum, but only by itself
    (own,) = ex.enrich([rec("time", FEASIBLE, 5.0, 5.0)])
    assert own["exact_optimum"] == 5.0 and own["exact_self_only"]


def test_conflicting_proofs_give_no_optimum_and_are_reported():
    rows = ex.enrich([rec("cpsat", OPTIMAL, 10.0, 10.0), rec("time", FEASIBLE, 9.0, 1.0)])
    assert all(r["exact_optimum"] is None for r in rows)
    src = rows[0]["exact_source"]
    assert src.startswith("CONFLICT: ") and "time found 9 < cpsat 10" in src
    assert "Proofs that disagree" in ex.summary_markdown(rows, "t")
    rows = ex.enrich([rec("time", FEASIBLE, 9.0, 9.5)])  # a bound above the objective
    assert rows[0]["exact_optimum"] is None and "exceeds" in rows[0]["exact_source"]


def test_invalid_and_error_records_prove_nothing():
    rows = ex.enrich(
        [
            rec("time", INVALID, 3.0, 2.0),
            rec("poprt", ERROR, None, None),
            rec("x", FEASIBLE, 4.0, 2.0),
        ]
    )
    assert all(r["exact_optimum"] is None for r in rows)
    assert rows[0]["gap_to_best_bound"] is None  # an invalid plan has no gap


def test_known_optimum_only_at_the_files_k_on_the_files_cluster():
    key = "LayerGraphs/bert24_inference"
    n, k, opt = benchdata.KNOWN_OPTIMA[key]
    src = {"source": {"dnnpart": key}, "nodes": n}
    mine = rec("time", FEASIBLE, 1.1 * opt, 1.0, k=k, **src)
    (row,) = ex.enrich([dict(mine, cluster_spec="file")])
    assert row["exact_optimum"] == opt and not row["exact_self_only"]
    assert row["exact_source"] == "known optimum of the benchmark file"
    for change in ({"cluster_spec": "ipu-pod"}, {"cluster_spec": "file", "k": k - 1}):
        (row,) = ex.enrich([dict(mine, **change)])
        assert row["exact_optimum"] is None


def test_known_optimum_in_a_real_run(tmp_path):
    bench_path("LayerGraphs/bert24_inference")
    data = {
        "graphs": [{"dnnpart": "LayerGraphs/bert24_inference"}],
        "clusters": ["file", "ipu-pod"],
        "devices": [None],
        "methods": ["time"],
        "time_limit": 1,
    }
    recs = ex.run_experiment(write(tmp_path, data), tmp_path / "out", progress=False)
    rows = {r["cluster_spec"]: r for r in ex.enrich(recs)}
    assert rows["file"]["k"] == 6 and rows["file"]["exact_optimum"] == 17.78990625
    assert rows["file"]["ratio_to_exact"] >= 1
    # the file's known optimum is for the file's cluster only: on ipu-pod an optimum can only
    # come from a proof made there (the time split meeting the certified bound, if it does)
    assert "known" not in str(rows["ipu-pod"].get("exact_source") or "")
    if rows["ipu-pod"]["exact_optimum"] is not None:
        assert rows["ipu-pod"]["status"] == OPTIMAL
        assert rows["ipu-pod"]["exact_optimum"] == rows["ipu-pod"]["objective"]


# ---------------------------------------------------------------------- paths
def test_benchmark_dir_setting(tmp_path, monkeypatch):
    monkeypatch.delenv(benchdata.ENV_VAR, raising=False)
    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "pyproject.toml").write_text("")
    monkeypatch.chdir(proj / "sub")
    expected = tmp_path / "shared/benchmarks/dnn-partitioning"
    assert benchdata.benchmark_dir() == expected.resolve()
    monkeypatch.setenv(benchdata.ENV_VAR, str(tmp_path / "env"))
    assert benchdata.benchmark_dir() == tmp_path / "env"
    assert benchdata.benchmark_dir("data", tmp_path / "cfg") == tmp_path / "cfg/data"


def test_paths_resolve_beside_the_config_from_any_folder(tmp_path, monkeypatch):
    bench = Path(bench_path("LayerGraphs/bert24_inference")).parents[2]
    (tmp_path / "cfg/models").mkdir(parents=True)
    (tmp_path / "cfg/models/t.onnx").write_bytes((ROOT / "models/small/unet.onnx").read_bytes())
    data = {
        "graphs": [
            {"onnx": "models/t.onnx", "work": "flops"},
            {"dnnpart": "LayerGraphs/bert24_inference"},
            {
                "generate": "transformer",
                "params": {"layers": 1, "hidden": 16, "heads": 2, "seq": 4, "vocab": 20},
            },
        ],
        "devices": [2],
        "methods": ["time"],
        "benchmark_dir": os.path.relpath(bench, tmp_path / "cfg"),
    }
    cfg = write(tmp_path / "cfg", data)
    monkeypatch.setenv(benchdata.ENV_VAR, str(tmp_path / "nowhere"))  # the key wins
    monkeypatch.chdir(tmp_path)
    recs = ex.run_experiment(cfg, "out", progress=False)
    assert len(recs) == 3 and all(r["status"] in (FEASIBLE, OPTIMAL) for r in recs)
    assert len(list((tmp_path / "out/models").glob("transformer-*.onnx"))) == 1


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "text, match",
    [
        ("repeats: 1e8", r"key 'repeats'.*integer"),
        ("repeats: 100000000", r"400,000,000 runs.*at most 1,000,000"),
        ("seeds: [" + ", ".join(map(str, range(1001))) + "]\nrepeats: 1000", r"4,004,000 runs"),
        ("devices: true", r"key 'devices'"),
        ("devices: [2, true]", r"key 'devices.1'"),
        ("time_limit: .nan", r"key 'time_limit'.*finite"),
        ("time_limit: .inf", r"key 'time_limit'.*finite"),
        ("time_limit: true", r"key 'time_limit'"),
        ("time_limit: 1\ntime_limit: 2", r"duplicate key 'time_limit'"),
        ("methods: [{name: time, time_limit: .nan}]", r"key 'methods.0.time_limit'"),
        ("methods: [{name: slicegraph, options: {magic: 1}}]", r"methods.0.options.*'magic'"),
        ("graphs: [{layered: 1000000000}]", r"key 'graphs.0.layered'"),
        ("graphs: [{layered: 30, params: {width: true}}]", r"graphs.0.params.width"),
        ("graphs: [{layered: 30, params: {depth: 3}}]", r"unknown parameter 'depth'"),
        ("graphs: [{generate: transformer, params: {layers: 100000000}}]", r"floats"),
        ("graphs: [{generate: unet, params: {wdith: 3}}]", r"unknown parameter 'wdith'"),
        ("graphs: [{generate: unet, params: {depth: 2.5}}]", r"whole number"),
        ("graphs: [{dnnpart: Nope/none}]\nbenchmark_dir: /nonexistent", r"benchmark_dir"),
    ],
)
def test_bad_configs_one_line_exit_2_nothing_written(tmp_path, capsys, text, match):
    base = yaml.safe_dump({k: v for k, v in FAST.items() if k + ":" not in text})
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(base + text + "\n")
    assert_refused(capsys, ["experiment", cfg, "-o", tmp_path / "out"], match, watch=tmp_path)


def test_bad_output_folders_are_refused(tmp_path, capsys, monkeypatch):
    cfg = write(tmp_path / "cfg", FAST)
    (tmp_path / "full").mkdir()
    (tmp_path / "full/notes.txt").write_text("mine")
    (tmp_path / "afile").write_text("x")
    monkeypatch.chdir(tmp_path / "cfg")
    cases = [
        (tmp_path / "cfg", [], "holds the input"),
        (cfg, [], "replace an input"),
        (".", ["--resume"], "holds the input|current folder"),
        (tmp_path, ["--resume"], "holds the input|current folder"),
        (tmp_path / "full", [], "not empty; pass --resume"),
        (tmp_path / "full", ["--resume"], "not an experiment's results folder"),
        (tmp_path / "afile", [], "is a file"),
    ]
    for out, extra, match in cases:
        argv = ["experiment", cfg, "-o", out, *extra]
        assert_refused(capsys, argv, match, watch=tmp_path)


def test_jobs_and_size_warnings(tmp_path, capsys, monkeypatch):
    cfg = write(tmp_path, {**FAST, "devices": [2]})
    cores = os.cpu_count() or 1
    monkeypatch.setattr(ex, "WARN_RUNS", 1)
    assert run_cli(cfg, "-o", tmp_path / "out", "-j", cores + 1) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"mtpp: warning: --jobs {cores + 1} is more than the {cores} cores of this machine; "
        "runs will be slower",
        "mtpp: warning: 2 runs in this experiment; this may take a long time",
    ]
    assert_refused(
        capsys, ["experiment", cfg, "-o", tmp_path / "o2", "-j", 0], "--jobs", watch=tmp_path
    )
