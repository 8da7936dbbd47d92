"""solver.api: one call for the pipeline methods, SPMD methods and joint, checked against the
planners it fronts (brute force, solve_sharding, plan_joint) and its refusals word for word."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import onnx
import pytest

from solver.api import METHOD_NAMES, Problem, check_request, load, solve
from solver.core.cluster import Cluster, load_cluster
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.result import OPTIMAL
from solver.core.training import TrainingSpec
from solver.frontends import native
from solver.joint import plan_joint
from solver.pipeline.exact.brute import brute_force
from solver.pipeline.options import SolveOptions
from solver.pipeline.registry import METHODS
from solver.spmd.model import load_model
from solver.spmd.plan import METHODS as SPMD_METHODS
from solver.spmd.solve import solve_sharding
from tests.cli_runner import run
from tests.joint.test_planner import tiny_model


def random_graph(seed: int, n: int = 7) -> Graph:
    """A random DAG with random work, outputs and one shared parameter."""
    rng = np.random.default_rng(seed)
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
    return Graph.build(
        [f"v{i}" for i in range(n)],
        rng.random(n) * 5,
        rng.random(n) * 2,
        edges,
        params=[("p", float(rng.random() * 3), [0, n - 1])],
        name="random",
    )


class Recorder:
    """A progress watcher that keeps what it is told."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.updates: list[tuple[float, float]] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def update(self, objective: float, bound: float, elapsed: float | None = None) -> None:
        self.updates.append((objective, bound))


# ---------------------------------------------------------------- pipeline methods


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpsat_through_the_api_finds_the_brute_force_optimum(tmp_path, seed):
    g = random_graph(seed)
    c = Cluster("c", 3, link_bandwidth=2.0)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(native.to_dict(g)))
    best = brute_force(g, c)
    opts = SolveOptions(time_limit=20.0, workers=1)
    from_file = solve(Problem(graph_path=path, cluster=c), "cpsat", opts)
    loaded = solve(Problem(graph=g, cluster=c), "cpsat", opts)
    for plan in (from_file, loaded):
        assert plan.kind == "pipeline" and plan.status == OPTIMAL
        assert plan.objective == pytest.approx(best.objective, rel=1e-6)
        assert plan.objective == evaluate(g, c, plan.assignment).objective
        assert validate(g, c, plan.assignment) == []


def test_load_applies_devices_and_memory_to_a_named_cluster(tmp_path):
    g = random_graph(3)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(native.to_dict(g)))
    loaded = load(Problem(graph_path=path, cluster="dgx-a100", devices=3, memory=5e9))
    assert loaded.graph.fingerprint == g.fingerprint and loaded.graph.n == g.n
    assert loaded.cluster == load_cluster("dgx-a100", 3).with_memory(5e9)
    given = load(Problem(graph=g, cluster=Cluster("c", 4), devices=2))
    assert given.graph is g and given.cluster == Cluster("c", 2)


def test_progress_reaches_the_reporter_only_when_asked():
    g = random_graph(4, n=12)
    c = Cluster("c", 3, link_bandwidth=2.0)
    seen = Recorder()
    opts = SolveOptions(time_limit=2.0, workers=1, progress=True, reporter=seen)
    plan = solve(Problem(graph=g, cluster=c), "slicegraph", opts)
    assert seen.notes == ["searching topological orders"] and seen.updates
    # each incumbent is a plan of the search, with the universal bound of the problem
    assert all(bound == lower_bound(g, c) for _, bound in seen.updates)
    assert min(obj for obj, _ in seen.updates) >= plan.objective * (1 - 1e-9)
    quiet = Recorder()
    solve(Problem(graph=g, cluster=c), "slicegraph", SolveOptions(time_limit=2.0, reporter=quiet))
    assert quiet.notes == [] and quiet.updates == []


# ---------------------------------------------------------------- joint


