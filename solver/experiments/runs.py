"""One run of an experiment, where the files are (a worker of either backend): build a
generated graph once, solve it with a pipeline method, a sharding method or a joint space
(each through :func:`solver.api.solve`), and return the run's record with its plan under
``_plan`` for the driver to write. Nothing here writes into the results folder except the
generated models under ``out/models``.

A sharding run (an SPMD plan) whose plan is over the memory limit is an ERROR record with the
memory it needs. A joint run records its objective, bound and the space the bound covers, the
stages, and the period the joint simulator measures for the plan.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from solver import api
from solver.backends.simulate_joint import AGREE, simulate_joint
from solver.core.cluster import Cluster, cluster_from_dict, load_cluster
from solver.core.errors import MtppError
from solver.core.files import write_json_atomic
from solver.core.graph import Graph
from solver.core.result import ERROR, INFEASIBLE
from solver.core.training import TrainingSpec
from solver.experiments.config import GraphSpec, digest, graph_identity, graph_source
from solver.frontends import is_onnx_file, load_graph, resolve_cluster
from solver.frontends.native import to_dict
from solver.frontends.onnx.modelgen import BUILDERS, save
from solver.frontends.workloads import layered_dag
from solver.joint.segment import tensor_bytes
from solver.pipeline.options import SolveOptions
from solver.pipeline.training.splits import practitioner_splits
from solver.spmd.model import ShardModel, load_model


def materialise(gs: GraphSpec, base: Path, bench: Path, out: Path) -> Path:
    """The file of a graph spec, building generated models into ``out/models`` once."""
    label, path = graph_source(gs, base, bench)
    if path is not None:
        return path
    stem = label.replace("/", "_").replace("#", "_") + "-" + digest(graph_identity(gs, None), 8)
    target = out / "models" / (stem + (".onnx" if gs.generate else ".json"))
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name("." + target.name + f".{os.getpid()}")
    try:
        if gs.generate:
            model, _ = BUILDERS[gs.generate](**gs.params)
            save(model, tmp)
        else:
            write_json_atomic(tmp, to_dict(layered_dag(int(gs.layered), **gs.params)))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def failed(desc: dict, reason: str, wall: float | None = None) -> dict:
    """The record of a run that failed (an exception, a time-out, a lost worker)."""
    rec = dict(desc, status=ERROR, error=reason, objective=None, lower_bound=None)
    rec["wall_seconds"] = wall
    return rec


@dataclass(frozen=True)
class RunInput:
    """What one run solves: its description, graph spec, graph file, cluster and workers.
    ``cluster`` is an inline mapping, "file" (what the graph file states), a preset name or
    a cluster YAML path."""

    desc: dict
    gs: GraphSpec
    graph: str
    cluster: str | dict
    workers: int


def solve_run(desc: dict, gs_data: dict, graph: str, cluster, workers: int) -> dict:
    """Load the graph file, solve, evaluate: the run's record, with its plan under ``_plan``
    for the driver to write. ``cluster`` is an inline mapping, "file" (what the graph file
    states), a preset name or a cluster YAML path. It runs where the files are (a worker of
    either backend) and writes nothing.

    One path for every kind of run: the run's request (:data:`REQUESTS`, by the ``kind`` of
    its description: pipeline, shard, joint or training) is solved by
    :func:`solver.api.solve`, and the record is the run's description, what was known before
    the solve (graph size, cluster), the result's status, objective and bound (the
    :class:`solver.core.result.Result` contract) and the fields of its kind
    (:data:`RESULT_FIELDS`). A run that fails is an ERROR record with the reason (and the
    fields filled before)."""
    run = RunInput(desc, GraphSpec.model_validate(gs_data), graph, cluster, workers)
    kind = desc.get("kind") or "pipeline"
    t0 = time.perf_counter()
    rec = dict(desc)
    try:
        request = REQUESTS[kind](run)
        rec.update(request.facts)
        result = api.solve(request.problem, request.method, request.options, API_KIND[kind])
        if result is None:  # proven: no valid plan
            rec.update(status=INFEASIBLE, objective=None, lower_bound=None)
        else:
            rec.update(status=result.status, objective=result.objective)
            rec["lower_bound"] = result.lower_bound
            RESULT_FIELDS[kind](run, request, result, rec)
    except MtppError as e:
        rec.update(status=ERROR, error=str(e), objective=None, lower_bound=None)
    rec["wall_seconds"] = time.perf_counter() - t0
    return rec


@dataclass
class Request:
    """What :func:`solver.api.solve` gets for one run, and what is known before it runs."""

    problem: api.Problem
    method: str  # the method's name in solver.api (a joint run's method is "joint")
    options: SolveOptions
    facts: dict  # k, cluster_name; nodes (pipeline, joint); weight_bytes (joint)
    model: ShardModel | None = None  # the ONNX model as the SPMD planner reads it (shard, joint)


def _options(run: RunInput, extra: dict) -> SolveOptions:
    desc = run.desc
    return SolveOptions(
        time_limit=desc["time_limit"], workers=run.workers, seed=desc["seed"], extra=extra
    )


def _model_cluster(run: RunInput, devices: int | None) -> Cluster:
    """The cluster of an ONNX model's run: the inline one or the named one (an ONNX model
    states none, so "file" is the default preset), with ``devices``."""
    if isinstance(run.cluster, dict):
        return cluster_from_dict(run.cluster, "inline cluster").with_devices(devices)
    return load_cluster(None if run.cluster == "file" else run.cluster, devices)


def pipeline_request(run: RunInput) -> Request:
    """A pipeline partitioning run: the cost graph (an ONNX model with the run's dims and work
    model) on the run's cluster."""
    g, cl = _graph_and_cluster(run)
    facts = {"nodes": g.n, "k": cl.devices, "cluster_name": cl.name}
    problem = api.Problem(graph=g, cluster=cl)
    return Request(
        problem, run.desc["method_name"], _options(run, dict(run.desc["options"])), facts
    )


