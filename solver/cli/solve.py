"""mtpp solve and mtpp evaluate: compute a plan, or price a given one."""

from __future__ import annotations

import argparse
import json
import textwrap

from solver.cli.common import (
    add_graph_options,
    add_json,
    console,
    fmt,
    formatter,
    load_graph_and_cluster,
    plan_assignment,
    print_json,
)
from solver.errors import MtppError
from solver.methods import METHODS


def add_solve_parser(sub) -> None:
    """Arguments of ``mtpp solve``."""
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
        formatter_class=formatter,
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
    add_graph_options(p)
    add_json(p)


def add_evaluate_parser(sub) -> None:
    """Arguments of ``mtpp evaluate``."""
    p = sub.add_parser(
        "evaluate",
        help="cost of a given plan: objective and per-block table",
        description="Evaluate a plan on a graph with the one evaluator: per-block io, work, "
        "overflow, f(S), memory, and whether the plan is valid. The cluster is --cluster if "
        "given, else the one recorded in the plan, else the graph's.",
        epilog="example:\n  mtpp evaluate graph.json plan.json --json",
        formatter_class=formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument(
        "plan",
        metavar="PLAN",
        help="plan JSON written by 'mtpp solve --out', or a manual-sharding YAML "
        "(a list of {node, device, stage})",
    )
    add_graph_options(p)
    add_json(p)


def _print_plan(plan, violations=(), title: str = "plan") -> None:
    from rich.table import Table

    con = console()
    con.print(f"[bold]{title}[/bold]: graph {plan.graph_name}, method {plan.method}")
    con.print(f"cluster {plan.cluster.summary()}")
    lb = plan.lower_bound
    gap = plan.gap
    con.print(
        f"status [bold]{plan.status}[/bold]  objective (max f) {fmt(plan.objective)} s  "
        f"lower bound {fmt(lb)} s  gap {'-' if gap is None else f'{100 * gap:.3g}%'}"
    )
    con.print(
        f"throughput {fmt(plan.evaluation.throughput)} requests/s  latency "
        f"{fmt(plan.evaluation.latency)} s  solve time {plan.wall_seconds:.2f} s"
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

    g, cluster = load_graph_and_cluster(args)
    a, data, cluster = plan_assignment(args, g, cluster)
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
        print_json(out)
    else:
        _print_plan(plan, violations, title="evaluation")
    return 0 if not violations else 1


def cmd_solve(args: argparse.Namespace) -> int:
    from solver.methods import SolveOptions, solve
    from solver.plan import save_plan

    if args.time_limit <= 0:
        raise MtppError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    if args.gap < 0:
        raise MtppError(f"--gap must be >= 0, got {args.gap}")
    if args.workers < 0:
        raise MtppError(f"--workers must be >= 0, got {args.workers}")
    g, cluster = load_graph_and_cluster(args)
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
        print_json(out)
    else:
        _print_plan(plan)
        if plan.method == "poprt":
            from solver.heuristics.poprt import format_sharding

            console().print(format_sharding(plan.stats.get("sharding_nodes", {})))
        if args.out:
            console().print(f"plan written to {args.out}")
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
