"""mtpp run: the plan run for real, one process per stage."""

from __future__ import annotations

import argparse
from pathlib import Path

from solver.backends import simulate  # simulate.simulate: tests patch it there
from solver.backends.run import check_requests, run_plan
from solver.cli.common import console, parse_dims, print_json
from solver.cli.plan_files import JOINT, command_plan, load_pipeline_plan
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.text import esc
from solver.frontends.onnx.reader import load_onnx


def cmd_run(args: argparse.Namespace) -> int:
    if Path(args.graph).suffix.lower() != ".onnx":
        raise MtppError(f"{args.graph}: run needs the ONNX model (.onnx) the plan was made for")
    plan = command_plan(args, "run")
    if plan.kind == JOINT:
        raise MtppError(
            f"{plan.path}: a joint plan, and this command takes pipeline plans; check a joint "
            "plan with mtpp evaluate, mtpp simulate or mtpp export --verify"
        )
    check_requests(args.requests)
    if args.seed < 0:
        raise MtppError(f"--seed must be >= 0, got {args.seed}")
    dims = parse_dims(args)
    p = load_pipeline_plan(args, plan)
    g, a, cluster, placement = p.graph, p.assignment, p.cluster, p.placement
    res = run_plan(
        args.graph,
        g,
        a,
        dims=dims,
        requests=args.requests,
        seed=args.seed,
        memory_ok=args.memory_ok,
        placement=placement,
    )
    # node times for the simulator (profiled once); --memory-ok covers that run too
    measured = g
    if g.hints.get("work_model") != "measured":
        measured = load_onnx(args.graph, dims=dims, work="measured", memory_ok=args.memory_ok)
    # this machine: alike stage processes, as many as the plan's devices, its queues as links
    devices = int(a.max()) + 1 if placement is None else len(placement)
    here = Cluster("this-machine", devices, link_bandwidth=res.queue_bandwidth)
    # the simulated period settles within a few hundred requests; more only costs time
    sim = simulate.simulate(
        measured, here, a, requests=min(max(50, args.requests), 500), placement=placement
    )
    out = {
        "graph": g.name,
        "stages": res.stages,
        "requests": args.requests,
        "inputs": res.input_shapes,
        "measured": {"throughput": res.throughput, "latency": res.latency},
        "simulated": {
            "throughput": sim.throughput,
            "latency": sim.latency_first,
            "period": sim.period,
        },
        "unsplit": {
            "throughput": res.unsplit_throughput,
            "latency": res.unsplit_latency,
            "threads": res.stages,
        },
        "queue_bandwidth": res.queue_bandwidth,
        "placement": None if placement is None else placement.tolist(),
    }
    if args.json:
        print_json(out)
        return 0
    from rich.table import Table

    con = console()
    con.print(
        f"[bold]run[/bold]: {esc(g.name)}, {res.stages} stage processes, {args.requests} "
        f"requests; queue bandwidth {res.queue_bandwidth / 1e9:.3g} GB/s"
    )
    shapes = ", ".join(esc(f"{x} {list(v)}") for x, v in res.input_shapes.items())
    con.print(f"inputs: {shapes}")
    if placement is not None:
        con.print(
            esc(
                f"placement {placement.tolist()} (block b on device placement[b] of "
                f"{cluster.name}); here every device is one alike stage process"
            )
        )
    t = Table()
    for col in ("", "throughput (req/s)", "latency (ms)"):
        t.add_column(col, justify="right")
    t.add_row("pipelined, measured", f"{res.throughput:.4g}", f"{1e3 * res.latency:.4g}")
    t.add_row("pipelined, simulated", f"{sim.throughput:.4g}", f"{1e3 * sim.latency_first:.4g}")
    t.add_row(
        f"unsplit, {res.stages} threads",
        f"{res.unsplit_throughput:.4g}",
        f"{1e3 * res.unsplit_latency:.4g}",
    )
    con.print(t)
    return 0