def _graph_and_cluster(run: RunInput, training_costs: bool = False) -> tuple[Graph, Cluster]:
    """The run's cost graph (an ONNX model with its dims and work model, and with
    ``training_costs`` its operators' backward work and stash) and its cluster."""
    desc, cluster = run.desc, run.cluster
    path = Path(run.graph)
    ref = cluster if isinstance(cluster, str) and cluster != "file" else None
    kw = {}
    if is_onnx_file(path):
        kw = {"dims": run.gs.dims, "work": run.gs.work, "cluster": ref}
        kw["training_costs"] = training_costs
    g = load_graph(path, **kw)
    if isinstance(cluster, dict):
        cl = cluster_from_dict(cluster, "inline cluster").with_devices(desc["devices"])
    else:  # "file": what the graph file states, else the default preset
        cl = resolve_cluster(g, ref, desc["devices"])
    return g, cl


def training_request(run: RunInput) -> Request:
    """A training run (docs/training.md): the pipeline method under the run's schedule on the
    cost graph with its backward costs, the cluster's capacity replaced by the run's memory
    limit when it has one. The practitioners' splits are priced on the same problem first
    (``splits`` of the record: each one's T, None when it breaks the memory, and its layers
    per stage; None when the graph has no layers to split)."""
    desc = run.desc
    spec = TrainingSpec(
        schedule=desc["schedule"],
        microbatches=desc["microbatches"],
        virtual_stages=desc["virtual_stages"],
        optimizer_state=desc["optimizer_state"],
    )
    g, cl = _graph_and_cluster(run, training_costs=True)
    if desc.get("memory_bytes") is not None:
        cl = cl.with_memory(desc["memory_bytes"])
    facts = {"nodes": g.n, "k": cl.devices, "cluster_name": cl.name}
    facts["splits"] = _split_costs(g, cl, spec)
    options = _options(run, dict(desc["options"]))
    options = replace(options, training=spec)
    return Request(api.Problem(graph=g, cluster=cl), desc["method_name"], options, facts)


def _split_costs(g: Graph, cluster: Cluster, spec: TrainingSpec) -> dict | None:
    """Each practitioners' split of ``g`` priced under ``spec`` (see training_request)."""
    try:
        splits = practitioner_splits(g, cluster, cluster.devices, spec)
    except MtppError:  # no layers: no module numbers and too many nodes for separators
        return None
    return {
        s.name: {
            "iteration_time": s.cost.iteration_time if s.cost.valid else None,
            "layers_per_stage": list(s.layers_per_stage),
        }
        for s in splits
    }


