"""mtpp experiment on Ray: the same records as the process pool, failures recorded, Ctrl-C and
resume across backends, files shipped through the object store, and bad input refused."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import pytest
import yaml

import solver.experiments.driver as ex
import solver.experiments.ray_backend as er
import solver.experiments.runs as runs_mod
from solver.core.errors import MtppError
from solver.frontends import load_graph
from solver.pipeline.plan import ERROR, FEASIBLE, OPTIMAL
from tests.badinput import assert_refused
from tests.conftest import bench_path
from tests.experiment_helpers import FAST, jsonl_ids, run_cli, write

ROOT = Path(__file__).resolve().parents[2]


def records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}


def assert_cpus_free(ray, seconds: float = 15) -> None:
    """Every CPU of the Ray instance is free again (stopped tasks really stopped)."""
    t0 = time.perf_counter()
    while ray.available_resources().get("CPU", 0) < 2:
        assert time.perf_counter() - t0 < seconds, ray.available_resources()
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance (2 CPUs) for every Ray test of this module; the runner uses a
    running session as it is. Test helpers are shipped to the workers by value."""
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


# ---------------------------------------------------------------------- same rows as the pool
@pytest.mark.ray
def test_smoke_on_ray_gives_the_same_records_as_the_pool(tmp_path, ray_session):
    bench_path("LayerGraphs/bert24_inference")
    data = yaml.safe_load((ROOT / "configs/experiments/smoke.yaml").read_text())
    for g in data["graphs"]:
        if "onnx" in g:
            g["onnx"] = str(ROOT / "models/small/transformer.onnx")
    data["methods"] = ["cpsat", "poprt", "time", "uniform"]  # deterministic results
    cfg = write(tmp_path, data)
    pool = ex.run_experiment(cfg, tmp_path / "pool", jobs=2, progress=False)
    on_ray = ex.run_experiment(cfg, tmp_path / "ray", progress=False, backend="ray")
    assert len(pool) == len(on_ray) == 3 * 2 * 4
    a, b = records(tmp_path / "pool"), records(tmp_path / "ray")
    assert set(a) == set(b) == {r["id"] for r in pool}
    for rid, x in a.items():
        y = b[rid]
        assert set(x) == set(y)  # the same record, field for field, but the timing
        assert {k: v for k, v in x.items() if k not in ("wall_seconds", "objective")} == {
            k: v for k, v in y.items() if k not in ("wall_seconds", "objective")
        }
        assert y["objective"] == pytest.approx(x["objective"], rel=1e-9)
    assert {r["status"] for r in on_ray} == {OPTIMAL, FEASIBLE}
    assert sum(r["status"] == OPTIMAL and r["method"] == "cpsat" for r in on_ray) == 6  # all six
    # the driver wrote every plan; the plans agree
    for rid in a:
        pa = json.loads((tmp_path / "pool/plans" / f"{rid}.json").read_text())
        pb = json.loads((tmp_path / "ray/plans" / f"{rid}.json").read_text())
        assert pa["objective"] == pytest.approx(pb["objective"], rel=1e-9)
        assert pa["status"] == pb["status"] and pa["graph"] == pb["graph"]
    csv_a = (tmp_path / "pool/results.csv").read_text().splitlines()
    csv_b = (tmp_path / "ray/results.csv").read_text().splitlines()
    assert len(csv_a) == len(csv_b) == 25
    sa, sb = (tmp_path / "pool/summary.md").read_text(), (tmp_path / "ray/summary.md").read_text()
    assert sa.split("| method | statuses |")[1] == sb.split("| method | statuses |")[1]


