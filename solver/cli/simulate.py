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


def add_parser(sub) -> None:
    """Arguments of ``mtpp simulate``."""
    p = sub.add_parser(
        "simulate",
        help="run a plan through a discrete-event pipeline simulation",
        description="Simulate requests flowing through the devices of a plan: steady-state "
        "period, throughput, latency, per-device busy/idle fractions and peak memory from "
        "liveness. Pipelined without --overlap, the period equals the plan's objective.",
        epilog="examples:\n  mtpp simulate graph.json plan.json --requests 1000\n"
        "  mtpp simulate model.onnx plan.json --mode sequential --gantt gantt.png --json",
        formatter_class=formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument("plan", metavar="PLAN", help="plan JSON, or a manual-sharding YAML")
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

    check_simulation_size(1, args.requests)  # the device count is known once loaded
    check_latency(args.latency)
    if args.gantt is not None:
        check_gantt_path(args.gantt, input_paths(args))
    g, cluster = load_graph_and_cluster(args)
    a, _, cluster = plan_assignment(args, g, cluster)
    sim = simulate(
        g,
        cluster,
        a,
        requests=args.requests,
        mode=args.mode,
        overlap=args.overlap,
        latency=args.latency,
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