def test_joint_through_the_api_is_plan_joint(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    seen = Recorder()
    opts = SolveOptions(time_limit=20.0, progress=True, reporter=seen, extra={"space": "pipeline"})
    plan = solve(Problem(graph_path=path, cluster="dgx-a100", devices=4), "joint", opts)
    direct = plan_joint(path, load_cluster("dgx-a100", 4), time_limit=20.0, space="pipeline")
    assert plan.space == direct.space == "pipeline" and plan.status == direct.status == OPTIMAL
    assert plan.objective == pytest.approx(direct.objective, rel=1e-9)
    assert [s.devices for s in plan.stages] == [s.devices for s in direct.stages]
    assert seen.notes and seen.notes[0] == "loading the model"
    assert math.isfinite(plan.lower_bound) and plan.lower_bound <= plan.objective


def test_joint_memory_limit_reaches_the_planner(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    problem = Problem(graph_path=path, cluster="dgx-a100", devices=4, memory=100.0)
    with pytest.raises(MtppError, match=r"'mm\d?' \(MatMul\) fits on no"):
        solve(problem, "joint", SolveOptions(time_limit=20.0))


# ---------------------------------------------------------------- refusals

JOINT_REFUSALS = [
    ({"space": "ring"}, "roofline", "--set space=ring: use one of joint, pipeline, sharding"),
    ({"population": 3}, "roofline", "--set population: --method joint takes only --set space=..."),
    ({"optimal_perf": True}, "roofline", "--optimal-perf does not apply to --method joint"),
    ({"sharding": "s.yaml"}, "roofline", "--sharding does not apply to --method joint"),
    ({}, "flops", "--work does not apply to --method joint"),
]


@pytest.mark.parametrize(("extra", "work", "message"), JOINT_REFUSALS)
def test_joint_refusals_come_before_anything_is_loaded(tmp_path, extra, work, message):
    missing = tmp_path / "absent.onnx"  # never read: the request is refused first
    problem = Problem(graph_path=missing, cluster="no-such-cluster", work=work)
    with pytest.raises(MtppError, match=f"^{re.escape(message)}$"):
        solve(problem, "joint", SolveOptions(extra=extra))


def test_joint_needs_the_onnx_model(tmp_path):
    graph = tmp_path / "g.json"
    expected = (
        f"{graph}: --method joint needs the ONNX model (a cost graph has no operators to "
        "shard); pass the .onnx file"
    )
    with pytest.raises(MtppError, match=f"^{re.escape(expected)}$"):
        solve(Problem(graph_path=graph), "joint")
    with pytest.raises(MtppError, match=r"^graph 'random': --method joint needs the ONNX model"):
        solve(Problem(graph=random_graph(0)), "joint")


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        (
            "nope",
            SolveOptions(),
            f"unknown method 'nope'; choose one of {', '.join([*METHODS, 'joint'])}",
        ),
        (
            "joint",
            SolveOptions(time_limit=-1),
            "--time-limit must be a finite number > 0 seconds, got -1",
        ),
        ("cpsat", SolveOptions(seed=-1), "--seed must be an integer in 0..2147483647, got -1"),
        (
            "cpsat",
            SolveOptions(extra={"space": "joint"}),
            "unknown option 'space' for cpsat; valid: cpsat_params, tie_break, tie_break_seconds",
        ),
    ],
)
def test_bad_requests_are_refused_with_the_flag_to_fix(tmp_path, method, options, message):
    problem = Problem(graph_path=tmp_path / "absent.onnx")
    with pytest.raises(MtppError, match=f"^{re.escape(message)}$"):
        check_request(problem, method, options)
    with pytest.raises(MtppError, match=f"^{re.escape(message)}$"):
        solve(problem, method, options)


def test_a_problem_without_a_graph_is_refused():
    with pytest.raises(MtppError, match="^a problem needs a graph file"):
        solve(Problem(cluster=Cluster("c", 2)), "time")
    assert (*METHODS, "joint") == METHOD_NAMES


# ---------------------------------------------------------------- spmd and the kinds


