"""mtpp simulate: a discrete-event pipeline simulation of a plan.

One path for every kind: the plan file is read and loaded (:func:`solver.cli.plan_files.
load_plan`), :func:`solver.backends.dispatch.simulate` runs the simulator of its kind (a joint
plan's stages, a training plan's schedule), and the record it returns is drawn and printed.
Exit 1 when the simulation finds the plan invalid.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from solver.backends import dispatch
from solver.backends.dispatch import JointPlanFiles, PipelinePlan, Simulated, SimulateOptions
from solver.backends.schedule import gantt_chart
from solver.backends.simulate import check_latency, check_simulation_size, draw_gantt
from solver.cli.common import (
    BYTE_UNITS,
    TIME_UNITS,
    ColumnUnit,
    console,
    input_paths,
    print_json,
    print_list_line,
)
from solver.cli.plan_files import NOT_FOR_JOINT, command_plan, load_plan, refuse_for_kind
from solver.cli.solve import print_training_simulation
from solver.core.errors import MtppError
from solver.core.files import check_output_file
from solver.core.text import CONTROL_CHARS, device_ranges, esc
from solver.core.units import format_bytes, format_time


def check_gantt_path(path: str, inputs: list[str]) -> Path:
    """Refuse a Gantt chart path that is an input, a folder, in a missing folder or under a
    file, or whose suffix names no format matplotlib can write."""
    out = check_output_file(path, inputs, what="Gantt chart")
    if not out.parent.is_dir():
        raise MtppError(f"{path}: the folder {out.parent} does not exist; create it first")
    suffix = out.suffix.lstrip(".").lower()
    formats = _image_formats()
    if suffix not in formats:
        raise MtppError(
            f"{path}: --gantt needs a file name ending in one of "
            + ", ".join(f".{x}" for x in sorted(formats))
        )
    return out


def _image_formats() -> set[str]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return set(Figure().canvas.get_supported_filetypes())


def cmd_simulate(args: argparse.Namespace) -> int:
    plan_file = command_plan(args, "simulate")
    refuse_for_kind(args, plan_file, JOINT_REFUSES)
    check_simulation_size(1, args.requests)  # the device count is known once loaded
    check_latency(args.latency)
    if args.gantt is not None:
        check_gantt_path(args.gantt, input_paths(args))
    loaded = load_plan(args, plan_file)
    options = SimulateOptions(args.requests, args.mode, args.overlap, args.latency)
    record = dispatch.simulate(loaded, options)
    PRINTERS[record.kind, record.sim is None](record, loaded, args)
    return 0 if record.valid else 1


# the pipeline simulation's options a joint plan refuses (name -> default)
JOINT_REFUSES = {"--mode": "pipelined", "--overlap": False, "--latency": None, **NOT_FOR_JOINT}


def print_pipeline(record: Simulated, p: PipelinePlan, args: argparse.Namespace) -> None:
    """A pipeline plan's simulation: its Gantt chart, then JSON or words."""
    sim = record.sim
    if args.gantt is not None:
        draw_gantt(
            sim,
            p.cluster.devices,
            args.gantt,
            title=f"{p.graph.name}: {args.mode}" + (" with overlap" if args.overlap else ""),
        )
    if args.json:
        out = sim.to_dict()
        out["cluster"] = p.cluster.to_dict()
        out["graph"] = p.graph.name
        print_json(out)
    else:
        print_simulation(console(), sim, p.graph.name, p.cluster, args)


def print_training(record: Simulated, p: PipelinePlan, args: argparse.Namespace) -> None:
    """A training plan's schedule run once, next to its model (docs/training.md)."""
    ts = record.detail
    if args.gantt is not None:
        gantt_chart(ts.run, args.gantt)
    if args.json:
        print_json({**ts.to_dict(), "cluster": p.cluster.to_dict()})
    else:
        print_training_simulation(console(), ts, p.cluster, args.gantt)


