"""Plan files as every command reads them: ``GRAPH PLAN [--cluster]``, whatever PLAN is called.

The kind of a plan is read from its content, never from its file name: a JSON object with
``"format": "mtpp-plan"`` is a pipeline plan, one with ``"format": "mtpp-joint-plan"`` a joint
plan, and a list of ``{node, device, stage}`` (YAML or JSON, optionally under ``sharding:``) a
manual sharding. A ``--cluster`` given beside a plan that records its cluster must be that
cluster by content (devices, groups, links, memory, compute; the name may differ): it is
accepted when it agrees and refused in one line naming both clusters when it does not.

:func:`load_plan` is the one loader of ``mtpp evaluate``, ``simulate`` and ``export``: it
builds, by the kind the file holds, the loaded plan that :mod:`solver.backends.dispatch`
takes (a manual sharding is a pipeline plan; a pipeline plan with a ``"training"`` section a
training plan). :func:`refuse_for_kind` refuses, before anything is loaded, the options the
file's kind does not take.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solver.backends.dispatch import JointPlanFiles, LoadedPlan, PipelinePlan
from solver.cli.common import load_graph_and_cluster, memory_arg, parse_dims
from solver.core.cluster import Cluster, cluster_from_dict, load_cluster
from solver.core.errors import MtppError
from solver.core.files import parse_json, read_text, read_yaml, shown
from solver.core.graph import Graph
from solver.core.result import FEASIBLE, OPTIMAL
from solver.core.units import format_bytes, format_rate, format_time
from solver.frontends import is_onnx_file
from solver.frontends.sharding_points import parse_sharding
from solver.joint.plan import JOINT_FORMAT, JointPlan, joint_plan_from_data
from solver.joint.plan_check import check_joint_plan
from solver.joint.stages import check_stages
from solver.pipeline.heuristics.manual import manual_assignment
from solver.pipeline.plan import (
    PLAN_FORMAT,
    plan_assignment_from_data,
    read_plan_placement,
    read_plan_training,
)
from solver.spmd.model import ShardModel, load_model

PIPELINE, JOINT, MANUAL = "pipeline plan", "joint plan", "manual sharding"
EXPECTED = (
    f'expected a plan: a JSON with "format": "{PLAN_FORMAT}" or "{JOINT_FORMAT}" (mtpp solve '
    "--out writes one) or a manual-sharding YAML (a list of {node, device, stage})"
)


@dataclass(frozen=True)
class PlanFile:
    """A plan file read once: its path, its kind (from the content) and its parsed content."""

    path: str
    kind: str  # PIPELINE, JOINT or MANUAL
    data: object


def read_plan_file(path: str) -> PlanFile:
    """Read ``path`` and tell its kind by content; anything else is refused in one line
    naming what is expected."""
    text = read_text(path, "plan file")
    try:
        data = parse_json(text, path)
    except MtppError as json_error:
        looks_json = Path(path).suffix.lower() == ".json" or text.lstrip()[:1] in ("{", "[")
        try:
            data = read_yaml(path, "plan file")
        except MtppError:
            if looks_json:
                raise json_error from None
            raise
        if looks_json and not _is_sharding(data):
            raise json_error from None
    return PlanFile(str(path), plan_kind(data, str(path)), data)


def _is_sharding(data: object) -> bool:
    """A list (of sharding points), or a mapping holding one under ``sharding:``; the points
    themselves are checked by :func:`solver.frontends.sharding_points.parse_sharding`."""
    if isinstance(data, dict) and "format" not in data and "sharding" in data:
        data = data["sharding"]
    return isinstance(data, list)


def plan_kind(data: object, path: str) -> str:
    """PIPELINE, JOINT or MANUAL from the parsed content of a plan file."""
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt == PLAN_FORMAT:
        return PIPELINE
    if fmt == JOINT_FORMAT:
        return JOINT
    if fmt is not None:
        raise MtppError(f"{path}: a {shown(fmt)} file is not a plan; {EXPECTED}")
    if not _is_sharding(data):
        raise MtppError(f"{path}: not a plan; {EXPECTED}")
    return MANUAL


def peek_plan_file(path: str) -> PlanFile | None:
    """The plan ``path`` holds, or None when it is no plan (a graph, a model, no file)."""
    if not Path(path).is_file() or is_onnx_file(path):
        return None
    try:
        return read_plan_file(path)
    except MtppError:
        return None


def command_plan(args: argparse.Namespace, command: str, missing: str | None = None) -> PlanFile:
    """The plan a command was given, read once. PLAN may be any file name; a joint plan may
    also come alone (GRAPH omitted): it names its model, which becomes ``args.graph``. Without
    a plan the refusal is ``missing`` (default: name the PLAN: mtpp COMMAND GRAPH PLAN)."""
    if args.plan is None:
        alone = peek_plan_file(args.graph)
        if alone is None:
            raise MtppError(
                missing or f"name the PLAN: mtpp {command} GRAPH PLAN (see mtpp {command} --help)"
            )
        if alone.kind != JOINT:
            raise MtppError(
                f"{args.graph} is a {alone.kind}, which does not name its graph file; give the "
                f"graph first: mtpp {command} GRAPH {args.graph}"
            )
        args.graph, args.plan = joint_model_path(alone, command), alone.path
        return alone
    plan = read_plan_file(args.plan)
    if plan.kind == JOINT and not is_onnx_file(args.graph):
        raise MtppError(f"{args.graph}: a joint plan needs the ONNX model (.onnx) it was made for")
    return plan


def joint_model_path(plan: PlanFile, command: str) -> str:
    """The model a joint plan names: a relative path is looked up from the current folder,
    then from the plan's folder."""
    model = plan.data.get("model") if isinstance(plan.data.get("model"), dict) else {}
    path = model.get("path")
    if not isinstance(path, str) or not path:
        raise MtppError(
            f"{plan.path}: the joint plan names no model file; give it: "
            f"mtpp {command} MODEL.onnx {plan.path}"
        )
    found = next((p for p in (Path(path), Path(plan.path).parent / path) if p.is_file()), None)
    if found is None:
        raise MtppError(
            f"{plan.path}: its model {path} does not exist; give it: "
            f"mtpp {command} MODEL.onnx {plan.path}"
        )
    return str(found)