# ---------------------------------------------------------------------- failures
@pytest.mark.ray
def test_a_run_that_raises_is_recorded_as_failed_and_files_come_by_object_store(
    tmp_path, ray_session, monkeypatch, capsys
):
    def raise_on_uniform(desc, gs_data, graph, cluster, workers):
        from solver.experiments.runs import solve_run as real

        if desc["method"] == "uniform":
            raise RuntimeError(f"boom on {desc['devices']}")
        rec = real(desc, gs_data, graph, cluster, workers)
        return dict(rec, shipped=graph, shipped_exists=Path(graph).is_file())

    monkeypatch.setattr(runs_mod, "solve_run", raise_on_uniform)
    onnx = tmp_path / "models" / "unet.onnx"
    onnx.parent.mkdir()
    onnx.write_bytes((ROOT / "models/small/unet.onnx").read_bytes())
    data = {**FAST, "graphs": [*FAST["graphs"], {"onnx": "models/unet.onnx", "work": "flops"}]}
    cfg = write(tmp_path, data)
    out = tmp_path / "out"
    capsys.readouterr()
    assert run_cli(cfg, "-o", out, "--backend", "ray") == 1  # some runs failed
    recs = records(out)
    assert len(recs) == 8 and len(jsonl_ids(out)) == 8
    failed = [r for r in recs.values() if r["status"] == ERROR]
    assert sorted(r["error"] for r in failed) == sorted(
        ["RuntimeError: boom on 2", "RuntimeError: boom on 3"] * 2
    )
    assert all(r["method"] == "uniform" and r["objective"] is None for r in failed)
    good = [r for r in recs.values() if r["status"] != ERROR]
    assert len(good) == 4 and all(r["status"] == FEASIBLE for r in good)
    # each worker read its graph from a private copy of the shipped bytes, never from the
    # driver's path, and the copy is gone afterwards
    for r in good:
        assert "mtpp-run-" in r["shipped"] and r["shipped_exists"]
        assert not r["shipped"].startswith(str(tmp_path)) and not Path(r["shipped"]).exists()
    assert {Path(r["shipped"]).suffix for r in good} == {".json", ".onnx"}
    unet = load_graph(ROOT / "models/small/unet.onnx", work="flops")
    assert {r["nodes"] for r in good if r["graph"] == "unet"} == {unet.n}
    assert len(list((out / "plans").glob("*.json"))) == 4  # failed runs have no plan


@pytest.mark.ray
def test_a_run_that_hangs_times_out_and_a_lost_worker_is_recorded(
    tmp_path, ray_session, monkeypatch
):
    """Only 'uniform' has a short time limit (1 s: stopped after 1 + 2 s); 'params', whose
    worker dies at k = 3, and 'time' have a minute, so the lost worker's record comes when
    Ray reports the crash after its retry (however long the new worker takes to start on a
    loaded machine), not within a fixed time."""

    def hang_or_die(desc, gs_data, graph, cluster, workers):
        import os

        from solver.experiments.runs import solve_run as real

        if desc["method"] == "uniform":
            time.sleep(600)
        if desc["method"] == "params" and desc["devices"] == 3:
            os._exit(9)  # the worker process dies (as the out-of-memory killer would do it)
        return real(desc, gs_data, graph, cluster, workers)

    monkeypatch.setattr(runs_mod, "solve_run", hang_or_die)
    monkeypatch.setattr(er, "TIMEOUT_FACTOR", 1.0)
    monkeypatch.setattr(er, "TIMEOUT_GRACE", 2.0)
    methods = [
        {"name": "time", "time_limit": 60},
        {"name": "uniform", "time_limit": 1},
        {"name": "params", "time_limit": 60},
    ]
    cfg = write(tmp_path, {**FAST, "methods": methods})
    t0 = time.perf_counter()
    recs = ex.run_experiment(cfg, tmp_path / "out", progress=False, backend="ray")
    assert time.perf_counter() - t0 < 300  # the hanging runs were stopped, not awaited
    assert_cpus_free(ray_session, seconds=60)
    by = {(r["method"], r["devices"]): r for r in recs}
    assert len(by) == 6
    for k in (2, 3):
        assert by["uniform", k]["status"] == ERROR
        assert by["uniform", k]["error"] == "timed out: stopped after 3 s"
        assert by["time", k]["status"] == FEASIBLE
    assert by["params", 3]["status"] == ERROR
    assert by["params", 3]["error"].startswith("Ray worker lost (WorkerCrashedError)")
    assert by["params", 2]["status"] == FEASIBLE


