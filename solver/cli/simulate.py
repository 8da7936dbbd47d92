"""mtpp simulate: a discrete-event pipeline simulation of a plan."""

from __future__ import annotations

import argparse
from pathlib import Path

from solver.cli.common import (
    CONTROL_CHARS,
    add_graph_options,
    add_json,
    console,
    esc,
    formatter,
    input_paths,
    load_graph_and_cluster,
    plan_assignment,
    print_json,
    print_list_line,
)
from solver.errors import MtppError
from solver.files import check_output_file
from solver.plan import PLAN_FORMAT


def add_parser(sub) -> None:
    """Arguments of ``mtpp simulate``."""
    p = sub.add_parser(
        "simulate",
        help="run a plan through a discrete-event pipeline simulation",
        description="Simulate requests flowing through the devices of a plan: steady-state "
        "period, throughput, latency, per-device busy/idle fractions and peak memory from "
        "liveness. Pipelined without --overlap, the period equals the plan's objective.",
        epilog="examples:\n  mtpp simulate graph.json plan.json --requests 1000\n"
        "  mtpp simulate model.onnx plan.json --mode sequential --gantt gantt.png --json\n"
        "  mtpp simulate joint.json --gantt gantt.png   # stages on sub-meshes (docs/joint.md)",
        formatter_class=formatter,
    )
    p.add_argument(
        "graph", metavar="GRAPH", help="graph file (.onnx or .json), or a joint plan JSON alone"
    )
    p.add_argument(
        "plan",
        metavar="PLAN",
        nargs="?",
        help="plan JSON, or a manual-sharding YAML; a joint plan (mtpp solve --method joint) "
        "may be given alone: it names its model",
    )
    p.add_argument("--requests", type=int, default=100, help="requests to push (default 100)")
    p.add_argument(
        "--mode",
        choices=["pipelined", "sequential"],
        default="pipelined",
        help="pipelined: devices work on different requests at once; sequential: plain "
        "sharding, one device busy at a time (default pipelined)",
    )
    p.add_argument("--overlap", action="store_true", help="let transfers overlap compute")
    p.add_argument(
        "--latency", type=float, metavar="SEC", help="per-message link latency in seconds (>= 0)"
    )
    p.add_argument(
        "--gantt",
        metavar="FILE.png",
        help="draw devices x time bars to this file (format from the suffix: png, pdf, svg, ...); "
        "its folder must exist",
    )
    add_graph_options(p)
    add_json(p)


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
    from solver.simulate import check_latency, check_simulation_size, draw_gantt, simulate

    joint = joint_plan_args(args, "simulate")
    if joint is not None:
        return cmd_simulate_joint(args, *joint)
    check_simulation_size(1, args.requests)  # the device count is known once loaded
    check_latency(args.latency)
    if args.gantt is not None:
        check_gantt_path(args.gantt, input_paths(args))
    g, cluster = load_graph_and_cluster(args)
    a, data, cluster = plan_assignment(args, g, cluster)
    from solver.plan import read_plan_placement

    dev = read_plan_placement(data, args.plan, cluster)
    sim = simulate(
        g,
        cluster,
        a,
        requests=args.requests,
        mode=args.mode,
        overlap=args.overlap,
        latency=args.latency,
        placement=dev,
    )
    if args.gantt is not None:
        draw_gantt(
            sim,
            cluster.devices,
            args.gantt,
            title=f"{g.name}: {args.mode}" + (" with overlap" if args.overlap else ""),
        )
    if args.json:
        out = sim.to_dict()
        out["cluster"] = cluster.to_dict()
        out["graph"] = g.name
        print_json(out)
        return 0 if sim.valid else 1
    print_simulation(console(), sim, g.name, cluster, args)
    return 0 if sim.valid else 1


def print_simulation(con, sim, graph_name: str, cluster, args: argparse.Namespace) -> None:
    """The simulation in words and a per-device table that fits 80 columns."""
    from rich import box
    from rich.table import Table

    from solver.units import format_bytes, format_time

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
def plan_format(path: str) -> str | None:
    """The ``format`` a JSON file states (None for another file, or a JSON without one)."""
    from solver.files import read_json

    if Path(path).suffix.lower() != ".json" or not Path(path).is_file():
        return None
    data = read_json(path, "plan")
    fmt = data.get("format") if isinstance(data, dict) else None
    return fmt if isinstance(fmt, str) else None


