"""mtpp report: a plan of any kind as one self-contained HTML page (solver.backends.report_html).

A pipeline plan is read with its graph when MODEL is given (the drawing of the graph and the
simulated timeline need it) and from its file alone otherwise; a joint plan names its model; a
sharded plan (``mtpp shard --out DIR``'s ``plan.json``) needs nothing else. The page is
written through a temporary file and a rename; an existing FILE is replaced only with --force.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from solver.backends.plan_report import (
    GanttRow,
    PipelineView,
    graph_view,
    joint_report,
    pipeline_report,
    spmd_report,
    timeline_gantt,
)
from solver.backends.report_html import Gantt, Report, render_html
from solver.backends.simulate import simulate
from solver.backends.simulate_joint import simulate_joint
from solver.cli.common import console, input_paths, print_json
from solver.cli.plan_files import (
    JOINT,
    MANUAL,
    PIPELINE,
    PipelineInputs,
    PlanFile,
    joint_model_path,
    load_joint,
    load_pipeline_plan,
    read_plan_file,
    recorded_cluster,
    refuse_pipeline_options,
)
from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.files import atomic_file, check_output_file, parse_json, read_text
from solver.core.text import esc
from solver.core.units import format_time
from solver.joint.plan import joint_plan_from_data
from solver.pipeline.plan import read_plan_placement

SHARDED = "sharded plan"  # mtpp shard's plan.json, which the common plan loader does not read
SHARD_FORMAT = "mtpp-shard-plan"
TIMELINE_REQUESTS = 12  # most requests drawn in an inference timeline


def cmd_report(args: argparse.Namespace) -> int:
    """Write the HTML report of PLAN to --html FILE."""
    out = check_report_path(args.html, input_paths(args), args.force)
    plan_file = read_report_plan(args.plan)
    report = build_report(args, plan_file)
    check_output_file(out, input_paths(args), what="HTML report")  # and the model a joint
    # plan named (args.graph now)
    with atomic_file(out, "w", newline="\n") as fh:
        fh.write(render_html(report))
    summary = {
        "html": str(out),
        "kind": report.kind,
        "stages": len(report.stages),
        "operators": len(report.operators),
        "gantt": report.gantt is not None,
        "graph": report.graph is not None,
    }
    if args.json:
        print_json(summary)
    else:
        what = f"{len(report.stages)} stages" if report.stages else f"{len(report.operators)} ops"
        console().print(f"wrote {esc(str(out))}: {esc(report.kind)} plan report, {what}")
    return 0


def check_report_path(path: str, inputs: list[Path], force: bool) -> Path:
    """Refuse a report path that is an input, a folder, in a missing folder, or an existing
    file (unless ``force``)."""
    out = check_output_file(path, inputs, what="HTML report")
    if not out.parent.is_dir():
        raise MtppError(f"{path}: the folder {out.parent} does not exist; create it first")
    if out.exists() and not force:
        raise MtppError(
            f"{path}: file exists; choose a new name for the HTML report, or pass --force to "
            "replace it"
        )
    return out


def read_report_plan(path: str) -> PlanFile:
    """The plan file, by content: a sharded plan here, every other kind by the plan loader."""
    text = read_text(path, "plan file")
    try:
        data = parse_json(text, path)
    except MtppError:
        data = None  # YAML, or not a plan: the plan loader says which
    if isinstance(data, dict) and data.get("format") == SHARD_FORMAT:
        return PlanFile(str(path), SHARDED, data)
    return read_plan_file(path)


def build_report(args: argparse.Namespace, plan_file: PlanFile) -> Report:
    if plan_file.kind == SHARDED:
        refuse_model(args, plan_file, "a sharded plan holds every operator it reports")
        return from_plan(plan_file, spmd_report, plan_file.data)
    if plan_file.kind == JOINT:
        return report_joint(args, plan_file)
    return from_plan(plan_file, pipeline_report, pipeline_view(args, plan_file))


def from_plan(plan_file: PlanFile, build: Callable[[Any], Report], source: object) -> Report:
    """``build(source)``; a value of the plan file it cannot read is refused naming the file."""
    try:
        return build(source)
    except MtppError as e:
        text = str(e)
        named = text if text.startswith(plan_file.path) else f"{plan_file.path}: {text}"
        raise MtppError(named) from None


def refuse_model(args: argparse.Namespace, plan_file: PlanFile, why: str) -> None:
    if args.graph is not None:
        raise MtppError(
            f"{plan_file.path}: {why}; drop {args.graph}: mtpp report {plan_file.path} --html "
            f"{args.html}"
        )


# ---------------------------------------------------------------------- pipeline plans
def pipeline_view(args: argparse.Namespace, plan_file: PlanFile) -> PipelineView:
    """With MODEL: the blocks recomputed on the graph, the graph drawn, the simulator's
    timeline; without: what the plan file records."""
    if args.graph is None:
        return recorded_view(plan_file)
    p = load_pipeline_plan(args, plan_file)
    ev = evaluate(p.graph, p.cluster, p.assignment, placement=p.placement)
    blocks = ev.blocks()
    device = list(range(len(blocks))) if p.placement is None else [int(d) for d in p.placement]
    order = [int(v) for v in p.graph.topo_order]
    rows = tuple(
        GanttRow(b, b, f"stage {b} (device {device[b]})")
        for b, blk in enumerate(blocks)
        if blk["nodes"] > 0
    )
    data = p.data if plan_file.kind == PIPELINE else {**p.data, **plan_numbers(ev)}
    training = isinstance(data.get("training"), dict)  # its schedule is drawn instead
    return PipelineView(
        path=plan_file.path,
        data=data,
        title=f"plan of {p.graph.name}",
        blocks=blocks,
        names=[p.graph.names[v] for v in order],
        stages=[int(p.assignment[v]) for v in order],
        capacities=[p.cluster.device_capacity(d) for d in device],
        graph=graph_view(p.graph, p.assignment),
        gantt=None if training else inference_gantt(p, rows),
    )


def inference_gantt(p: PipelineInputs, rows: tuple[GanttRow, ...]) -> Gantt:
    """The first requests through the simulated pipeline, one row per non-empty block."""
    requests = min(TIMELINE_REQUESTS, 2 * len(rows) + 2)
    sim = simulate(
        p.graph,
        p.cluster,
        p.assignment,
        requests=requests,
        keep_timeline=requests,
        placement=p.placement,
    )
    title = (
        f"the first {requests} requests through the simulated pipeline (period "
        f"{format_time(sim.period)}; labels: request)"
    )
    return timeline_gantt(sim.timeline, rows, title)


def plan_numbers(ev) -> dict:
    """What a manual sharding does not record: the objective and the slowest block."""
    return {"objective": ev.objective, "bottleneck_block": ev.bottleneck}


def recorded_view(plan_file: PlanFile) -> PipelineView:
    """A pipeline plan from its file alone: recorded blocks, nodes in the file's order."""
    data = plan_file.data
    if plan_file.kind == MANUAL:
        raise MtppError(
            f"{plan_file.path}: a manual sharding records no costs; give the graph: "
            f"mtpp report {plan_file.path} GRAPH --html FILE"
        )
    assignment, blocks = data.get("assignment"), data.get("blocks")
    if not isinstance(assignment, dict) or not isinstance(blocks, list):
        raise MtppError(
            f"{plan_file.path}: the plan records no assignment or blocks; give the graph: "
            f"mtpp report {plan_file.path} GRAPH --html FILE"
        )
    stages = list(assignment.values())
    if not all(isinstance(b, int) and 0 <= b < len(blocks) for b in stages):
        raise MtppError(f"{plan_file.path}: the assignment names blocks the plan does not have")
    cluster = recorded_cluster(plan_file)
    placement = None if cluster is None else read_plan_placement(data, plan_file.path, cluster)
    device = list(range(len(blocks))) if placement is None else [int(d) for d in placement]
    capacities = [
        cluster.device_capacity(d) if cluster is not None and d < cluster.devices else None
        for d in device
    ]
    graph = data.get("graph") if isinstance(data.get("graph"), dict) else {}
    return PipelineView(
        path=plan_file.path,
        data=data,
        title=f"plan of {str(graph.get('name', '-'))[:200]}",
        blocks=blocks,
        names=[str(n) for n in assignment],
        stages=stages,
        capacities=capacities,
        notes=(
            "made from the plan file alone: give the MODEL (mtpp report PLAN MODEL --html "
            "FILE) for the drawing of the graph and the simulated timeline; the strip shows the "
            "nodes in the file's order",
        ),
    )


