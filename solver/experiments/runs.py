"""One run of an experiment, where the files are (a worker of either backend): build a
generated graph once, solve it with a pipeline method, a sharding method or a joint space, and
return the run's record with its plan under ``_plan`` for the driver to write. Nothing here
writes into the results folder except the generated models under ``out/models``.

A sharding run (:func:`solver.spmd.solve.solve_sharding`) whose plan is over the memory limit
is an ERROR record with the memory it needs. A joint run (:func:`solver.joint.plan_joint`)
records its objective, bound and the space the bound covers, the stages, and the period the
joint simulator measures for the plan.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from solver import api
from solver.backends.simulate_joint import AGREE, simulate_joint
from solver.core.cluster import cluster_from_dict, load_cluster
from solver.core.errors import MtppError
from solver.core.files import write_json_atomic
from solver.core.result import ERROR, INFEASIBLE
from solver.experiments.config import GraphSpec, digest, graph_identity, graph_source
from solver.frontends import load_graph, resolve_cluster
from solver.frontends.native import to_dict
from solver.frontends.onnx.modelgen import BUILDERS, save
from solver.frontends.workloads import layered_dag
from solver.joint import plan_joint
from solver.joint.segment import tensor_bytes
from solver.pipeline.options import SolveOptions
from solver.spmd.model import load_model
from solver.spmd.solve import solve_sharding


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
    either backend) and writes nothing. The record is the run's description with the fields
    of its kind (:data:`RECORD_FIELDS`); a run that fails is an ERROR record with the reason
    (and the fields its kind had filled before)."""
    run = RunInput(desc, GraphSpec.model_validate(gs_data), graph, cluster, workers)
    t0 = time.perf_counter()
    rec = dict(desc)
    try:
        RECORD_FIELDS[desc.get("kind") or "pipeline"](run, rec)
    except MtppError as e:
        rec.update(status=ERROR, error=str(e), objective=None, lower_bound=None)
    rec["wall_seconds"] = time.perf_counter() - t0
    return rec


def pipeline_fields(run: RunInput, rec: dict) -> None:
    """A pipeline partitioning run (:func:`solver.api.solve`): the graph's size, the cluster,
    the plan's status, objective and bound, the plan under ``_plan``."""
    desc, cluster = run.desc, run.cluster
    path = Path(run.graph)
    ref = cluster if isinstance(cluster, str) and cluster != "file" else None
    kw = {}
    if path.suffix == ".onnx":
        kw = {"dims": run.gs.dims, "work": run.gs.work, "cluster": ref}
    g = load_graph(path, **kw)
    if isinstance(cluster, dict):
        cl = cluster_from_dict(cluster, "inline cluster").with_devices(desc["devices"])
    else:  # "file": what the graph file states, else the default preset
        cl = resolve_cluster(g, ref, desc["devices"])
    opts = SolveOptions(
        time_limit=desc["time_limit"],
        workers=run.workers,
        seed=desc["seed"],
        extra=dict(desc["options"]),
    )
    plan = api.solve(api.Problem(graph=g, cluster=cl), desc["method_name"], opts)
    rec.update(nodes=g.n, k=cl.devices, cluster_name=cl.name)
    if plan is None:
        rec.update(status=INFEASIBLE, objective=None, lower_bound=None)
    else:
        rec["_plan"] = plan.to_dict()
        rec.update(status=plan.status, objective=plan.objective, lower_bound=plan.lower_bound)


def shard_fields(run: RunInput, rec: dict) -> None:
    """A sharding run (:func:`solver.spmd.solve.solve_sharding`): the operators, the cluster,
    the status, objective, bound and memory per device, the strategies under ``_plan``. A plan
    over the memory limit, or none within it, raises (an ERROR record with the reason)."""
    desc, cluster = run.desc, run.cluster
    if isinstance(cluster, dict):
        cl = cluster_from_dict(cluster, "inline cluster").with_devices(desc["devices"])
    else:  # "file": an ONNX model states no cluster, so the default preset
        cl = load_cluster(None if cluster == "file" else cluster, desc["devices"])
    res = solve_sharding(
        run.graph,
        mesh=tuple(desc["mesh_shape"]),
        method=desc["method_name"],
        memory=desc["memory_bytes"],
        config=desc["options"].get("config"),
        time_limit=desc["time_limit"],
        cluster=cl,
        dims=run.gs.dims,
        workers=run.workers,
        seed=desc["seed"],
    )
    rec.update(nodes=len(res.planner.sm.ops), k=cl.devices, cluster_name=cl.name)
    rec.update(status=res.status, objective=res.objective, lower_bound=res.lower_bound)
    rec["memory_per_device"] = res.program.memory_per_device
    rec["_plan"] = {
        "kind": "shard",
        "mesh": desc["mesh_shape"],
        "strategies": {n: [list(d) for d in s] for n, s in res.strategies.items()},
    }


def joint_fields(run: RunInput, rec: dict) -> None:
    """A joint run (:func:`solver.joint.plan_joint` in the run's space) and the joint
    simulator's period of its plan: the model's size and weights, the plan's status,
    objective, bounds, latency and stages, the plan's JSON under ``_plan``. A space where no
    plan fits the memory limit raises (an ERROR record with the reason)."""
    desc, cluster = run.desc, run.cluster
    if isinstance(cluster, dict):
        cl = cluster_from_dict(cluster, "inline cluster")
    else:  # "file": an ONNX model states no cluster, so the default preset
        cl = load_cluster(None if cluster == "file" else cluster)
    sm = load_model(run.graph, run.gs.dims)
    weights = sum(tensor_bytes(sm, t) for t in sm.consts)
    rec.update(nodes=len(sm.ops), k=cl.devices, cluster_name=cl.name, weight_bytes=weights)
    plan = plan_joint(
        sm,
        cl,
        memory=desc["memory_bytes"],
        time_limit=desc["time_limit"],
        dims=run.gs.dims,
        space=desc["space"],
        workers=run.workers,
    )
    obj = plan.objective
    rec.update(
        status=plan.status,
        objective=obj,
        lower_bound=plan.lower_bound,
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
    sim = simulate_joint(plan, sm, requests=desc.get("requests", 20), keep_timeline=0)
    period = sim.sim.period
    rec.update(sim_period=period, sim_valid=sim.valid)
    rec["sim_disagrees"] = bool(abs(period - obj) > AGREE * max(abs(obj), 1e-300))


# the fields of each kind of run ("kind" of its description; pipeline runs have none)
RECORD_FIELDS = {"pipeline": pipeline_fields, "shard": shard_fields, "joint": joint_fields}