def print_joint(record: Simulated, p: JointPlanFiles, args: argparse.Namespace) -> None:
    """A joint plan through the joint simulator: its Gantt chart, then JSON or words."""
    js, plan = record.detail, p.plan
    if args.gantt is not None:
        title = f"{plan.model_name}: joint plan, {len(plan.stages)} stages"
        draw_gantt(js.sim, plan.cluster.devices, args.gantt, title=title)
    if args.json:
        out = js.to_dict()
        out.update(
            model=plan.model_name,
            cluster=plan.cluster.to_dict(),
            plan_objective=plan.objective,
            plan_latency=plan.latency,
        )
        print_json(out)
    else:
        print_joint_simulation(console(), js, plan, args)


def print_joint_training(record: Simulated, p: JointPlanFiles, args: argparse.Namespace) -> None:
    """A joint training plan's schedule run once, next to its model (docs/backends.md)."""
    js = record.detail
    if args.gantt is not None:
        syncs = [(s.pipeline_end, s.sync_end) for s in js.stages]
        title = (
            f"{p.plan.model_name}: {js.training.schedule}, m = {js.training.microbatches}: "
            f"makespan {js.makespan:.6g} s (plan T {js.iteration_time:.6g} s)"
        )
        gantt_chart(js.run, args.gantt, title, syncs=syncs)
    if args.json:
        print_json({**js.to_dict(), "cluster": p.plan.cluster.to_dict()})
    else:
        print_joint_training_simulation(console(), js, p.plan, args.gantt)


# (kind, a training plan's schedule) -> printer
PRINTERS = {
    (dispatch.PIPELINE, False): print_pipeline,
    (dispatch.PIPELINE, True): print_training,
    (dispatch.JOINT, False): print_joint,
    (dispatch.JOINT, True): print_joint_training,
}


def print_simulation(con, sim, graph_name: str, cluster, args: argparse.Namespace) -> None:
    """The simulation in words and a per-device table that fits 80 columns."""
    from rich import box
    from rich.table import Table

    con.print(
        f"[bold]simulation[/bold]: graph {esc(graph_name)}, {args.requests} requests, "
        f"{args.mode}" + (" with overlap" if args.overlap else "")
    )
    print_list_line(con, "cluster " + CONTROL_CHARS.sub("?", cluster.summary()))
    con.print(f"period {format_time(sim.period)}  throughput {sim.throughput:.6g} requests/s")
    con.print(
        f"latency first {format_time(sim.latency_first)}, mean "
        f"{format_time(sim.latency_mean)}  valid {sim.valid}"
    )
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("device", "busy", "idle\n(bubble)", "peak\nmemory", "peak\nactivations"):
        t.add_column(col, justify="right", no_wrap=True)
    for d in range(cluster.devices):
        t.add_row(
            str(d),
            f"{100 * sim.busy[d]:.1f}%",
            f"{100 * sim.idle[d]:.1f}%",
            format_bytes(sim.peak_memory[d]),
            format_bytes(sim.activation_peak[d]),
        )
    con.print(t)
    for v in sim.violations:
        con.print(f"[red]invalid:[/red] {esc(v)}")
    if args.gantt is not None:
        con.print(f"Gantt chart written to {esc(args.gantt)}")


