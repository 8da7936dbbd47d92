"""solver.api: one call for the pipeline methods and joint, checked against the planners it
fronts (brute force, plan_joint) and its refusals word for word."""

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
from solver.frontends import native
from solver.joint import plan_joint
from solver.pipeline.exact.brute import brute_force
from solver.pipeline.options import SolveOptions
from solver.pipeline.registry import METHODS
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