def is_joint_plan(path: str) -> bool:
    """True when ``path`` is a JSON file whose ``format`` is a joint plan's."""
    from solver.joint.plan import JOINT_FORMAT

    return plan_format(path) == JOINT_FORMAT


def joint_plan_args(args: argparse.Namespace, command: str) -> tuple[str, str] | None:
    """(model path, joint plan path) when the command was given a joint plan, else None
    (a missing PLAN is refused). A plan given alone names its model: a relative path is
    looked up from the current folder, then from the plan's folder."""
    from solver.files import read_json

    if args.plan is None:
        if not is_joint_plan(args.graph):
            if plan_format(args.graph) == PLAN_FORMAT:
                raise MtppError(
                    f"{args.graph} is a pipeline plan, which does not name its graph file; "
                    f"give the graph first: mtpp {command} GRAPH {args.graph}"
                )
            raise MtppError(f"name the PLAN: mtpp {command} GRAPH PLAN (see mtpp {command} --help)")
        data = read_json(args.graph, "plan")
        model = data.get("model") if isinstance(data.get("model"), dict) else {}
        path = model.get("path")
        if not isinstance(path, str) or not path:
            raise MtppError(
                f"{args.graph}: the joint plan names no model file; give it: "
                f"mtpp {command} MODEL.onnx {args.graph}"
            )
        found = next((p for p in (Path(path), Path(args.graph).parent / path) if p.is_file()), None)
        if found is None:
            raise MtppError(
                f"{args.graph}: its model {path} does not exist; give it: "
                f"mtpp {command} MODEL.onnx {args.graph}"
            )
        return str(found), args.graph
    if not is_joint_plan(args.plan):
        return None
    if Path(args.graph).suffix.lower() != ".onnx":
        raise MtppError(f"{args.graph}: a joint plan needs the ONNX model (.onnx) it was made for")
    return args.graph, args.plan


def refuse_pipeline_options(args: argparse.Namespace, names: dict[str, object]) -> None:
    """Refuse options that have no meaning for a joint plan (given a non-default value)."""
    for option, default in names.items():
        value = getattr(args, option.lstrip("-").replace("-", "_"), default)
        if value != default:
            raise MtppError(f"{option} does not apply to a joint plan; drop it")


def load_joint(args: argparse.Namespace, model: str, plan_path: str):
    """The joint plan read, checked against the model (one line for every mismatch), with
    ``--memory`` as its memory limit when given; and the model as the sharding package
    reads it."""
    from solver.cli.common import memory_arg, parse_dims
    from solver.joint.export import check_stages
    from solver.joint.plan import check_against_model, load_joint_plan
    from solver.sharding.model import load_model

    refuse_pipeline_options(args, {"--cluster": None, "--devices": None})
    plan = load_joint_plan(plan_path)
    sm = load_model(model, parse_dims(args))
    check_stages(plan, sm)  # names the operator or device at fault
    memory = memory_arg(args)
    if memory is not None:
        plan.memory_limit = memory
    check_against_model(plan, sm, plan_path)
    return plan, sm


def cmd_simulate_joint(args: argparse.Namespace, model: str, plan_path: str) -> int:
    from solver.joint.simulate import simulate_joint
    from solver.simulate import check_simulation_size, draw_gantt

    refuse_pipeline_options(
        args, {"--mode": "pipelined", "--overlap": False, "--latency": None, "--work": "roofline"}
    )
    check_simulation_size(1, args.requests)
    args.graph, args.plan = model, plan_path  # what input_paths must protect
    if args.gantt is not None:
        check_gantt_path(args.gantt, input_paths(args))
    plan, sm = load_joint(args, model, plan_path)
    js = simulate_joint(plan, sm, requests=args.requests)
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
        return 0 if js.valid else 1
    print_joint_simulation(console(), js, plan, args)
    return 0 if js.valid else 1


def print_joint_simulation(con, js, plan, args: argparse.Namespace) -> None:
    """The pipeline in words, one row per stage (its parts and collectives), violations."""
    from rich import box
    from rich.table import Table

    from solver.units import format_bytes, format_time

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


def device_ranges(devices: list[int]) -> str:
    """``[0, 1, 2, 3, 6]`` -> ``"0-3,6"``."""
    runs: list[list[int]] = []
    for d in devices:
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