# ---------------------------------------------------------------------- joint plans
def report_joint(args: argparse.Namespace, plan_file: PlanFile) -> Report:
    """A joint plan with the joint simulator's timeline when its model is at hand (MODEL, or
    the path the plan records); from the file alone otherwise."""
    refuse_pipeline_options(args, {"--work": "roofline"})
    if args.graph is None:
        try:
            args.graph = joint_model_path(plan_file, "report")
        except MtppError:
            plan = joint_plan_from_data(plan_file.data, plan_file.path)
            note = (
                "no timeline: the model this plan names was not found; give it: mtpp report "
                f"{plan_file.path} MODEL.onnx --html FILE"
            )
            return joint_report(plan, None, (note,))
    joint = load_joint(args, plan_file)
    plan = joint.plan
    requests = min(TIMELINE_REQUESTS, 2 * len(plan.stages) + 2)
    js = simulate_joint(plan, joint.model, requests=requests, keep_timeline=requests)
    rows = tuple(
        GanttRow(s.devices[0], s.index, f"stage {s.index}") for s in plan.stages if s.devices
    )
    title = (
        f"the first {requests} requests through the simulated pipeline (period "
        f"{format_time(js.sim.period)}; each row stands for its stage's devices; labels: request)"
    )
    return joint_report(plan, timeline_gantt(js.sim.timeline, rows, title))
