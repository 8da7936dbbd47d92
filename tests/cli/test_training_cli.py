"""mtpp solve --schedule: training plans on the command line (flags, table, JSON, the plan
file, one-line refusals), and mtpp evaluate / simulate of a training plan."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from solver.backends.schedule import simulate_training_plan
from solver.core.cluster import cluster_from_dict
from solver.core.training import TrainingSpec, training_cost
from solver.frontends import native
from solver.pipeline.exact.brute import all_assignments
from solver.pipeline.plan import OPTIMAL, read_plan_assignment, read_plan_training
from tests.cli_runner import run

RNG = np.random.default_rng(21)
N = 7
GRAPH = {
    "format": "mtpp-graph",
    "version": 1,
    "name": "train-toy",
    "cluster": {"devices": 3, "link_bandwidth": "4B/s"},
    "nodes": [
        {
            "name": f"layers.{i}.op",
            "work": float(RNG.uniform(0.5, 2.0)),
            "work_backward": float(RNG.uniform(0.5, 4.0)),
            "sizeout": int(RNG.integers(1, 5)),
            "stash": int(RNG.integers(1, 6)),
        }
        for i in range(N)
    ],
    "edges": [[f"layers.{i}.op", f"layers.{i + 1}.op"] for i in range(N - 1)],
    "params": [
        {"name": f"w{i}", "bytes": int(RNG.integers(1, 8)), "users": [f"layers.{i}.op"]}
        for i in range(N)
    ],
}


@pytest.fixture
def toy(tmp_path):
    p = tmp_path / "toy.json"
    p.write_text(json.dumps(GRAPH))
    return p


def _graph_and_cluster():
    g = native.from_dict(GRAPH)
    return g, cluster_from_dict(GRAPH["cluster"], "test")


def _brute(spec: TrainingSpec, capacity: float | None = None) -> float:
    g, cluster = _graph_and_cluster()
    cluster = cluster.with_memory(capacity) if capacity is not None else cluster
    costs = [training_cost(g, cluster, a, spec) for a in all_assignments(g, cluster.devices)]
    return min((c.iteration_time for c in costs if c.valid), default=math.inf)


@pytest.mark.parametrize(
    ("flags", "spec"),
    [
        (["--schedule", "gpipe", "--microbatches", "4"], TrainingSpec("gpipe", 4)),
        (["--schedule", "1f1b", "--microbatches", "8"], TrainingSpec("1f1b", 8)),
        (
            ["--schedule", "interleaved", "--microbatches", "6", "--virtual-stages", "2"],
            TrainingSpec("interleaved", 6, virtual_stages=2),
        ),
        (
            ["--schedule", "1f1b", "--microbatches", "4", "--optimizer-state", "8"],
            TrainingSpec("1f1b", 4, optimizer_state=8.0),
        ),
    ],
)
def test_solve_json_is_the_brute_force_optimum(toy, capsys, flags, spec):
    code, out, err = run(capsys, "solve", toy, *flags, "--json", "-q", "--time-limit", "20")
    assert code == 0, err
    d = json.loads(out)
    assert d["objective_kind"] == "iteration_time"
    assert d["status"] == OPTIMAL
    assert d["objective"] == d["training"]["iteration_time"]
    assert d["objective"] == pytest.approx(_brute(spec), rel=1e-9)
    t = d["training"]
    assert (t["schedule"], t["microbatches"], t["virtual_stages"], t["optimizer_state"]) == (
        spec.schedule,
        spec.microbatches,
        spec.virtual_stages,
        spec.optimizer_state,
    )
    assert t["valid"] and [s["stage"] for s in t["stages"]] == list(range(len(t["stages"])))
    assert d["lower_bound"] <= d["objective"]


def test_memory_flag_binds(toy, capsys):
    spec = TrainingSpec("1f1b", 8)
    code, out, _ = run(capsys, "solve", toy, "--schedule", "1f1b", "--microbatches", "8", "--json")
    free = json.loads(out)
    worst = max(s["memory_bytes"] for s in free["training"]["stages"])
    cap = math.floor(0.85 * worst)
    code, out, err = run(
        capsys,
        *["solve", toy, "--schedule", "1f1b", "--microbatches", "8", "--json"],
        "--memory",
        f"{cap}B",
        "-q",
    )
    assert code == 0, err
    tight = json.loads(out)
    assert tight["objective"] == pytest.approx(_brute(spec, float(cap)), rel=1e-9)
    assert tight["objective"] > free["objective"]
    assert all(s["memory_bytes"] <= cap for s in tight["training"]["stages"])


def test_solve_table_shows_stages_t_and_the_bound(toy, capsys):
    code, out, _ = run(capsys, "solve", toy, "--schedule", "1f1b", "--microbatches", "4", "-q")
    assert code == 0
    assert "objective (iteration time T, 1f1b, m = 4)" in out
    assert "binding lower bound: training" in out and "(docs/training.md)" in out
    header = out[out.index("stage") :]
    for column in ("block", "nodes", "F", "B", "t", "memory", "capacity", "flight"):
        assert column in header
    assert "practitioners' splits: uniform" in out


def test_without_schedule_the_json_is_the_inference_plan(toy, capsys):
    code, out, _ = run(capsys, "solve", toy, "--json", "-q")
    d = json.loads(out)
    assert "training" not in d and "objective_kind" not in d
    assert d["objective"] == max(b["f"] for b in d["blocks"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--microbatches", "4"], "--microbatches applies to training plans; add --schedule"),
        (["--optimizer-state", "8"], "--optimizer-state applies to training plans; add --schedule"),
        (
            ["--schedule", "1f1b", "--virtual-stages", "2"],
            "--virtual-stages applies to --schedule interleaved, not 1f1b",
        ),
        (
            ["--schedule", "interleaved", "--method", "joint"],
            "--schedule interleaved does not apply to --method joint yet; use gpipe or 1f1b",
        ),
        (
            ["--schedule", "1f1b", "--microbatches", "0"],
            "the number of microbatches must be from 1 to 1,000,000, got 0",
        ),
        (
            ["--schedule", "gpipe", "--optimizer-state", "-1"],
            "the optimizer state factor must be a number > 0, got -1.0",
        ),
        (["--schedule", "zb"], "invalid choice: 'zb'"),
    ],
)
def test_bad_training_options_exit_2_with_one_line(toy, capsys, flags, message):
    code, out, err = run(capsys, "solve", toy, *flags)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_plan_file_round_trip_and_evaluate(toy, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    flags = ["--schedule", "gpipe", "--microbatches", "4", "--out", plan, "-q"]
    code, _, err = run(capsys, "solve", toy, *flags)
    assert code == 0, err
    data = json.loads(plan.read_text())
    g, cluster = _graph_and_cluster()
    a, _ = read_plan_assignment(g, plan)
    spec = read_plan_training(data, plan)
    assert spec == TrainingSpec("gpipe", 4)
    assert training_cost(g, cluster, a, spec).iteration_time == data["objective"]
    code, out, err = run(capsys, "evaluate", toy, plan, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["training"]["iteration_time"] == pytest.approx(data["objective"], rel=1e-12)
    assert d["objective"] == pytest.approx(data["objective"], rel=1e-12)
    assert d["valid"] and d["claim"] == "consistent"


def test_simulate_a_training_plan(toy, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    flags = ["--schedule", "1f1b", "--microbatches", "6", "--out", plan, "-q"]
    assert run(capsys, "solve", toy, *flags)[0] == 0
    gantt = tmp_path / "gantt.png"
    code, out, err = run(capsys, "simulate", toy, plan, "--json", "--gantt", gantt)
    assert code == 0, err
    d = json.loads(out)
    g, cluster = _graph_and_cluster()
    a, data = read_plan_assignment(g, plan)
    expected = simulate_training_plan(g, cluster, a, read_plan_training(data, plan))
    assert d["makespan"] == pytest.approx(expected.makespan, rel=1e-12)
    assert d["iteration_time"] == pytest.approx(data["objective"], rel=1e-12)
    assert d["relation"]["lower"] <= d["makespan"] <= d["relation"]["upper"] * (1 + 1e-12)
    assert [s["inflight_simulated"] for s in d["stages"]] == [
        s["inflight_model"] for s in d["stages"]
    ]
    assert gantt.stat().st_size > 0
