"""mtpp run: honours --dim, ends on a dead stage with its error, and cleans up on Ctrl-C/SIGTERM."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from solver.backends.export import export_plan
from solver.backends.run import run_pipeline, run_plan
from solver.cli import main
from solver.core.cluster import load_cluster
from solver.core.errors import MtppError
from solver.frontends import load_graph
from solver.pipeline.registry import solve
from tests.backends.test_export import random_mlp
from tests.badinput import assert_refused


def _semaphores() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("sem.*")} if shm.is_dir() else set()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _feeders() -> int:
    return sum(t.name == "QueueFeederThread" and t.is_alive() for t in threading.enumerate())


@pytest.fixture
def dyn_model(tmp_path, capsys):
    """A random-weight MLP with a dynamic batch dim and a 3-stage plan made at batch=2."""
    model = random_mlp(tmp_path / "dyn.onnx", batch="batch")
    plan = tmp_path / "plan.json"
    argv = ["solve", model, "-m", "time", "-k", "3", "--out", plan, "-q", "--dim", "batch=2"]
    assert main([str(a) for a in argv]) == 0
    capsys.readouterr()
    return model, plan


def test_run_honours_dim(dyn_model, capsys):
    model, plan = dyn_model
    argv = ["run", str(model), str(plan), "--requests", "12", "--json", "--dim", "batch=2"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["inputs"] == {"x": [2, 8]}  # not the 0-size batch of the unfixed model
    assert out["stages"] == 3
    for key in ("measured", "simulated", "unsplit"):
        assert out[key]["throughput"] > 0 and out[key]["latency"] > 0


def test_run_profiles_the_model_once_with_the_dims(dyn_model, capsys, monkeypatch):
    """The simulator's node times come from one profile at the run's dims: the graph's own
    when it was loaded with --work measured, else one made after the run; --memory-ok reaches
    it."""
    import solver.frontends.onnx.profile as prof

    model, plan = dyn_model
    calls, real = [], prof.measured_work

    def counted(path, m, g, runs=5, memory_ok=False):
        calls.append((g.hints["dims"], memory_ok))
        return real(path, m, g, runs=runs, memory_ok=memory_ok)

    monkeypatch.setattr(prof, "measured_work", counted)
    argv = ["run", str(model), str(plan), "--requests", "5", "--json", "--dim", "batch=2"]
    assert main([*argv, "--memory-ok"]) == 0
    assert calls == [(["batch=2"], True)]
    capsys.readouterr()
    assert main([*argv, "--work", "measured"]) == 0
    assert calls[1:] == [(["batch=2"], False)]  # the loaded graph's profile, reused
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"]["throughput"] > 0


def _exported(tmp_path, model: Path, k: int = 3) -> tuple[dict, Path]:
    g = load_graph(model)
    plan = solve(g, load_cluster("ipu-pod", devices=k), "time")
    out = tmp_path / "stages"
    return export_plan(model, g, plan.assignment, out), out


def test_a_stage_that_cannot_load_ends_the_run(tmp_path):
    model = random_mlp(tmp_path / "m.onnx")
    report, folder = _exported(tmp_path, model)
    (folder / "stage1.onnx").write_bytes(b"not an onnx model")
    t0 = time.monotonic()
    before = set(mp.active_children())
    with pytest.raises(MtppError, match=r"^stage 1 \(stage1\.onnx\) failed: \w+: .+"):
        run_pipeline(model, folder, report, requests=10)
    assert time.monotonic() - t0 < 60
    assert set(mp.active_children()) <= before


def failing_model(path: Path) -> Path:
    """x -> MatMul -> Relu -> MatMul -> Gather(index 5 of a batch of 2): valid to import,
    fails only when run (index out of range)."""
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W2")
    idx = numpy_helper.from_array(np.array([5], dtype=np.int64), "idx")
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "W2"], ["h2"], name="mm2"),
        helper.make_node("Gather", ["h2", "idx"], ["y"], name="gather", axis=0),
    ]
    graph = helper.make_graph(
        nodes,
        "fails",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[w1, w2, idx],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_a_stage_that_fails_at_run_time_ends_the_cli_run(tmp_path, capsys):
    model = failing_model(tmp_path / "fails.onnx")
    plan = tmp_path / "plan.json"
    assert main(["solve", str(model), "-m", "time", "-k", "2", "--out", str(plan), "-q"]) == 0
    t0 = time.monotonic()
    line = assert_refused(
        capsys,
        ["run", model, plan, "--requests", "10"],
        r"^mtpp: error: stage \d \(stage\d\.onnx\) failed: .*(Gather|indices)",
        watch=tmp_path,
    )
    assert time.monotonic() - t0 < 60, line


def test_a_killed_stage_ends_the_run(tmp_path):
    model = random_mlp(tmp_path / "m.onnx")
    report, folder = _exported(tmp_path, model)
    before = set(mp.active_children())
    victims = []

    def kill_one(n: int) -> None:
        if not victims:
            victims.extend(p.pid for p in set(mp.active_children()) - before)
            os.kill(victims[0], signal.SIGKILL)

    t0 = time.monotonic()
    with pytest.raises(MtppError, match=r"^stage \d \(stage\d\.onnx\) died \(killed by SIGKILL\)"):
        run_pipeline(model, folder, report, requests=2000, progress=kill_one)
    assert time.monotonic() - t0 < 60
    assert len(victims) == 3  # the hook saw the stage processes
    assert not [pid for pid in victims if _exists(pid)]  # the others stopped and reaped
    assert set(mp.active_children()) <= before


@pytest.mark.parametrize("how", ["KeyboardInterrupt", "SIGTERM"])
def test_interrupting_a_run_stops_children_and_cleans_up(tmp_path, monkeypatch, how):
    model = random_mlp(tmp_path / "m.onnx")
    g = load_graph(model)
    plan = solve(g, load_cluster("ipu-pod", devices=3), "time")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    gc.collect()
    sems, feeders, before = _semaphores(), _feeders(), set(mp.active_children())
    seen: dict = {}

    def interrupt(n: int) -> None:
        if n == 3:
            seen["children"] = set(mp.active_children()) - before
            seen["pids"] = [p.pid for p in seen["children"]]
            seen["tmp"] = [p.name for p in tmp.iterdir()]
            seen["sems"] = _semaphores() - sems
            if how == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises before this ends
            raise KeyboardInterrupt

    old_term = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        run_plan(model, g, plan.assignment, requests=500, progress=interrupt)
    assert len(seen["children"]) == 3 and seen["tmp"] and seen["sems"]  # all to clean up
    assert not [pid for pid in seen["pids"] if _exists(pid)]  # stopped and reaped
    assert set(mp.active_children()) <= before
    assert list(tmp.iterdir()) == []  # the exported stages are gone
    assert signal.getsignal(signal.SIGTERM) == old_term
    gc.collect()
    assert _semaphores() <= sems  # every queue's named semaphore was unlinked
    assert _feeders() <= feeders


def test_run_refuses_absurd_or_bad_options(dyn_model, tmp_path, capsys):
    model, plan = dyn_model
    for argv, match in [
        (["--requests", "100000000"], r"--requests 100000000 .* at most 1,000,000"),
        (["--requests", "2"], r"--requests must be >= 3"),
        (["--seed", "-1"], r"--seed must be >= 0"),
    ]:
        assert_refused(capsys, ["run", model, plan, *argv], match, watch=tmp_path)


def test_ctrl_c_on_the_command_line(dyn_model, tmp_path):
    """The real thing: SIGINT to the whole process group, as a terminal's Ctrl-C sends it."""
    model, plan = dyn_model
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    argv = [sys.executable, "-m", "solver.cli", "run", str(model), str(plan), "--dim", "batch=2"]
    proc = subprocess.Popen(
        [*argv, "--requests", "1000000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a shell job
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("mtpp-run-*/stages")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # the stage processes are up and working
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "mtpp: interrupted"
    left = [p.name for p in tmp.iterdir() if p.name != ".ses"]  # onnxruntime's session id
    assert left == []
    deadline = time.monotonic() + 15  # the orphaned resource tracker is reaped by init
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break  # nothing of the group is left
        time.sleep(0.2)
    else:
        pytest.fail("processes of the interrupted run are still alive")


def test_closing_survives_a_feeder_left_waiting_by_an_interrupted_notify():
    """Ctrl-C inside ``Queue.put``'s ``Condition.notify`` leaves a stale waiter at the head of
    the condition; the close marker's single notify then wakes nobody, and the cleanup used to
    wait forever in ``join_thread`` (``mtpp run`` hung after Ctrl-C about once in six)."""
    from solver.backends.run import _Processes

    ctx = mp.get_context("spawn")
    q, errors = ctx.Queue(), ctx.Queue()
    q.put(1)  # starts the feeder thread
    deadline = time.monotonic() + 5
    while (q._buffer or not q._notempty._waiters) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the feeder has sent the item and waits for the next one
    assert q._notempty._waiters, "the feeder never waited"
    with q._notempty:  # what an interrupted notify leaves: a released, re-acquired waiter
        stale = threading.Lock()
        stale.acquire()
        q._notempty._waiters.appendleft(stale)
    procs = _Processes([], [q], errors, [])
    closer = threading.Thread(target=procs._close, daemon=True)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "closing the queues hung"
    assert not q._thread.is_alive()