# ---------------------------------------------------------------------- Ctrl-C and resume
@pytest.mark.ray
def test_interrupted_ray_sweep_keeps_finished_runs_and_resume_does_only_the_rest(
    tmp_path, ray_session, monkeypatch, capsys
):
    def slow_unless_time(desc, gs_data, graph, cluster, workers):
        from solver.experiments.runs import solve_run as real

        if desc["method"] != "time":
            time.sleep(120)  # still running when the driver is interrupted
        return real(desc, gs_data, graph, cluster, workers)

    real_wait = er._wait
    got = []

    def wait_then_interrupt(refs, timeout):
        if len(got) >= 2:
            raise KeyboardInterrupt  # Ctrl-C once the two 'time' runs are in
        ready = real_wait(refs, timeout)
        got.extend(ready)
        return ready

    monkeypatch.setattr(runs_mod, "solve_run", slow_unless_time)
    monkeypatch.setattr(er, "_wait", wait_then_interrupt)
    cfg = write(tmp_path, FAST)
    out = tmp_path / "out"
    capsys.readouterr()
    t0 = time.perf_counter()
    assert run_cli(cfg, "-o", out, "--backend", "ray") == 130
    assert time.perf_counter() - t0 < 60  # the sleeping tasks were cancelled
    assert_cpus_free(ray_session)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"mtpp: interrupted: 2 of 4 runs recorded in {out}; run the same command "
        "with --resume to continue"
    ]
    first = records(out)
    assert sorted(r["method"] for r in first.values()) == ["time", "time"]
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    monkeypatch.undo()
    # the Ray workers are free again (the sleeping tasks were killed): resume finishes at once
    t0 = time.perf_counter()
    assert run_cli(cfg, "-o", out, "--backend", "ray", "--resume") == 0
    assert time.perf_counter() - t0 < 60
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # finished runs not redone
    ids = jsonl_ids(out)
    assert len(ids) == 4 and len(set(ids)) == 4 and set(ids[:2]) == set(first)
    assert all(r["status"] == FEASIBLE for r in records(out).values())


@pytest.mark.ray
def test_resume_across_backends(tmp_path, ray_session):
    cfg = write(tmp_path, FAST)
    out = tmp_path / "out"
    assert run_cli(cfg, "-o", out) == 0  # the local pool
    runs = sorted((out / "runs").glob("*.json"))
    runs[0].unlink()
    runs[3].unlink()
    keep = {p: p.stat().st_mtime_ns for p in runs[1:3]}
    assert run_cli(cfg, "-o", out, "--backend", "ray", "--resume") == 0
    assert {p: p.stat().st_mtime_ns for p in keep} == keep
    assert runs[0].exists() and runs[3].exists()
    assert sorted(jsonl_ids(out)) == sorted(p.stem for p in runs)
    (out / "runs" / runs[1].name).unlink()
    assert run_cli(cfg, "-o", out, "--resume") == 0  # and back on the pool
    assert len(set(jsonl_ids(out))) == len(jsonl_ids(out)) == 4


# ---------------------------------------------------------------------- CPUs per run
@pytest.mark.ray
def test_cpus_per_run_come_from_the_config_and_the_nodes(
    tmp_path, ray_session, monkeypatch, capsys
):
    def note_workers(desc, gs_data, graph, cluster, workers):
        from solver.experiments.runs import solve_run as real

        return dict(real(desc, gs_data, graph, cluster, workers), cpus=workers)

    monkeypatch.setattr(runs_mod, "solve_run", note_workers)
    methods = ["cpsat", "time", {"name": "uniform", "cpus": 2}]
    data = {**FAST, "devices": [2], "methods": methods, "backend": "ray"}
    recs = ex.run_experiment(write(tmp_path, data), tmp_path / "out", progress=False)
    assert {r["method"]: r["cpus"] for r in recs} == {"cpsat": 2, "time": 1, "uniform": 2}
    data["methods"] = ["time", {"name": "cpsat", "cpus": 3}]
    cfg = write(tmp_path / "b", data)
    argv = ["experiment", cfg, "-o", tmp_path / "b/out"]
    assert_refused(capsys, argv, r"key 'methods.1.cpus': 3 CPUs per run.*has 2", watch=tmp_path)


# ---------------------------------------------------------------------- bad input
def test_ray_missing_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    cfg = write(tmp_path, FAST)
    hint = r'needs Ray, an optional extra: pip install "mtpp\[ray\]" \(or pip install "\.\[ray\]"'
    argv = ["experiment", cfg, "-o", tmp_path / "out", "--backend", "ray"]
    assert_refused(capsys, argv, hint, watch=tmp_path)
    cfg = write(tmp_path / "b", {**FAST, "backend": "ray"})
    assert_refused(capsys, ["experiment", cfg, "-o", tmp_path / "o"], hint, watch=tmp_path)