# ---------------------------------------------------------------------- clusters
def recorded_cluster(plan: PlanFile) -> Cluster | None:
    """The cluster a plan records (None for a manual sharding or a plan without one)."""
    raw = plan.data.get("cluster") if isinstance(plan.data, dict) else None
    if raw is None and plan.kind != JOINT:
        return None
    return cluster_from_dict(raw, f"cluster recorded in {plan.path}")


def cluster_difference(given: Cluster, recorded: Cluster) -> str | None:
    """The first quantity in which two clusters differ, in words (None when they agree by
    content: devices, groups, links, memory and compute; names and descriptions aside)."""
    a, b = given.to_dict(), recorded.to_dict()
    for key in [*a, *(k for k in b if k not in a)]:
        if key in ("name", "description") or a.get(key) == b.get(key):
            continue
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):  # the topology: name the part
            part = next(k for k in [*x, *y] if x.get(k) != y.get(k))
            key, x, y = f"{key} {part}", x.get(part), y.get(part)
        elif key == "topology":
            x, y = ("groups and links" if v else "none" for v in (x, y))
        hint = " (--memory sets it)" if key == "capacity" else ""
        return f"{key}: {_quantity(key, x)} given, {_quantity(key, y)} in the plan{hint}"
    return None


def _quantity(key: str, value: object) -> str:
    """A cluster value in its unit (``compute`` in FLOPS, ``int8_compute`` in OPS, memories
    in bytes, ...)."""
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or key == "devices":
        return shown(value)
    if key == "compute":
        return format_rate(value, "FLOPS")
    if key == "int8_compute":
        return format_rate(value, "OPS")
    if key.endswith("bandwidth"):
        return format_rate(value, "B/s")
    if key.endswith("latency"):
        return format_time(value)
    return format_bytes(value)  # fast_memory, capacity