def shard_request(run: RunInput) -> Request:
    """A sharding run: the ONNX model on the run's mesh within its memory limit, with the
    method's strategy file fixed. A plan over the memory limit, or none within it, raises
    (an ERROR record with the reason)."""
    desc = run.desc
    cl = _model_cluster(run, desc["devices"])
    facts = {"k": cl.devices, "cluster_name": cl.name}  # the operators: once it is loaded
    problem = _model_problem(run, None, cl)  # the planner reads the model (and names its file)
    extra = {"mesh": tuple(desc["mesh_shape"]), "config": desc["options"].get("config")}
    return Request(problem, desc["method_name"], _options(run, extra), facts)


def joint_request(run: RunInput) -> Request:
    """A joint run in the run's space (all the cluster's devices). A space where no plan fits
    the memory limit raises (an ERROR record with the reason)."""
    cl = _model_cluster(run, None)
    sm = load_model(run.graph, run.gs.dims)
    weights = sum(tensor_bytes(sm, t) for t in sm.consts)
    facts = {"nodes": len(sm.ops), "k": cl.devices, "cluster_name": cl.name}
    facts["weight_bytes"] = weights
    problem = _model_problem(run, sm, cl)
    options = _options(run, {"space": run.desc["space"]})
    return Request(problem, api.JOINT, options, facts, sm)


def _model_problem(run: RunInput, sm: ShardModel | None, cl: Cluster) -> api.Problem:
    return api.Problem(
        graph_path=run.graph,
        model=sm,
        cluster=cl,
        memory=run.desc["memory_bytes"],
        dims=dict(run.gs.dims),
    )


def pipeline_fields(run: RunInput, request: Request, plan, rec: dict) -> None:
    """A pipeline plan: its file's JSON under ``_plan``."""
    rec["_plan"] = plan.to_dict()


def shard_fields(run: RunInput, request: Request, res, rec: dict) -> None:
    """A sharding plan: the model's operators, the memory per device, the strategies under
    ``_plan``."""
    rec["nodes"] = len(res.planner.sm.ops)
    rec["memory_per_device"] = res.program.memory_per_device
    rec["_plan"] = {
        "kind": "shard",
        "mesh": run.desc["mesh_shape"],
        "strategies": {n: [list(d) for d in s] for n, s in res.strategies.items()},
    }


def joint_fields(run: RunInput, request: Request, plan, rec: dict) -> None:
    """A joint plan: its gap, the space its bound covers, the universal bound, latency and
    stages, its JSON under ``_plan``, and the period the joint simulator measures."""
    obj = plan.objective
    rec.update(
        gap=plan.gap,
        bound_space=plan.bound_space,
        universal_bound=plan.universal_bound,
        latency=plan.latency,
        solve_seconds=plan.wall_seconds,
        stages=[
            {"devices": list(s.devices), "mesh": "x".join(map(str, s.mesh.shape))}
            for s in plan.stages
        ],
    )
    rec["_plan"] = plan.to_dict()
    requests = run.desc.get("requests", 20)
    sim = simulate_joint(plan, request.model, requests=requests, keep_timeline=0)
    period = sim.sim.period
    rec.update(sim_period=period, sim_valid=sim.valid)
    rec["sim_disagrees"] = bool(abs(period - obj) > AGREE * max(abs(obj), 1e-300))


# by the "kind" of a run's description (pipeline runs have none): its request, the kind of
# plan solver.api.solve makes, and the result's own fields
REQUESTS = {
    "pipeline": pipeline_request,
    "shard": shard_request,
    "joint": joint_request,
    "training": training_request,
}
API_KIND = {
    "pipeline": api.PIPELINE,
    "shard": api.SPMD,
    "joint": api.JOINT,
    "training": api.PIPELINE,
}
RESULT_FIELDS = {
    "pipeline": pipeline_fields,
    "shard": shard_fields,
    "joint": joint_fields,
    "training": pipeline_fields,
}