def test_spmd_through_the_api_is_solve_sharding(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    opts = SolveOptions(time_limit=20.0, extra={"mesh": (2, 2)})
    res = solve(Problem(graph_path=path, cluster="dgx-a100", devices=4), "cpsat", opts, "spmd")
    direct = solve_sharding(
        path, mesh=(2, 2), method="cpsat", cluster=load_cluster("dgx-a100", 4), time_limit=20.0
    )
    assert res.kind == "spmd" and res.status == direct.status == OPTIMAL
    assert res.objective == pytest.approx(direct.objective, rel=1e-9)
    assert res.lower_bound == pytest.approx(direct.lower_bound, rel=1e-9)
    assert res.to_dict()["mesh"]["shape"] == [2, 2]


def test_every_kind_answers_with_the_result_contract(tmp_path):
    """A pipeline plan, an SPMD program and a joint plan are read the same way: kind, status,
    objective, a bound at most the objective, the gap between them."""
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    sm = load_model(path)  # a loaded model is used as is (joint, spmd)
    cluster = load_cluster("dgx-a100", 4)
    opts = SolveOptions(time_limit=20.0)
    results = [
        solve(Problem(graph_path=path, cluster=cluster), "idealdp", opts),
        solve(Problem(graph_path=path, model=sm, cluster=cluster), "dp", opts, kind="spmd"),
        solve(Problem(graph_path=path, model=sm, cluster=cluster), "joint", opts),
    ]
    assert [r.kind for r in results] == ["pipeline", "spmd", "joint"]
    for r in results:
        assert r.status in ("OPTIMAL", "FEASIBLE") and math.isfinite(r.objective) > 0
        assert r.lower_bound is not None and r.lower_bound <= r.objective * (1 + 1e-12)
        assert r.gap == pytest.approx((r.objective - r.lower_bound) / r.objective, abs=1e-12)
        assert json.loads(json.dumps(r.to_dict()))["status"] == r.status
    direct = plan_joint(path, cluster, time_limit=20.0)
    assert results[2].objective == pytest.approx(direct.objective, rel=1e-9)


KIND_REFUSALS = [
    ("cpsat", "ring", {}, "unknown kind 'ring'; choose one of pipeline, spmd, joint"),
    (
        "time",
        "spmd",
        {},
        f"unknown SPMD method 'time'; choose one of {', '.join(SPMD_METHODS)}",
    ),
    ("dp", "spmd", {"space": "joint"}, "space: an SPMD method takes only mesh and config"),
    (
        "cpsat",
        "joint",
        {},
        "unknown method 'cpsat'; choose one of joint",
    ),
    ("joint", "pipeline", {}, "unknown method 'joint'; choose one of " + ", ".join(METHODS)),
]


@pytest.mark.parametrize(("method", "kind", "extra", "message"), KIND_REFUSALS)
def test_a_method_of_another_kind_is_refused_before_loading(tmp_path, method, kind, extra, message):
    problem = Problem(graph_path=tmp_path / "absent.onnx", cluster="no-such-cluster")
    with pytest.raises(MtppError, match=f"^{re.escape(message)}$"):
        solve(problem, method, SolveOptions(extra=extra), kind=kind)


def test_spmd_needs_the_onnx_model_and_its_options_checked(tmp_path):
    graph = tmp_path / "g.json"
    expected = (
        f"{graph}: an SPMD plan needs the ONNX model (a cost graph has no operators to "
        "shard); pass the .onnx file"
    )
    with pytest.raises(MtppError, match=f"^{re.escape(expected)}$"):
        solve(Problem(graph_path=graph), "dp", kind="spmd")
    onnx_path = tmp_path / "absent.onnx"
    with pytest.raises(MtppError, match=r"^--seed must be"):
        solve(Problem(graph_path=onnx_path), "cpsat", SolveOptions(seed=-1), kind="spmd")


def test_joint_refuses_the_interleaved_schedule(tmp_path):
    problem = Problem(graph_path=tmp_path / "absent.onnx")
    options = SolveOptions(training=TrainingSpec("interleaved", 4))
    expected = "--schedule interleaved does not apply to --method joint yet; use gpipe or 1f1b"
    with pytest.raises(MtppError, match=f"^{re.escape(expected)}$"):
        solve(problem, "joint", options)


def test_a_training_plan_of_an_onnx_model_prices_its_backward_as_the_command_line(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    spec = TrainingSpec("1f1b", 4)
    options = SolveOptions(time_limit=20.0, workers=1, training=spec)
    plan = solve(Problem(graph_path=path, devices=2), "cpsat", options)
    flags = ["-k", "2", "--schedule", "1f1b", "--microbatches", "4", "--workers", "1"]
    code, out, _ = run(capsys, "solve", path, *flags, "--json", "-q")
    cli = json.loads(out)
    assert code == 0 and plan.status == cli["status"] == OPTIMAL
    assert plan.objective == pytest.approx(cli["objective"], rel=1e-9)
    # the backward is what the plan pays for: the graph read without it plans another T
    forward_only = load(Problem(graph_path=path, devices=2))
    assert load(Problem(graph_path=path, devices=2), training_costs=True).graph.work_backward.any()
    other = solve(Problem(graph=forward_only.graph, cluster=forward_only.cluster), "cpsat", options)
    assert other.objective != pytest.approx(plan.objective, rel=1e-6)