def check_cluster_agrees(given: Cluster, recorded: Cluster, args, plan: PlanFile) -> None:
    """Refuse, in one line naming both clusters, a cluster given on the command line that is
    not the one the plan was made for."""
    diff = cluster_difference(given, recorded)
    if diff is None:
        return
    options = " ".join(
        f"{flag} {value}"
        for flag, value in (("--cluster", args.cluster), ("--devices", args.devices))
        if value is not None
    )
    raise MtppError(
        f"{plan.path}: made for cluster {recorded.name!r} ({recorded.devices} devices), but "
        f"{options} gives cluster {given.name!r} ({given.devices} devices), which differs in "
        f"{diff}; drop {options.split()[0]} to use the plan's cluster, or solve again for "
        "this one"
    )


# ---------------------------------------------------------------------- pipeline plans
@dataclass
class PipelineInputs:
    """What a command needs to price a pipeline plan (or a manual sharding) on its graph."""

    graph: Graph
    cluster: Cluster  # --cluster, else the plan's recorded one, else the graph's; with
    # --devices and --memory applied
    recorded: Cluster | None  # the cluster the plan file records, if any
    assignment: np.ndarray  # block of every node
    data: dict  # the plan file's content ({"method": "manual", "stages"} for a sharding)
    placement: np.ndarray | None  # device of every block; None: block b on device b


def load_pipeline_plan(args: argparse.Namespace, plan: PlanFile) -> PipelineInputs:
    """The graph, the cluster and the plan's blocks. A ``--cluster`` given beside a plan that
    records one must agree with it; without it the recorded cluster is used (for an ONNX
    model also for its roofline times, as mtpp solve priced them)."""
    recorded = recorded_cluster(plan)
    known = recorded
    if recorded is not None and args.cluster is not None:
        known = load_cluster(args.cluster, args.devices)
        check_cluster_agrees(known.with_memory(memory_arg(args)), recorded, args, plan)
    g, cluster = load_graph_and_cluster(args, known)
    if plan.kind == MANUAL:
        a, data = manual_plan_assignment(g, plan)
    else:
        a, data = plan_assignment_from_data(g, plan.data, plan.path)
    if int(a.max()) + 1 > cluster.devices:
        raise MtppError(
            f"{plan.path}: the plan uses block {int(a.max())} but the cluster has "
            f"{cluster.devices} devices; pass --devices {int(a.max()) + 1}"
        )
    placement = read_plan_placement(data, plan.path, cluster)
    return PipelineInputs(g, cluster, recorded, a, data, placement)


def manual_plan_assignment(g: Graph, plan: PlanFile) -> tuple[np.ndarray, dict]:
    """The blocks a manual sharding gives, and a plan-like record of it (its stages)."""
    try:
        a, stages = manual_assignment(g, parse_sharding(plan.data, plan.path))
    except MtppError as e:  # an unknown node: name the file that holds it
        text = str(e)
        raise MtppError(text if text.startswith(plan.path) else f"{plan.path}: {text}") from None
    return a, {"method": "manual", "stages": stages}


# ---------------------------------------------------------------------- joint plans
def refuse_pipeline_options(args: argparse.Namespace, names: dict[str, object]) -> None:
    """Refuse options that have no meaning for a joint plan (given a non-default value)."""
    for option, default in names.items():
        value = getattr(args, option.lstrip("-").replace("-", "_"), default)
        if value != default:
            raise MtppError(f"{option} does not apply to a joint plan; drop it")


@dataclass
class JointInputs:
    """A joint plan checked against its model, and the model as the sharding package reads
    it (what the joint simulator and exporter take)."""

    plan: JointPlan
    model: ShardModel
    claims_apply: bool = True  # False: --memory raised the limit, the file's bound was dropped


