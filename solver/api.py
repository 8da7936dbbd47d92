"""One call for every planner: ``solve(problem, method, options, kind=None) -> Result``.

A :class:`Problem` says what to plan: a graph file (or an already loaded cost graph or ONNX
model), the cluster, and the settings of an ONNX model. The plan's ``kind`` names the planner
(the three kinds of :mod:`solver.core.result`), and ``method`` one of that kind's methods
(:func:`kind_methods`):

- ``"pipeline"``: a method of :data:`solver.pipeline.registry.METHODS` on the cost graph
  (blocks of the graph on devices): a :class:`~solver.pipeline.plan.Plan`;
- ``"spmd"``: a method of :data:`solver.spmd.plan.METHODS` (propagate, dp, megatron, cpsat) on
  the ONNX model (one strategy per operator on one mesh): a
  :class:`~solver.spmd.plan.ShardResult`. ``options.extra`` may hold ``mesh`` (a tuple or
  "2x4"; default one axis of every device) and ``config`` (a strategy file or a dict of node
  name -> strategy, fixed in every method);
- ``"joint"``: the method ``joint`` (:func:`solver.joint.plan_joint` on the ONNX model:
  pipeline stages on sub-meshes, sharded inside): a :class:`~solver.joint.plan.JointPlan`;
  ``options.extra`` may hold ``space``.

``kind`` None means pipeline, or joint for the method ``joint`` (pipeline and spmd both have a
``cpsat``, so an SPMD request names its kind). Every result has ``kind`` and the fields of
:class:`solver.core.result.Result` (status, objective, lower bound, gap), so a caller reads
any of them the same way. A request no planner can honour raises
:class:`~solver.core.errors.MtppError` with one line naming what to fix, worded with the command
line's flags (``--set``, ``--work``, ...); :func:`check_request` makes these checks alone,
before anything is loaded.

The SPMD and joint planners are imported when a request of their kind comes
(:class:`OnFirstUse`), not with this module: a pipeline solve, the common case, uses neither,
and importing them cost its start-up about 40 ms (docs/architecture.md, "Start-up").

>>> from solver.core.cluster import Cluster
>>> from solver.frontends.workloads import layered_dag
>>> plan = solve(Problem(graph=layered_dag(12), cluster=Cluster("c", 2)), "time")
>>> plan.kind, plan.k
('pipeline', 2)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from solver.core.cluster import Cluster, load_cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.options import check_spmd_options
from solver.core.progress import NULL_PROGRESS
from solver.core.result import Result
from solver.frontends import is_onnx_file, load_graph, resolve_cluster
from solver.pipeline import registry
from solver.pipeline.options import SolveOptions, check_method_options, check_solve_options

if TYPE_CHECKING:  # the SPMD planner itself is imported on first use (OnFirstUse)
    from solver.spmd.model import ShardModel

PIPELINE, SPMD, JOINT = "pipeline", "spmd", "joint"
KINDS = (PIPELINE, SPMD, JOINT)
METHOD_NAMES = (*registry.METHODS, JOINT)
SPMD_OPTIONS = ("mesh", "config")  # options.extra keys an SPMD method takes
# option keys the command line fills from its own flags, refused by joint under the flag's name
JOINT_REFUSED_FLAGS = {"optimal_perf": "--optimal-perf", "sharding": "--sharding"}


@dataclass(frozen=True)
class OnFirstUse:
    """A name of the SPMD or the joint planner, its module imported the first time the name is
    used (:meth:`get`), so that a pipeline solve does not load either planner (module
    docstring)."""

    module: str
    name: str

    def get(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)


SPMD_METHODS = OnFirstUse("solver.spmd.plan", "METHODS")
SOLVE_SHARDING = OnFirstUse("solver.spmd.solve", "solve_sharding")
JOINT_SPACES = OnFirstUse("solver.joint.submesh", "SPACES")
PLAN_JOINT = OnFirstUse("solver.joint.planner", "plan_joint")
PLAN_JOINT_TRAINING = OnFirstUse("solver.joint.training", "plan_joint_training")
CHECK_JOINT_TRAINING = OnFirstUse("solver.joint.training", "check_training_spec")


def kind_methods(kind: str) -> tuple[str, ...]:
    """The methods of ``kind``: the pipeline registry's, the SPMD planner's (its module is
    imported now) or joint's one."""
    if kind == SPMD:
        return tuple(SPMD_METHODS.get())
    return tuple(registry.METHODS) if kind == PIPELINE else (JOINT,)


