"""The ``mtpp`` command line: inspect, evaluate and solve partitioning problems.

Every command takes ``--json`` (one JSON object on stdout, nothing else there). A user mistake
ends with one line on stderr naming what to fix and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np

from solver.errors import MtppError

EPILOG_MAIN = """\
examples:
  mtpp inspect model.onnx
  mtpp solve graph.json --devices 4 --method cpsat --time-limit 60 --out plan.json
  mtpp evaluate graph.json plan.json --json

A GRAPH is an ONNX model (.onnx), an mtpp graph JSON, or a dnn-partitioning JSON.
Run 'mtpp COMMAND --help' for the options of one command.
"""


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32, width=100)


def _add_graph_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("graph and cluster")
    g.add_argument(
        "--cluster",
        metavar="PRESET|FILE",
        help="cluster preset name (ipu-m2000, ipu-pod, dgx-a100) or a cluster YAML file; "
        "default: what the graph file states, else the ipu-pod preset",
    )
    g.add_argument(
        "--devices", "-k", type=int, metavar="K", help="number of devices k (overrides the cluster)"
    )
    g.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="ONNX only: fix a dynamic input dimension, e.g. --dim batch=8 (repeatable)",
    )
    g.add_argument(
        "--work",
        choices=["roofline", "flops", "measured"],
        default="roofline",
        help="ONNX only: node time model (default roofline on the cluster)",
    )


def _add_model_and_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", metavar="MODEL.onnx", help="the ONNX model the plan was made for")
    p.add_argument("plan", metavar="PLAN", help="plan JSON, or a manual-sharding YAML")


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def build_parser() -> argparse.ArgumentParser:
    from solver.methods import METHODS

    parser = argparse.ArgumentParser(
        prog="mtpp",
        description="Split a neural-network graph across devices for maximum pipeline "
        "throughput, and prove how good the split is.",
        epilog=EPILOG_MAIN,
        formatter_class=_formatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "inspect",
        help="summarise a graph: nodes, edges, work, parameters, heaviest operators",
        description="Summarise a graph file: sizes, total work and FLOPs, parameter and "
        "activation bytes, operator types, and the heaviest operators.",
        epilog="example:\n  mtpp inspect ../shared/benchmarks/dnn-partitioning/throughput-inputs/"
        "LayerGraphs/bert24_inference.json --json",
        formatter_class=_formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument("--top", type=int, default=10, help="heaviest operators to list (default 10)")
    _add_graph_options(p)
    _add_json(p)

    methods = ", ".join(METHODS)
    p = sub.add_parser(
        "solve",
        help="compute a plan with a chosen method (exact or heuristic)",
        description=textwrap.dedent(
            f"""\
            Compute a plan that minimises the bottleneck block cost max f(S) (maximises
            throughput). Methods: {methods}.
            'cpsat' is exact: it proves a lower bound and reports OPTIMAL only with a proof;
            the others are heuristics (their bound is the universal averaging bound)."""
        ),
        epilog="examples:\n  mtpp solve graph.json --method cpsat --time-limit 30 --out plan.json\n"
        "  mtpp solve model.onnx --devices 4 --method slicegraph --json",
        formatter_class=_formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument(
        "--method", "-m", default="cpsat", choices=list(METHODS), help="solver (default cpsat)"
    )
    p.add_argument("--out", "-o", metavar="PLAN.json", help="write the plan here (atomically)")
    s = p.add_argument_group("search")
    s.add_argument(
        "--time-limit", type=float, default=60.0, metavar="SEC", help="wall-time limit (default 60)"
    )
    s.add_argument("--workers", type=int, default=0, help="CP-SAT workers (default: all cores)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument(
        "--gap",
        type=float,
        default=0.0,
        metavar="REL",
        help="stop once the relative gap is at most REL, e.g. 0.01 (default 0: prove optimality)",
    )
    s.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    m = p.add_argument_group("method options")
    m.add_argument(
        "--optimal-perf",
        action="store_true",
        help="poprt: keep balancing compute and return the best scheme (default: first that fits)",
    )
    m.add_argument("--sharding", metavar="FILE.yaml", help="manual: the sharding points")
    m.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a method option, e.g. --set population=50 --set generations=30 (slicegraph), "
        "--set max_ideals=100000 (idealdp), --set keep_best=5 (poprt)",
    )
    _add_graph_options(p)
    _add_json(p)

    p = sub.add_parser(
        "evaluate",
        help="cost of a given plan: objective and per-block table",
        description="Evaluate a plan on a graph with the one evaluator: per-block io, work, "
        "overflow, f(S), memory, and whether the plan is valid. The cluster is --cluster if "
        "given, else the one recorded in the plan, else the graph's.",
        epilog="example:\n  mtpp evaluate graph.json plan.json --json",
        formatter_class=_formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument(
        "plan",
        metavar="PLAN",
        help="plan JSON written by 'mtpp solve --out', or a manual-sharding YAML "
        "(a list of {node, device, stage})",
    )
    _add_graph_options(p)
    _add_json(p)

    p = sub.add_parser(
        "simulate",
        help="run a plan through a discrete-event pipeline simulation",
        description="Simulate requests flowing through the devices of a plan: steady-state "
        "period, throughput, latency, per-device busy/idle fractions and peak memory from "
        "liveness. Pipelined without --overlap, the period equals the plan's objective.",
        epilog="examples:\n  mtpp simulate graph.json plan.json --requests 1000\n"
        "  mtpp simulate model.onnx plan.json --mode sequential --gantt gantt.png --json",
        formatter_class=_formatter,
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
    _add_graph_options(p)
    _add_json(p)

    p = sub.add_parser(
        "export",
        help="write the sharded ONNX model of a plan (and verify it)",
        description="Write, into a new folder: annotated.onnx (every node carries "
        "__ipu_number and __pipeline_stage), stage{s}.onnx (one model per stage with explicit "
        "boundary tensors), sharding.yaml (PopRT-style manual sharding that --method manual "
        "reads back), stages.json. The folder appears whole or not at all.",
        epilog="example:\n  mtpp export model.onnx plan.json --out sharded/ --verify",
        formatter_class=_formatter,
    )
    _add_model_and_plan(p)
    p.add_argument("--out", "-o", required=True, metavar="DIR", help="output folder (replaced)")
    p.add_argument(
        "--verify",
        action="store_true",
        help="run the original and the chained stages in onnxruntime on seeded random inputs; "
        "exit 1 if the outputs differ by more than --tolerance",
    )
    p.add_argument("--tolerance", type=float, default=1e-4, help="max abs diff (default 1e-4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    _add_graph_options(p)
    _add_json(p)

    p = sub.add_parser(
        "run",
        help="run a plan for real: one process per stage, joined by queues",
        description="Export the plan to a temporary folder, run every stage as its own "
        "process (one onnxruntime session, one thread each) joined by queues, push requests "
        "through, and report measured throughput and latency next to the simulator's "
        "prediction (node times measured on this machine, queue bandwidth as the link) and "
        "next to the unsplit model in one process with the same total threads.",
        epilog="example:\n  mtpp run models/small/transformer.onnx plan.json --requests 200",
        formatter_class=_formatter,
    )
    _add_model_and_plan(p)
    p.add_argument("--requests", type=int, default=100, help="requests to push (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    _add_graph_options(p)
    _add_json(p)

    p = sub.add_parser(
        "experiment",
        help="run a YAML experiment: methods x graphs x clusters x k, with reports",
        description="Run every combination of a YAML experiment config in parallel processes "
        "and write results.jsonl, runs/, plans/, results.csv, summary.md and PNG plots into "
        "--output. Each finished run is saved at once; --resume skips recorded runs. Each run "
        "gets max(1, cores / jobs) CP-SAT workers.",
        epilog="examples:\n  mtpp experiment configs/experiments/smoke.yaml --output results/smoke"
        "\n  mtpp experiment configs/experiments/heuristic_vs_exact.yaml -o results/hve --jobs 2"
        " --resume",
        formatter_class=_formatter,
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="experiment config (configs/experiments)")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="results folder")
    p.add_argument("--jobs", "-j", type=int, default=1, help="runs in parallel (default 1)")
    p.add_argument("--resume", action="store_true", help="continue a folder, skip finished runs")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    _add_json(p)

    return parser


# ---------------------------------------------------------------------- helpers
def _dims(args: argparse.Namespace) -> dict[str, int]:
    dims = {}
    for item in args.dim:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise MtppError(f"--dim {item!r}: write NAME=VALUE, e.g. --dim batch=8")
        try:
            dims[name] = int(value)
        except ValueError:
            raise MtppError(f"--dim {item!r}: VALUE must be a whole number") from None
    return dims


def _load(args: argparse.Namespace):
    from solver.io import load_graph, resolve_cluster

    dims = _dims(args)
    options = {}
    if Path(args.graph).suffix.lower() == ".onnx":
        options = {
            "dims": dims,
            "work": args.work,
            "cluster": args.cluster,
            "devices": args.devices,
        }
    g = load_graph(args.graph, **options)
    cluster = resolve_cluster(g, args.cluster, args.devices)
    return g, cluster


def _console():
    from rich.console import Console

    con = Console(highlight=False)
    if not con.is_terminal:  # pipes and files: do not squeeze tables into 80 columns
        con = Console(highlight=False, width=140)
    return con


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.6g}"


def _print_json(obj: dict) -> None:
    json.dump(obj, sys.stdout, indent=1, default=_json_default)
    sys.stdout.write("\n")


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))


# ---------------------------------------------------------------------- commands
def cmd_inspect(args: argparse.Namespace) -> int:
    from solver.cost import lower_bound

    g, cluster = _load(args)
    ops = Counter(g.op_types) if g.op_types is not None else Counter()
    top = np.argsort(-g.work, kind="stable")[: max(0, args.top)]
    info = {
        "graph": g.name,
        "format": g.hints.get("format", "onnx" if g.op_types is not None else "mtpp-graph"),
        "nodes": g.n,
        "edges": int(len(g.data_edges[0])),
        "order_edges": g.m,
        "tensors": g.num_tensors,
        "params": g.num_params,
        "param_bytes": g.param_bytes_total,
        "activation_bytes": float(g.sizeout.sum()),
        "work": float(g.work.sum()),
        "flops": None if g.flops is None else float(g.flops.sum()),
        "colocation_groups": len(g.groups),
        "op_types": dict(ops.most_common()),
        "cluster": cluster.to_dict(),
        "lower_bound": lower_bound(g, cluster),
        "heaviest": [
            {
                "name": g.names[v],
                "op_type": g.op_types[v] if g.op_types is not None else None,
                "work": float(g.work[v]),
                "flops": None if g.flops is None else float(g.flops[v]),
                "sizeout": float(g.sizeout[v]),
            }
            for v in top
        ],
    }
    for key, val in g.hints.items():
        if key not in ("cluster", "format"):
            info.setdefault(key, val)
    if args.json:
        _print_json(info)
        return 0
    from rich.table import Table

    from solver.units import format_bytes, format_time

    con = _console()
    t = Table(title=f"graph {g.name}", show_header=False)
    t.add_row("nodes / edges", f"{g.n} / {info['edges']} ({g.m} ordering)")
    t.add_row("parameters", f"{g.num_params} entities, {format_bytes(g.param_bytes_total)}")
    t.add_row("activations (sum of outputs)", format_bytes(info["activation_bytes"]))
    t.add_row("total work", format_time(info["work"]))
    if g.flops is not None:
        t.add_row("total FLOPs", f"{info['flops']:.4g}")
    t.add_row("co-location groups", str(len(g.groups)))
    t.add_row("cluster", cluster.summary())
    t.add_row(f"lower bound on max f (k={cluster.devices})", format_time(info["lower_bound"]))
    con.print(t)
    if ops:
        o = Table(title="operator types")
        o.add_column("op")
        o.add_column("count", justify="right")
        for name, c in ops.most_common(15):
            o.add_row(name, str(c))
        con.print(o)
    h = Table(title=f"heaviest {len(top)} operators")
    for col in ("node", "op", "work", "FLOPs", "output"):
        h.add_column(col, justify="left" if col in ("node", "op") else "right")
    for row in info["heaviest"]:
        h.add_row(
            row["name"],
            row["op_type"] or "-",
            format_time(row["work"]),
            _fmt(row["flops"]),
            format_bytes(row["sizeout"]),
        )
    con.print(h)
    return 0


def _print_plan(plan, violations=(), title: str = "plan") -> None:
    from rich.table import Table

    con = _console()
    con.print(f"[bold]{title}[/bold]: graph {plan.graph_name}, method {plan.method}")
    con.print(f"cluster {plan.cluster.summary()}")
    lb = plan.lower_bound
    gap = plan.gap
    con.print(
        f"status [bold]{plan.status}[/bold]  objective (max f) {_fmt(plan.objective)} s  "
        f"lower bound {_fmt(lb)} s  gap {'-' if gap is None else f'{100 * gap:.3g}%'}"
    )
    con.print(
        f"throughput {_fmt(plan.evaluation.throughput)} requests/s  latency "
        f"{_fmt(plan.evaluation.latency)} s  solve time {plan.wall_seconds:.2f} s"
    )
    t = Table()
    for col in ("block", "nodes", "work", "io in", "io out", "overflow", "f(S)", "params", "peak"):
        t.add_column(col, justify="right", no_wrap=True)
    from solver.units import format_bytes, format_time

    for row in plan.evaluation.blocks():
        mark = " *" if row["block"] == plan.evaluation.bottleneck else ""
        t.add_row(
            f"{row['block']}{mark}",
            str(row["nodes"]),
            format_time(row["work"]),
            format_time(row["io_in"]),
            format_time(row["io_out"]),
            format_time(row["overflow"]),
            format_time(row["f"]),
            format_bytes(row["param_bytes"]),
            format_bytes(row["peak_bytes"]),
        )
    con.print(t)
    con.print("(* = bottleneck block)")
    for v in violations:
        con.print(f"[red]invalid:[/red] {v}")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from solver.cost import validate
    from solver.plan import FEASIBLE, make_plan

    g, cluster = _load(args)
    a, data, cluster = _plan_assignment(args, g, cluster)
    violations = validate(g, cluster, a)
    plan = make_plan(
        g,
        cluster,
        a,
        data.get("method", "given"),
        status=FEASIBLE,
        check=False,
        lower_bound=data.get("lower_bound"),
    )
    if violations:
        plan.status = "INVALID"
    if args.json:
        out = plan.to_dict()
        out["valid"] = not violations
        out["violations"] = [{"kind": v.kind, "message": v.message} for v in violations]
        del out["assignment"]
        _print_json(out)
    else:
        _print_plan(plan, violations, title="evaluation")
    return 0 if not violations else 1


def _plan_assignment(args, g, cluster):
    """The plan file (JSON or manual-sharding YAML) and the cluster to read it with."""
    from solver.cluster import cluster_from_dict
    from solver.plan import read_plan_assignment

    if Path(args.plan).suffix.lower() in (".yaml", ".yml"):
        from solver.heuristics.manual import manual_assignment, read_sharding

        a, stages = manual_assignment(g, read_sharding(args.plan))
        data = {"method": "manual", "stages": stages}
    else:
        a, data = read_plan_assignment(g, args.plan)
    if args.cluster is None and isinstance(data.get("cluster"), dict):
        cluster = cluster_from_dict(data["cluster"], f"cluster recorded in {args.plan}")
        cluster = cluster.with_devices(args.devices)
    if int(a.max()) + 1 > cluster.devices:
        raise MtppError(
            f"{args.plan}: the plan uses block {int(a.max())} but the cluster has "
            f"{cluster.devices} devices; pass --devices {int(a.max()) + 1}"
        )
    return a, data, cluster


def cmd_simulate(args: argparse.Namespace) -> int:
    from solver.simulate import draw_gantt, simulate

    if args.requests < 1:
        raise MtppError(f"--requests must be >= 1, got {args.requests}")
    g, cluster = _load(args)
    a, _, cluster = _plan_assignment(args, g, cluster)
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
        _print_json(out)
        return 0 if sim.valid else 1
    from rich.table import Table

    from solver.units import format_bytes, format_time

    con = _console()
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


def cmd_export(args: argparse.Namespace) -> int:
    from solver.io.onnx_export import export_plan

    if Path(args.graph).suffix.lower() != ".onnx":
        raise MtppError(f"{args.graph}: export needs the ONNX model (.onnx) the plan was made for")
    g, cluster = _load(args)
    a, data, cluster = _plan_assignment(args, g, cluster)
    stages = data.get("stages")  # the stages a manual-sharding YAML states
    report = export_plan(
        args.graph,
        g,
        a,
        args.out,
        dims=_dims(args),
        stage=stages,
        verify=args.verify,
        tolerance=args.tolerance,
        seed=args.seed,
    )
    ok = report.get("verify", {}).get("ok", True)
    if args.json:
        report["out"] = args.out
        _print_json(report)
        return 0 if ok else 1
    con = _console()
    con.print(
        f"wrote {args.out}: annotated.onnx, "
        + ", ".join(st["file"] for st in report["stages"] if st["file"])
        + ", sharding.yaml, stages.json"
    )
    for st in report["stages"]:
        if st["file"]:
            con.print(
                f"  stage {st['stage']}: {st['onnx_nodes']} nodes, {len(st['inputs'])} "
                f"inputs, {len(st['outputs'])} outputs"
            )
    if "verify" in report:
        v = report["verify"]
        status = "[green]OK[/green]" if ok else "[red]MISMATCH[/red]"
        con.print(
            f"verify: max abs diff {v['max_abs_diff']:.3g} (tolerance {v['tolerance']:g}) {status}"
        )
    return 0 if ok else 1


def cmd_run(args: argparse.Namespace) -> int:
    from solver.cluster import Cluster
    from solver.io.onnx_import import load_onnx
    from solver.run import run_plan
    from solver.simulate import simulate

    if Path(args.graph).suffix.lower() != ".onnx":
        raise MtppError(f"{args.graph}: run needs the ONNX model (.onnx) the plan was made for")
    if args.requests < 3:
        raise MtppError(f"--requests must be >= 3, got {args.requests}")
    g, cluster = _load(args)
    a, _, cluster = _plan_assignment(args, g, cluster)
    res = run_plan(args.graph, g, a, dims=_dims(args), requests=args.requests, seed=args.seed)
    measured = load_onnx(args.graph, dims=_dims(args), work="measured")
    here = Cluster("this-machine", int(a.max()) + 1, link_bandwidth=res.queue_bandwidth)
    sim = simulate(measured, here, a, requests=max(50, args.requests))
    out = {
        "graph": g.name,
        "stages": res.stages,
        "requests": args.requests,
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
    }
    if args.json:
        _print_json(out)
        return 0
    from rich.table import Table

    con = _console()
    con.print(
        f"[bold]run[/bold]: {g.name}, {res.stages} stage processes, {args.requests} "
        f"requests; queue bandwidth {res.queue_bandwidth / 1e9:.3g} GB/s"
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


def cmd_experiment(args: argparse.Namespace) -> int:
    from solver.experiments import run_experiment

    if args.jobs < 1:
        raise MtppError(f"--jobs must be >= 1, got {args.jobs}")
    records = run_experiment(
        args.config,
        args.output,
        jobs=args.jobs,
        resume=args.resume,
        progress=not args.quiet and not args.json,
    )
    errors = [r for r in records if r.get("status") == "ERROR"]
    if args.json:
        _print_json({"output": args.output, "runs": len(records), "errors": len(errors)})
    else:
        con = _console()
        con.print((Path(args.output) / "summary.md").read_text())
        con.print(
            f"{len(records)} runs; results in {args.output} (results.csv, summary.md, "
            "ratio_by_method.png, time_vs_size.png)"
        )
        for r in errors[:5]:
            con.print(f"[red]error[/red] {r['graph']} {r['method']}: {r.get('error')}")
    return 0 if not errors else 1


def cmd_solve(args: argparse.Namespace) -> int:
    from solver.methods import SolveOptions, solve
    from solver.plan import save_plan

    if args.time_limit <= 0:
        raise MtppError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    if args.gap < 0:
        raise MtppError(f"--gap must be >= 0, got {args.gap}")
    if args.workers < 0:
        raise MtppError(f"--workers must be >= 0, got {args.workers}")
    g, cluster = _load(args)
    extra: dict = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MtppError(f"--set {item!r}: write KEY=VALUE, e.g. --set population=50")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value
    if args.optimal_perf:
        extra["optimal_perf"] = True
    if args.sharding:
        extra["sharding"] = args.sharding
    opts = SolveOptions(
        time_limit=args.time_limit,
        workers=args.workers,
        seed=args.seed,
        gap=args.gap,
        progress=not args.quiet and not args.json,
        extra=extra,
    )
    plan = solve(g, cluster, args.method, opts)
    if plan is None:
        raise MtppError(infeasible_message(g, cluster))
    if args.out:
        save_plan(plan, args.out)
    if args.json:
        out = plan.to_dict()
        if args.out:
            out["plan_file"] = str(args.out)
            del out["assignment"]
        _print_json(out)
    else:
        _print_plan(plan)
        if plan.method == "poprt":
            from solver.heuristics.poprt import format_sharding

            _console().print(format_sharding(plan.stats.get("sharding_nodes", {})))
        if args.out:
            _console().print(f"plan written to {args.out}")
    return 0


def infeasible_message(g, cluster) -> str:
    """Why no plan exists: name the memory that does not fit."""
    from solver.units import format_bytes

    cap = cluster.capacity
    need = g.param_bytes_total
    text = f"proven: no valid plan of {g.name!r} exists on {cluster.devices} device(s)"
    if cap is not None:
        text += (
            f"; the device capacity {format_bytes(cap)} cannot hold the parameters "
            f"({format_bytes(need)} in total) and activations of any split; use more devices "
            "(--devices) or a cluster with more memory"
        )
    return text


COMMANDS = {
    "inspect": cmd_inspect,
    "evaluate": cmd_evaluate,
    "solve": cmd_solve,
    "simulate": cmd_simulate,
    "export": cmd_export,
    "run": cmd_run,
    "experiment": cmd_experiment,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from solver import __version__

        print(f"mtpp {__version__}")
        return 0
    if not args.command:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except MtppError as e:
        print(f"mtpp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mtpp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