# ---------------------------------------------------------------------- joint plans
def print_joint_simulation(con, js, plan, args: argparse.Namespace) -> None:
    """The pipeline in words, one row per stage (its parts and collectives), violations."""
    from rich import box
    from rich.table import Table

    sim = js.sim
    con.print(
        f"[bold]simulation[/bold]: joint plan of {esc(plan.model_name)}, "
        f"{len(plan.stages)} stages, {args.requests} requests, pipelined"
    )
    print_list_line(con, "cluster " + CONTROL_CHARS.sub("?", plan.cluster.summary()))
    con.print(
        f"period {format_time(sim.period)} (plan objective {format_time(plan.objective)})  "
        f"throughput {sim.throughput:.6g} requests/s"
    )
    con.print(
        f"latency first {format_time(sim.latency_first)} (sum of stage times "
        f"{format_time(plan.latency)}, plus link latencies), mean "
        f"{format_time(sim.latency_mean)}  valid {sim.valid}"
    )
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("stage", "devices", "recv", "program", "send", "time", "memory"):
        t.add_column(col, justify="right", no_wrap=True)
    for row in js.stages:
        devs = row["devices"]
        t.add_row(
            str(row["stage"]),
            device_ranges(devs),
            format_time(row["recv"]),
            format_time(row["program"]),
            format_time(row["send"]),
            format_time(row["time"]),
            format_bytes(row["memory_per_device"]),
        )
    con.print(t)
    for row in js.stages:
        coll = ", ".join(f"{k} x{v}" for k, v in row["collectives"].items()) or "none"
        con.print(f"stage {row['stage']} collectives: {coll}")
    for v in sim.violations:
        con.print(f"[red]invalid:[/red] {esc(v)}")
    if args.gantt is not None:
        con.print(f"Gantt chart written to {esc(args.gantt)}")


def print_joint_training_simulation(con, js, plan, gantt: str | None) -> None:
    """A joint training plan's simulated schedule: makespan vs T, the bounds that hold, and
    per stage F, B, sync, busy fraction, in-flight count and memory, simulated vs the plan's."""
    from rich import box
    from rich.table import Table

    tr = js.training
    con.print(
        f"[bold]training schedule[/bold]: joint plan of {esc(plan.model_name)}, "
        f"{len(plan.stages)} stages, {tr.schedule}, m = {tr.microbatches}"
    )
    print_list_line(con, "cluster " + CONTROL_CHARS.sub("?", plan.cluster.summary()))
    ratio = "-" if js.ratio is None else f"{js.ratio:.4f}"
    con.print(
        f"makespan {format_time(js.makespan)}  plan T {format_time(js.iteration_time)}  "
        f"makespan / T {ratio}  valid {js.valid}"
    )
    rel = js.relation
    upper = "" if rel.upper is None else f", <= {format_time(rel.upper)}"
    con.print(
        f"forwards and backwards end at {format_time(js.pipeline_makespan)}, then the gradient "
        f"sync; proven here: makespan >= {format_time(rel.lower)}{upper}"
    )
    con.print(esc(rel.rule))
    tu = ColumnUnit([x for s in js.stages for x in (s.forward, s.backward, s.sync)], TIME_UNITS)
    mems = [x for s in js.stages for x in (s.memory_simulated, s.memory_model)]
    bu = ColumnUnit(mems, BYTE_UNITS)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in ("stage", f"F\n{tu.name}", f"B\n{tu.name}", f"sync\n{tu.name}", "busy"):
        t.add_column(name, justify="right", no_wrap=True)
    for name in ("in\nflight\nsim", "in\nflight\nplan"):
        t.add_column(name, justify="right", no_wrap=True)
    for name in ("memory\nsim", "memory\nplan"):
        t.add_column(f"{name}\n{bu.name}", justify="right", no_wrap=True)
    for s in js.stages:
        t.add_row(
            str(s.stage),
            *(tu.cell(x) for x in (s.forward, s.backward, s.sync)),
            f"{100 * s.busy_fraction:.1f}%",
            f"{s.inflight_simulated:g}",
            f"{s.inflight_model:g}",
            bu.cell(s.memory_simulated),
            bu.cell(s.memory_model),
        )
    con.print(t)
    con.print(
        "(per microbatch: F, B with the stage's transfers; sync once per iteration; in flight: "
        "the most microbatches stashed at once; devices in --json)"
    )
    for violation in js.violations:
        con.print(f"[red]invalid:[/red] {esc(violation)}")
    if gantt is not None:
        con.print(f"Gantt chart written to {esc(gantt)}")
