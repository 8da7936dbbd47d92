"""mtpp simulate: a discrete-event pipeline simulation of a plan."""

from __future__ import annotations

import argparse

from solver.cli.common import (
    add_graph_options,
    add_json,
    console,
    formatter,
    load_graph_and_cluster,
    plan_assignment,
    print_json,
)
from solver.errors import MtppError


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
    p.add_argument("--latency", type=float, metavar="SEC", help="per-message link latency")
    p.add_argument("--gantt", metavar="FILE.png", help="draw devices x time bars to this PNG")
    add_graph_options(p)
    add_json(p)


def cmd_simulate(args: argparse.Namespace) -> int:
    from solver.simulate import draw_gantt, simulate

    if args.requests < 1:
        raise MtppError(f"--requests must be >= 1, got {args.requests}")
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
    if args.gantt:
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
    from rich.table import Table

    from solver.units import format_bytes, format_time

    con = console()
    con.print(
        f"[bold]simulation[/bold]: graph {g.name}, {args.requests} requests, {args.mode}"
        + (" with overlap" if args.overlap else "")
    )
    con.print(f"cluster {cluster.summary()}")
    con.print(
        f"period {format_time(sim.period)}  throughput {sim.throughput:.6g} requests/s  "
        f"latency first {format_time(sim.latency_first)}, mean "
        f"{format_time(sim.latency_mean)}  valid {sim.valid}"
    )
    t = Table()
    for col in ("device", "busy", "idle (bubble)", "peak memory", "activations"):
        t.add_column(col, justify="right")
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
        con.print(f"[red]invalid:[/red] {v}")
    if args.gantt:
        con.print(f"Gantt chart written to {args.gantt}")
    return 0 if sim.valid else 1
