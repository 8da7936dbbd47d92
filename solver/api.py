"""One call for every planner: ``solve(problem, method, options) -> Result``.

A :class:`Problem` says what to plan: a graph file (or an already loaded cost graph), the
cluster, and the settings of an ONNX model. :func:`solve` runs a pipeline method (one of
:data:`solver.pipeline.registry.METHODS`, on the cost graph) or ``joint``
(:func:`solver.joint.plan_joint` on the ONNX model: pipeline stages on sub-meshes, sharded
inside). A request no planner can honour raises :class:`~solver.core.errors.MtppError` with one
line naming what to fix, worded with the command line's flags (``--set``, ``--work``, ...);
:func:`check_request` makes these checks alone, before anything is loaded.

>>> from solver.core.cluster import Cluster
>>> from solver.frontends.workloads import layered_dag
>>> plan = solve(Problem(graph=layered_dag(12), cluster=Cluster("c", 2)), "time")
>>> plan.kind, plan.k
('pipeline', 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from solver.core.cluster import Cluster, load_cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.result import Result
from solver.frontends import load_graph, resolve_cluster
from solver.joint import plan_joint
from solver.joint.submesh import SPACES
from solver.pipeline import registry
from solver.pipeline.options import SolveOptions, check_method_options, check_solve_options

JOINT = "joint"
METHOD_NAMES = (*registry.METHODS, JOINT)
# option keys the command line fills from its own flags, refused by joint under the flag's name
JOINT_REFUSED_FLAGS = {"optimal_perf": "--optimal-perf", "sharding": "--sharding"}


@dataclass(frozen=True)
class Problem:
    """What to plan.

    ``graph_path``: an ONNX model, an mtpp graph JSON or a dnn-partitioning JSON (joint: the
    ONNX model); ``graph``: an already loaded cost graph (pipeline methods; ``graph_path`` is
    then not read). ``cluster``: a :class:`Cluster`, a preset name or a cluster YAML file (None:
    what the graph file states, else the default preset); ``devices`` and ``memory`` (bytes per
    device) override it. ``dims`` fixes symbolic dimensions of an ONNX model; ``work`` is its
    work model (roofline, flops or measured; joint: roofline only).
    """

    graph_path: str | Path | None = None
    graph: Graph | None = None
    cluster: Cluster | str | None = None
    devices: int | None = None
    memory: float | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    work: str = "roofline"


@dataclass(frozen=True)
class LoadedProblem:
    """The cost graph and the cluster of a :class:`Problem` (devices and memory applied)."""

    graph: Graph
    cluster: Cluster


def solve(problem: Problem, method: str, options: SolveOptions | None = None) -> Result | None:
    """Plan ``problem`` with ``method``: a pipeline :class:`~solver.pipeline.plan.Plan` (None
    when it is proven that no valid plan exists) or, for ``joint``, a
    :class:`~solver.joint.plan.JointPlan` (it raises when no joint plan fits). ``options``: the
    time limit, workers, seed, gap, the method's own options (``extra``; joint takes only
    ``space``) and where progress goes (``progress``, ``reporter``)."""
    options = options or SolveOptions()
    check_request(problem, method, options)
    if method == JOINT:
        return _solve_joint(problem, options)
    loaded = load(problem)
    return registry.solve(loaded.graph, loaded.cluster, method, options)


def check_request(problem: Problem, method: str, options: SolveOptions) -> None:
    """Refuse, before anything is loaded, a method, an option or a problem setting that
    ``method`` cannot honour (one line naming what to fix)."""
    if method not in METHOD_NAMES:
        raise MtppError(f"unknown method {method!r}; choose one of {', '.join(METHOD_NAMES)}")
    if method == JOINT:
        joint_space(problem, options)
    check_solve_options(options)
    if method != JOINT:
        check_method_options(method, options.extra)


def load(problem: Problem) -> LoadedProblem:
    """The cost graph of ``problem`` (``graph``, else read from ``graph_path``; an ONNX model
    with its dims, work model and the cluster's roofline) and its cluster: ``cluster`` if
    given, else what the graph file states, else the default preset; ``devices`` and
    ``memory`` applied."""
    g = problem.graph if problem.graph is not None else _read_graph(problem)
    if isinstance(problem.cluster, Cluster):
        cluster = problem.cluster.with_devices(problem.devices)
    else:
        cluster = resolve_cluster(g, problem.cluster, problem.devices)
    return LoadedProblem(g, cluster.with_memory(problem.memory))


def _read_graph(problem: Problem) -> Graph:
    if problem.graph_path is None:
        raise MtppError("a problem needs a graph file (graph_path) or a loaded graph (graph)")
    if Path(problem.graph_path).suffix.lower() != ".onnx":
        return load_graph(problem.graph_path)
    return load_graph(
        problem.graph_path,
        dims=dict(problem.dims),
        work=problem.work,
        cluster=problem.cluster,
        devices=problem.devices,
    )


def joint_space(problem: Problem, options: SolveOptions) -> str:
    """The search space of a joint request (``options.extra["space"]``, default joint), after
    refusing what joint cannot take: a cost graph instead of the ONNX model, any other option,
    an unknown space, ``--optimal-perf``, ``--sharding``, a work model other than roofline."""
    path = problem.graph_path
    if path is None or Path(path).suffix.lower() != ".onnx":
        path = _graph_name(problem) if path is None else path
        raise MtppError(
            f"{path}: --method joint needs the ONNX model (a cost graph has no operators "
            "to shard); pass the .onnx file"
        )
    extra = dict(options.extra)
    space = extra.pop("space", "joint")
    other = [key for key in extra if key not in JOINT_REFUSED_FLAGS]
    if other:
        raise MtppError(f"--set {other[0]}: --method joint takes only --set space=...")
    if space not in SPACES:
        raise MtppError(f"--set space={str(space)[:40]}: use one of {', '.join(SPACES)}")
    for key, flag in JOINT_REFUSED_FLAGS.items():
        if key in extra:
            raise MtppError(f"{flag} does not apply to --method joint")
    if problem.work != "roofline":
        raise MtppError("--work does not apply to --method joint")
    return space


def _graph_name(problem: Problem) -> str:
    """How a problem without a graph file is named in a refusal."""
    return "(no graph file)" if problem.graph is None else f"graph {problem.graph.name!r}"


def _solve_joint(problem: Problem, options: SolveOptions) -> Result:
    """The joint plan of the ONNX model ``problem.graph_path`` (checked by
    :func:`check_request`)."""
    if isinstance(problem.cluster, Cluster):
        cluster = problem.cluster.with_devices(problem.devices)
    else:
        cluster = load_cluster(problem.cluster, problem.devices)
    return plan_joint(
        problem.graph_path,
        cluster,
        memory=problem.memory,
        time_limit=options.time_limit,
        dims=dict(problem.dims),
        space=joint_space(problem, options),
        progress=options.watcher(),
        workers=options.workers,
        gap=options.gap,
    )