@dataclass(frozen=True)
class Problem:
    """What to plan.

    ``graph_path``: an ONNX model, an mtpp graph JSON or a dnn-partitioning JSON (spmd, joint:
    the ONNX model); ``graph``: an already loaded cost graph (pipeline methods; ``graph_path``
    is then not read); ``model``: the ONNX model of ``graph_path`` already loaded as the SPMD
    planner reads it (spmd, joint; ``graph_path`` still names it).
    ``cluster``: a :class:`Cluster`, a preset name or a cluster YAML file (None:
    what the graph file states, else the default preset); ``devices`` and ``memory`` (bytes per
    device) override it. ``dims`` fixes symbolic dimensions of an ONNX model; ``work`` is its
    work model (roofline, flops or measured; joint: roofline only).
    """

    graph_path: str | Path | None = None
    graph: Graph | None = None
    model: ShardModel | None = None
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


def solve(
    problem: Problem, method: str, options: SolveOptions | None = None, kind: str | None = None
) -> Result | None:
    """Plan ``problem`` with ``method`` of ``kind`` (module docstring): a pipeline
    :class:`~solver.pipeline.plan.Plan` (None when it is proven that no valid plan exists), an
    SPMD :class:`~solver.spmd.plan.ShardResult` or a :class:`~solver.joint.plan.JointPlan` (these
    two raise when no plan fits). ``options``: the time limit, workers, seed, gap, the method's
    own options (``extra``) and where progress goes (``progress``, ``reporter``)."""
    options = options or SolveOptions()
    check_request(problem, method, options, kind)
    return PLANNERS[kind_of(method, kind)](problem, method, options)


def kind_of(method: str, kind: str | None) -> str:
    """The kind a request names: ``kind``, else joint for the method ``joint``, else pipeline."""
    if kind is None:
        return JOINT if method == JOINT else PIPELINE
    if kind not in KINDS:
        raise MtppError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    return kind


def check_request(
    problem: Problem, method: str, options: SolveOptions, kind: str | None = None
) -> None:
    """Refuse, before anything is loaded, a method, an option or a problem setting that
    ``method`` cannot honour (one line naming what to fix)."""
    named = kind is not None
    kind = kind_of(method, kind)
    if kind == SPMD:
        _check_spmd(problem, method, options)
        return
    if method not in kind_methods(kind):
        names = kind_methods(kind) if named else METHOD_NAMES
        raise MtppError(f"unknown method {method!r}; choose one of {', '.join(names)}")
    if method == JOINT:
        joint_space(problem, options)
        if options.training is not None:
            CHECK_JOINT_TRAINING.get()(options.training)
    check_solve_options(options)
    if method != JOINT:
        check_method_options(method, options.extra)


def _check_spmd(problem: Problem, method: str, options: SolveOptions) -> None:
    """An SPMD request: one of its methods, the ONNX model, only mesh and config options."""
    if method not in kind_methods(SPMD):
        names = ", ".join(kind_methods(SPMD))
        raise MtppError(f"unknown SPMD method {method!r}; choose one of {names}")
    _onnx_path(problem, "an SPMD plan")
    other = [key for key in options.extra if key not in SPMD_OPTIONS]
    if other:
        raise MtppError(f"{other[0]}: an SPMD method takes only {' and '.join(SPMD_OPTIONS)}")
    check_spmd_options(options.time_limit, options.workers, options.seed)


def load(problem: Problem, training_costs: bool = False) -> LoadedProblem:
    """The cost graph of ``problem`` (``graph``, else read from ``graph_path``; an ONNX model
    with its dims, work model and the cluster's roofline, and with ``training_costs`` every
    operator's backward work and stash, as ``mtpp solve --schedule`` reads it) and its
    cluster: ``cluster`` if given, else what the graph file states, else the default preset;
    ``devices`` and ``memory`` applied."""
    g = problem.graph if problem.graph is not None else _read_graph(problem, training_costs)
    if isinstance(problem.cluster, Cluster):
        cluster = problem.cluster.with_devices(problem.devices)
    else:
        cluster = resolve_cluster(g, problem.cluster, problem.devices)
    return LoadedProblem(g, cluster.with_memory(problem.memory))


