"""mtpp run: the plan run for real, one process per stage."""

from __future__ import annotations

import argparse

from solver.backends import simulate  # simulate.simulate: tests patch it there
from solver.backends.run import RunResult, check_requests, run_plan
from solver.cli.common import console, parse_dims, print_json
from solver.cli.plan_files import JOINT, PipelineInputs, command_plan, load_pipeline_plan
from solver.cli.run_torch import cmd_run_torch
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.text import esc
from solver.frontends import is_onnx_file
from solver.frontends.onnx.reader import load_onnx
from solver.pipeline.plan import JOINT_PLAN_REFUSED

DEFAULT_REQUESTS = 100  # --requests of the onnx back end
TORCH_OPTIONS = ("--module", "--microbatches", "--schedule")  # --backend torch only


def cmd_run(args: argparse.Namespace) -> int:
    """Run the plan for real, simulate it with node times measured here, and report both."""
    if args.backend == "torch":
        return cmd_run_torch(args)
    for option in TORCH_OPTIONS:
        if getattr(args, option.lstrip("-")) is not None:
            raise MtppError(f"{option} applies to --backend torch; add it or drop {option}")
    args.requests = DEFAULT_REQUESTS if args.requests is None else args.requests
    p = _checked_plan(args)
    run = run_plan(
        args.graph,
        p.graph,
        p.assignment,
        dims=parse_dims(args),
        requests=args.requests,
        seed=args.seed,
        memory_ok=args.memory_ok,
        placement=p.placement,
    )
    sim = _simulate_here(args, p, run)
    if args.json:
        print_json(_run_record(args, p, run, sim))
    else:
        print_run(console(), args, p, run, sim)
    return 0


def _checked_plan(args: argparse.Namespace) -> PipelineInputs:
    """The pipeline plan to run, once the model, the plan kind and the options are checked."""
    if not is_onnx_file(args.graph):
        raise MtppError(f"{args.graph}: run needs the ONNX model (.onnx) the plan was made for")
    plan = command_plan(args, "run")
    if plan.kind == JOINT:
        raise MtppError(f"{plan.path}: {JOINT_PLAN_REFUSED}")
    check_requests(args.requests)
    if args.seed < 0:
        raise MtppError(f"--seed must be >= 0, got {args.seed}")
    parse_dims(args)  # a bad --dim is named before the plan is read
    return load_pipeline_plan(args, plan)


def _simulate_here(
    args: argparse.Namespace, p: PipelineInputs, run: RunResult
) -> simulate.Simulation:
    """The plan simulated on this machine: node times profiled here (once; --memory-ok covers
    that run too), alike stage processes, as many as the plan's devices, its queues as links."""
    measured = p.graph
    if p.graph.hints.get("work_model") != "measured":
        measured = load_onnx(
            args.graph, dims=parse_dims(args), work="measured", memory_ok=args.memory_ok
        )
    a, placement = p.assignment, p.placement
    devices = int(a.max()) + 1 if placement is None else len(placement)
    here = Cluster("this-machine", devices, link_bandwidth=run.queue_bandwidth)
    # the simulated period settles within a few hundred requests; more only costs time
    requests = min(max(50, args.requests), 500)
    return simulate.simulate(measured, here, a, requests=requests, placement=placement)


def _run_record(
    args: argparse.Namespace, p: PipelineInputs, run: RunResult, sim: simulate.Simulation
) -> dict:
    """The JSON object of mtpp run: measured, simulated and unsplit numbers."""
    return {
        "graph": p.graph.name,
        "stages": run.stages,
        "requests": args.requests,
        "inputs": run.input_shapes,
        "measured": {"throughput": run.throughput, "latency": run.latency},
        "simulated": {
            "throughput": sim.throughput,
            "latency": sim.latency_first,
            "period": sim.period,
        },
        "unsplit": {
            "throughput": run.unsplit_throughput,
            "latency": run.unsplit_latency,
            "threads": run.stages,
        },
        "queue_bandwidth": run.queue_bandwidth,
        "placement": None if p.placement is None else p.placement.tolist(),
    }


def print_run(
    con, args: argparse.Namespace, p: PipelineInputs, run: RunResult, sim: simulate.Simulation
) -> None:
    """The run in words and a table: pipelined measured, pipelined simulated, unsplit."""
    from rich.table import Table

    con.print(
        f"[bold]run[/bold]: {esc(p.graph.name)}, {run.stages} stage processes, {args.requests} "
        f"requests; queue bandwidth {run.queue_bandwidth / 1e9:.3g} GB/s"
    )
    shapes = ", ".join(esc(f"{x} {list(v)}") for x, v in run.input_shapes.items())
    con.print(f"inputs: {shapes}")
    if p.placement is not None:
        con.print(
            esc(
                f"placement {p.placement.tolist()} (block b on device placement[b] of "
                f"{p.cluster.name}); here every device is one alike stage process"
            )
        )
    t = Table()
    for col in ("", "throughput (req/s)", "latency (ms)"):
        t.add_column(col, justify="right")
    t.add_row("pipelined, measured", f"{run.throughput:.4g}", f"{1e3 * run.latency:.4g}")
    t.add_row("pipelined, simulated", f"{sim.throughput:.4g}", f"{1e3 * sim.latency_first:.4g}")
    t.add_row(
        f"unsplit, {run.stages} threads",
        f"{run.unsplit_throughput:.4g}",
        f"{1e3 * run.unsplit_latency:.4g}",
    )
    con.print(t)