def load_joint(args: argparse.Namespace, plan_file: PlanFile) -> JointInputs:
    """The joint plan read and checked against its model (one line for every mismatch; a
    training plan priced by the training cost function), a ``--cluster``/``--devices`` given
    checked against the plan's cluster, ``--memory`` as its memory limit when given; and the
    model as the sharding package reads it."""
    plan = joint_plan_from_data(plan_file.data, plan_file.path)  # the file is read once
    if args.cluster is not None or args.devices is not None:
        given = (
            plan.cluster.with_devices(args.devices)
            if args.cluster is None
            else load_cluster(args.cluster, args.devices)
        )
        check_cluster_agrees(given, plan.cluster, args, plan_file)
    sm = load_model(args.graph, parse_dims(args))
    check_stages(plan, sm)  # names the operator or device at fault
    memory = memory_arg(args)
    raised = memory is not None and limit_raised(plan, memory)
    if raised:
        drop_space_claims(plan, memory)
    if memory is not None:
        plan.memory_limit = memory
    check_joint_plan(plan, sm, plan_file.path)
    return JointInputs(plan, sm, claims_apply=not raised)


def limit_raised(plan: JointPlan, memory: float) -> bool:
    """Whether ``memory`` per device is above the limit the plan was solved under (its
    ``memory_limit``, else the least capacity of the cluster's devices): then more plans fit
    than the file's bound and status spoke of."""
    if plan.memory_limit is not None:
        return memory > plan.memory_limit
    capacity = plan.cluster.device_arrays()[1]
    return bool(memory > capacity.min())


def drop_space_claims(plan: JointPlan, memory: float) -> None:
    """The file's bound and status cover a smaller space than ``memory`` allows: the plan keeps
    only the universal bound (valid for every joint plan, with or without memory), and an
    OPTIMAL claim becomes FEASIBLE."""
    old = "no limit" if plan.memory_limit is None else format_bytes(plan.memory_limit)
    plan.lower_bound = plan.universal_bound
    plan.bound_space = (
        f"every joint plan (the universal bound: the plan file's bound covered its space under "
        f"the memory limit it was solved with, {old} per device, below --memory "
        f"{format_bytes(memory)})"
    )
    if plan.status == OPTIMAL:
        plan.status = FEASIBLE


# ---------------------------------------------------------------------- the one loader
# options that only a pipeline graph's cost model reads (a joint plan prices its own model)
NOT_FOR_JOINT = {"--work": "roofline"}


def refuse_for_kind(args: argparse.Namespace, plan: PlanFile, joint_refuses: dict) -> None:
    """Refuse, before loading, the options (name -> default) a joint plan does not take."""
    if plan.kind == JOINT:
        refuse_pipeline_options(args, joint_refuses)


def load_plan(args: argparse.Namespace, plan: PlanFile) -> LoadedPlan:
    """The plan of a command's plan file, as :mod:`solver.backends.dispatch` takes it, by the
    kind read from the file's content."""
    if plan.kind == JOINT:
        claimed = plan.data.get("status")  # before --memory may drop the file's claims
        joint = load_joint(args, plan)
        return JointPlanFiles(
            joint.plan, joint.model, args.graph, plan.path, claimed, joint.claims_apply
        )
    training = read_plan_training(plan.data, plan.path) if plan.kind == PIPELINE else None
    if training is not None:  # the ONNX graph with its backward costs (frontends.onnx)
        args.training_costs = True
    p = load_pipeline_plan(args, plan)
    return PipelinePlan(
        p.graph,
        p.cluster,
        p.assignment,
        p.placement,
        model_path=args.graph if is_onnx_file(args.graph) else None,
        stage=p.data.get("stages"),  # the stages a manual-sharding YAML states
        data=p.data,
        claims_apply=p.recorded is not None and cluster_difference(p.recorded, p.cluster) is None,
        training=training,
        plan_path=plan.path,
    )