def _read_graph(problem: Problem, training_costs: bool) -> Graph:
    if problem.graph_path is None:
        raise MtppError("a problem needs a graph file (graph_path) or a loaded graph (graph)")
    if not is_onnx_file(problem.graph_path):
        return load_graph(problem.graph_path)
    return load_graph(
        problem.graph_path,
        dims=dict(problem.dims),
        work=problem.work,
        cluster=problem.cluster,
        devices=problem.devices,
        training_costs=training_costs,
    )


def joint_space(problem: Problem, options: SolveOptions) -> str:
    """The search space of a joint request (``options.extra["space"]``, default joint), after
    refusing what joint cannot take: a cost graph instead of the ONNX model, any other option,
    an unknown space, ``--optimal-perf``, ``--sharding``, a work model other than roofline."""
    _onnx_path(problem, "--method joint")
    extra = dict(options.extra)
    space = extra.pop("space", "joint")
    other = [key for key in extra if key not in JOINT_REFUSED_FLAGS]
    if other:
        raise MtppError(f"--set {other[0]}: --method joint takes only --set space=...")
    spaces = JOINT_SPACES.get()
    if space not in spaces:
        raise MtppError(f"--set space={str(space)[:40]}: use one of {', '.join(spaces)}")
    for key, flag in JOINT_REFUSED_FLAGS.items():
        if key in extra:
            raise MtppError(f"{flag} does not apply to --method joint")
    if problem.work != "roofline":
        raise MtppError("--work does not apply to --method joint")
    return space


def _onnx_path(problem: Problem, what: str) -> None:
    """Refuse a problem without the ONNX model ``what`` shards."""
    path = problem.graph_path
    if path is None or not is_onnx_file(path):
        path = _graph_name(problem) if path is None else path
        raise MtppError(
            f"{path}: {what} needs the ONNX model (a cost graph has no operators "
            "to shard); pass the .onnx file"
        )


def _graph_name(problem: Problem) -> str:
    """How a problem without a graph file is named in a refusal."""
    return "(no graph file)" if problem.graph is None else f"graph {problem.graph.name!r}"


def _solve_pipeline(problem: Problem, method: str, options: SolveOptions) -> Result | None:
    loaded = load(problem, training_costs=options.training is not None)
    return registry.solve(loaded.graph, loaded.cluster, method, options)


def _model_cluster(problem: Problem) -> Cluster:
    """The cluster of an ONNX model's problem (a model states none): ``cluster`` with
    ``devices`` applied, else the default preset."""
    if isinstance(problem.cluster, Cluster):
        return problem.cluster.with_devices(problem.devices)
    return load_cluster(problem.cluster, problem.devices)


def _model(problem: Problem) -> ShardModel | str | Path:
    """The loaded model when the problem holds one, else its file."""
    return problem.model if problem.model is not None else problem.graph_path


def _solve_spmd(problem: Problem, method: str, options: SolveOptions) -> Result:
    """The SPMD program of the ONNX model (checked by :func:`check_request`)."""
    return SOLVE_SHARDING.get()(
        _model(problem),
        mesh=options.extra.get("mesh"),
        method=method,
        memory=problem.memory,
        config=options.extra.get("config"),
        time_limit=options.time_limit,
        cluster=_model_cluster(problem),
        dims=dict(problem.dims),
        workers=options.workers,
        seed=options.seed,
        progress=None if options.watcher() is NULL_PROGRESS else options.watcher(),
        training=options.training,
    )


def _solve_joint(problem: Problem, method: str, options: SolveOptions) -> Result:
    """The joint plan of the ONNX model ``problem.graph_path`` (checked by
    :func:`check_request`)."""
    if options.training is not None:
        return PLAN_JOINT_TRAINING.get()(
            _model(problem),
            _model_cluster(problem),
            options.training,
            memory=problem.memory,
            time_limit=options.time_limit,
            dims=dict(problem.dims),
            space=joint_space(problem, options),
            progress=options.watcher(),
        )
    return PLAN_JOINT.get()(
        _model(problem),
        _model_cluster(problem),
        memory=problem.memory,
        time_limit=options.time_limit,
        dims=dict(problem.dims),
        space=joint_space(problem, options),
        progress=options.watcher(),
        workers=options.workers,
        gap=options.gap,
    )


# the planner of each kind: (problem, method, options) -> its result
PLANNERS = {PIPELINE: _solve_pipeline, SPMD: _solve_spmd, JOINT: _solve_joint}