@pytest.mark.parametrize(
    "extra, data, match",
    [
        (["--address", "10.0.0.1:6379"], {}, "--address joins a Ray cluster: use it with"),
        (["--backend", "ray", "-j", "2"], {}, "--jobs is for the local backend"),
        (["--backend", "dask"], {}, "--backend: invalid choice"),
        (["--backend", "ray", "--address", " "], {}, "--address is empty"),
        ([], {"address": "10.0.0.1:6379"}, "key 'address'.*backend: ray"),
        ([], {"backend": "spark"}, "key 'backend'"),
        ([], {"methods": [{"name": "time", "cpus": 0}]}, r"key 'methods.0.cpus'"),
        ([], {"methods": [{"name": "time", "cpus": True}]}, r"key 'methods.0.cpus'"),
    ],
)
def test_bad_backend_options_are_refused(tmp_path, capsys, extra, data, match):
    cfg = write(tmp_path, {**FAST, **data})
    argv = ["experiment", cfg, "-o", tmp_path / "out", *extra]
    assert_refused(capsys, argv, match, watch=tmp_path)


@pytest.mark.parametrize(
    "address, match",
    [
        ("nonsense", "give HOST:PORT of the Ray head node"),
        ("127.0.0.1:99999", "give HOST:PORT"),
        ("127.0.0.1:1", r"cannot reach the Ray head node at 127.0.0.1:1 \(Connection refused\)"),
    ],
)
def test_unreachable_address_is_refused_at_once(tmp_path, capsys, address, match):
    pytest.importorskip("ray")
    cfg = write(tmp_path, FAST)
    argv = ["experiment", cfg, "-o", tmp_path / "out", "--backend", "ray", "--address", address]
    t0 = time.perf_counter()
    assert_refused(capsys, argv, match, watch=tmp_path)
    assert time.perf_counter() - t0 < 10


def test_address_in_the_config_is_used_and_checked(tmp_path, capsys):
    pytest.importorskip("ray")
    cfg = write(tmp_path, {**FAST, "backend": "ray", "address": "127.0.0.1:1"})
    argv = ["experiment", cfg, "-o", tmp_path / "out"]
    assert_refused(capsys, argv, "cannot reach the Ray head node at 127.0.0.1:1", watch=tmp_path)
    # the command line wins: --backend local ignores the config's Ray address
    assert run_cli(cfg, "-o", tmp_path / "out", "--backend", "local") == 0
    assert len(records(tmp_path / "out")) == 4


# ---------------------------------------------------------------------- progress
def test_progress_counts_runs_failures_and_time_left(capsys, monkeypatch):
    from solver.experiments import progress as ep

    clock = iter([100.0, 100.0, 110.0, 130.0])  # start, then after each finished run
    monkeypatch.setattr(ep.time, "perf_counter", lambda: next(clock))
    with ep.SweepProgress(True, total=5, done=1) as bar:  # one run recorded before (resume)
        bar.advance("g k=2 time: FEASIBLE")
        bar.advance("g k=2 [red]uniform: ERROR", failed=True)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[")]
    # 10 s for the first new run, 3 to go: 30 s; 15 s each after two, 2 to go: 30 s
    assert lines == [
        "[2/5, 0:00:30 left] g k=2 time: FEASIBLE",
        "[3/5, 1 failed, 0:00:30 left] g k=2 [red]uniform: ERROR",
    ]
    assert (bar.done, bar.failed) == (3, 1)


# ---------------------------------------------------------------------- shipping files
def test_bundle_round_trip_keeps_external_data(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 64])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "src" / "m.onnx"
    (src.parent / "weights").mkdir(parents=True)
    onnx.save_model(
        model, src, save_as_external_data=True, location="weights/m.bin", size_threshold=0
    )
    bundle = er.file_bundle(src)
    assert sorted(bundle["files"]) == ["m.onnx", "weights/m.bin"] and bundle["main"] == "m.onnx"
    copy = er.unpack(bundle, tmp_path / "dst")
    assert copy == (tmp_path / "dst/m.onnx").resolve()
    a, b = load_graph(src, work="flops"), load_graph(copy, work="flops")
    assert a.n == b.n and a.names == b.names and np.array_equal(a.work, b.work)
    assert np.array_equal(a.p_size, b.p_size) and b.p_size.sum() == 64 * 64 * 4
    with pytest.raises(MtppError, match="stay inside"):
        er.unpack({"main": "x", "files": {"../evil": b"x"}}, tmp_path / "dst2")
    assert not (tmp_path / "evil").exists()
