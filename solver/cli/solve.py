"""mtpp solve and mtpp evaluate: compute a plan, or price a given one."""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from dataclasses import replace

from solver.cli.common import (
    CONTROL_CHARS,
    add_graph_options,
    add_json,
    console,
    esc,
    fmt,
    formatter,
    input_paths,
    load_graph_and_cluster,
    print_json,
    print_list_line,
)
from solver.core.errors import MtppError
from solver.pipeline.registry import METHOD_OPTIONS, METHODS


def add_solve_parser(sub) -> None:
    """Arguments of ``mtpp solve``."""
    methods = ", ".join(METHODS)
    p = sub.add_parser(
        "solve",
        help="compute a plan with a chosen method (exact or heuristic)",
        description=textwrap.dedent(
            f"""\
            Compute a plan that minimises the bottleneck block cost max f(S) (maximises
            throughput). Methods: {methods};
            and joint (ONNX models: pipeline stages on sub-meshes, sharding inside; below).
            'cpsat' is exact: it proves a lower bound and reports OPTIMAL only with a proof;
            every other plan carries a certified lower bound too (docs/bounds.md), and is
            OPTIMAL only when that bound meets it."""
        ),
        epilog="examples:\n  mtpp solve graph.json --method cpsat --time-limit 30 --out plan.json\n"
        "  mtpp solve model.onnx --devices 4 --method slicegraph --json\n"
        "  mtpp solve model.onnx --method joint --cluster dgx-a100-x2 --memory 40GB --out j.json\n"
        "\n--method joint: pipeline stages, each on a sub-mesh of the cluster (inside one host, or "
        "whole hosts) sharding its operators; stage cost = its sharded program + transfers over "
        "the real links. Reports the slowest stage, a lower bound valid over the searched space "
        "(printed), a universal bound valid for every joint plan, and OPTIMAL only when the "
        "bound meets the plan. See docs/joint.md.",
        formatter_class=formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument(
        "--method",
        "-m",
        default="cpsat",
        choices=[*METHODS, *(["joint"] if "joint" not in METHODS else [])],
        metavar="METHOD",
        help=f"solver: {', '.join(METHODS)} (default cpsat); or joint: pipeline stages on "
        "sub-meshes of the cluster, each sharding its operators (ONNX models only; "
        "--set space=joint|pipeline|sharding restricts the plans; docs/joint.md)",
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
    s.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress on stderr (shown also with --json: a live line on a terminal, else "
        "a line on each better plan and every few seconds, none in the first 2 s)",
    )
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
        "--set max_ideals=100000 (idealdp), --set keep_best=5 (poprt); valid keys: "
        + "; ".join(f"{m}: {', '.join(o)}" for m, o in METHOD_OPTIONS.items() if o),
    )
    add_graph_options(p)
    add_json(p)


def add_evaluate_parser(sub) -> None:
    """Arguments of ``mtpp evaluate``."""
    p = sub.add_parser(
        "evaluate",
        help="cost of a given plan: objective and per-block table",
        description="Evaluate a plan on a graph with the one evaluator: per-block io, work, "
        "overflow, f(S), memory, and whether the plan is valid. The cluster is the one recorded "
        "in the plan (a --cluster given must agree with it), else --cluster, else the graph's; "
        "--devices and --memory re-evaluate the plan on that many devices or that capacity. "
        "The kind of plan is read from its content, whatever the file is called. The "
        "objective, validity and the universal lower bound are recomputed; the status and "
        "bound the file states are shown as claimed, and checked against the recomputed "
        "numbers. Exit code 1 when the plan is invalid or its claim does not check out.",
        epilog="example:\n  mtpp evaluate graph.json plan.json --json",
        formatter_class=formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument(
        "plan",
        metavar="PLAN",
        nargs="?",
        help="the plan, whatever its file name: written by 'mtpp solve --out' (a pipeline or "
        "a joint plan), or a manual-sharding YAML (a list of {node, device, stage}); a joint "
        "plan is re-priced from its model and may be given alone: it names its model",
    )
    add_graph_options(p)
    add_json(p)


def _block_rows(plan) -> list[tuple[str, dict | None]]:
    """(label, row) per table line: runs of two or more empty blocks collapse into one line."""
    rows = plan.evaluation.blocks()
    out: list[tuple[str, dict | None]] = []
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j]["nodes"] == 0:
            j += 1
        if j - i >= 2:
            out.append((f"{i}..{j - 1}", None))
            i = j
            continue
        mark = " *" if rows[i]["block"] == plan.evaluation.bottleneck else ""
        out.append((f"{rows[i]['block']}{mark}", rows[i]))
        i += 1
    return out


def _print_plan(
    plan, violations=(), title: str = "plan", claim: dict | None = None, con=None
) -> None:
    """The plan in words and a per-block table that fits 80 columns (times and bytes in one
    unit per column group, named in the header)."""
    from solver.pipeline.plan import OPTIMAL

    con = con or console()
    con.print(f"[bold]{title}[/bold]: graph {esc(plan.graph_name)}, method {esc(plan.method)}")
    print_list_line(con, "cluster " + CONTROL_CHARS.sub("?", plan.cluster.summary()))
    lb = plan.lower_bound
    gap = plan.gap
    status = plan.status + (" (as claimed by the plan file)" if claim and claim["used"] else "")
    within = plan.stats.get("optimal_within") if plan.status == OPTIMAL else None
    if claim is not None and claim["used"]:
        within = claim.get("claimed_optimal_within")
    con.print(f"status [bold]{status}[/bold]")
    if within:
        con.print(f"(optimal within the rounding resolution {fmt(within)} s)")
    con.print(
        f"objective (max f) {fmt(plan.objective)} s  lower bound {fmt(lb)} s  "
        f"gap {'-' if gap is None else f'{100 * gap:.3g}%'}"
    )
    bound = plan.stats.get("bound")
    if isinstance(bound, dict) and bound.get("binding"):
        con.print(f"binding lower bound: {esc(bound['binding'])} (docs/bounds.md)")
    tie = plan.stats.get("tie_break")
    if isinstance(tie, dict) and tie.get("summary"):
        con.print(esc(tie["summary"]))
    if claim is not None:
        con.print(
            f"claimed by the file: status {esc(claim['claimed_status'] or '-')}, lower bound "
            f"{fmt(claim['claimed_lower_bound'])} s"
        )
        con.print(f"claim: {esc(claim['claim'])}")
    con.print(
        f"throughput {fmt(plan.evaluation.throughput)} requests/s  latency "
        f"{fmt(plan.evaluation.latency)} s  solve time {plan.wall_seconds:.2f} s"
    )
    con.print(block_table(plan))
    con.print("(* = bottleneck block; a..b = empty blocks)")
    for v in violations:
        con.print(f"[red]invalid:[/red] {esc(v)}")


TIME_COLUMNS = (("work", "work"), ("io in", "io_in"), ("io out", "io_out"))
TIME_COLUMNS += (("overflow", "overflow"), ("f(S)", "f"))
BYTE_COLUMNS = (("params", "param_bytes"), ("peak", "peak_bytes"))


def block_table(plan):
    """Per-block table: one time unit for all time columns, one byte unit for the memory
    columns, units in the header; 9 narrow columns without side borders fit 80 columns."""
    from rich import box
    from rich.table import Table

    from solver.cli.common import BYTE_UNITS, TIME_UNITS, ColumnUnit

    rows = _block_rows(plan)
    full = [r for _, r in rows if r is not None]
    tu = ColumnUnit([r[k] for r in full for _, k in TIME_COLUMNS], TIME_UNITS)
    bu = ColumnUnit([r[k] for r in full for _, k in BYTE_COLUMNS], BYTE_UNITS)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("block", justify="right", no_wrap=True)
    t.add_column("nodes", justify="right", no_wrap=True)
    for name, _ in TIME_COLUMNS:
        t.add_column(f"{name}\n{tu.name}", justify="right", no_wrap=True)
    for name, _ in BYTE_COLUMNS:
        t.add_column(f"{name}\n{bu.name}", justify="right", no_wrap=True)
    for label, row in rows:
        if row is None:
            t.add_row(label, "0", *["-"] * 7, style="dim")
            continue
        t.add_row(
            label,
            str(row["nodes"]),
            *[tu.cell(row[k]) for _, k in TIME_COLUMNS],
            *[bu.cell(row[k]) for _, k in BYTE_COLUMNS],
        )
    return t


def check_claim(plan, data: dict, recorded_cluster) -> dict:
    """Compare what a plan file claims (status, lower bound, objective) with the recomputed
    numbers. The claim is "consistent" or says why not; it is ``used`` for the status only
    when consistent, made for this cluster (by content: the name may differ), and its bound
    proves that status."""
    from solver.cli.plan_files import cluster_difference
    from solver.pipeline.plan import OPTIMAL, OPTIMALITY_TOL, bound_exceeds, optimal_within

    def number(x) -> bool:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False
        try:
            return math.isfinite(x)
        except OverflowError:  # an integer too large for a float
            return False

    status, bound, obj = data.get("status"), data.get("lower_bound"), data.get("objective")
    res = data.get("optimal_within")
    res = float(res) if number(res) else 0.0
    out = {
        "claimed_status": status[:40] if isinstance(status, str) else None,
        "claimed_lower_bound": float(bound) if number(bound) else None,
        "claimed_objective": float(obj) if number(obj) else None,
        "claimed_optimal_within": res or None,
        "claim": "consistent",
        "used": False,
    }
    why = None
    if status is None and bound is None:
        out["claim"] = "none (the file states no status or bound)"
        return out
    if recorded_cluster is None or cluster_difference(recorded_cluster, plan.cluster):
        why = "not applicable: evaluated on another cluster than the plan was made for"
    elif bound is not None and not number(bound):
        why = f"invalid: the lower bound {str(bound)[:40]!r} is not a finite number"
    elif obj is not None and not number(obj):
        why = f"invalid: the objective {str(obj)[:40]!r} is not a finite number"
    elif number(obj) and abs(obj - plan.objective) > 1e-9 * abs(plan.objective) + 1e-12:
        why = f"invalid: the file's objective {obj:.10g} differs from the recomputed one"
    elif number(bound) and bound_exceeds(float(bound), plan.objective):
        why = f"invalid: the lower bound {bound:.10g} exceeds the objective {plan.objective:.10g}"
    elif status == OPTIMAL and (
        not number(bound)
        or (
            plan.objective - bound > OPTIMALITY_TOL * plan.objective
            and not optimal_within(plan.objective, float(bound), res)
        )
    ):
        why = "invalid: OPTIMAL without a lower bound within 1e-6 of the objective"
    if why is not None:
        out["claim"] = why
        return out
    out["used"] = out["claimed_status"] == OPTIMAL
    return out


EVALUATE_BOUND_SECONDS = 10.0  # time for the certified bounds of a plan being evaluated (the
# exact chain DP needs 4-7 s on a 7B decoder at k = 64; small graphs finish at once)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from solver.cli.plan_files import JOINT, command_plan, load_pipeline_plan
    from solver.core.cost import validate
    from solver.pipeline.plan import FEASIBLE, INVALID, OPTIMAL, make_plan
    from solver.pipeline.registry import bound_stats, certified_bound

    plan_file = command_plan(args, "evaluate")
    if plan_file.kind == JOINT:
        return cmd_evaluate_joint(args, plan_file)
    p = load_pipeline_plan(args, plan_file)
    g, cluster, data = p.graph, p.cluster, p.data
    violations = validate(g, cluster, p.assignment, placement=p.placement)
    method = data.get("method") if isinstance(data.get("method"), str) else "given"
    # the bound is recomputed (the certified bounds, as solve computes them); an invalid plan
    # gets none, since bounds speak of valid plans only. OPTIMAL when the bound meets the plan.
    rep = None if violations else certified_bound(g, cluster, EVALUATE_BOUND_SECONDS)
    plan = make_plan(
        g,
        cluster,
        p.assignment,
        method,
        status=FEASIBLE if rep is None else OPTIMAL,
        check=False,
        lower_bound=None if rep is None else rep.value,
        placement=p.placement,
    )
    if rep is not None:
        plan.stats["bound"] = bound_stats(rep)
    proven = plan.status == OPTIMAL
    claim = check_claim(plan, data, p.recorded)
    if violations:
        plan.status = INVALID
        claim["used"] = False
    elif proven:
        claim["used"] = False  # the recomputed bound proves the status; no claim is needed
    elif claim["used"]:
        plan.status = OPTIMAL
    bad_claim = claim["claim"].startswith("invalid")
    if args.json:
        out = plan.to_dict()
        out["valid"] = not violations
        out["violations"] = [{"kind": v.kind, "message": v.message} for v in violations]
        out["status_source"] = "claimed" if claim["used"] else "recomputed"
        out.update({key: val for key, val in claim.items() if key != "used"})
        out["method"] = method[:200]
        del out["assignment"]
        print_json(out)
    else:
        _print_plan(plan, violations, title="evaluation", claim=claim)
    return 1 if violations or bad_claim else 0


def cmd_evaluate_joint(args: argparse.Namespace, plan_file) -> int:
    """``mtpp evaluate [MODEL.onnx] joint.json``: every stage re-priced from the model and the
    cluster (a number that differs is refused with one line), then checked against the memory
    limit by the joint simulator. The bound is the file's (stated over its space): it is
    checked against the objective, not recomputed. Exit 1 when a stage does not fit."""
    from solver.backends.simulate_joint import simulate_joint
    from solver.cli.plan_files import load_joint, refuse_pipeline_options
    from solver.pipeline.plan import INVALID

    refuse_pipeline_options(args, {"--work": "roofline"})
    plan, sm = load_joint(args, plan_file)
    violations = list(simulate_joint(plan, sm, requests=2).sim.violations)
    claimed = plan.status
    if violations:
        plan.status = INVALID
    if args.json:
        out = plan.to_dict()
        out.update(
            valid=not violations,
            violations=violations,
            claimed_status=claimed,
            status_source="claimed" if not violations else "recomputed",
            repriced=True,
        )
        print_json(out)
        return 1 if violations else 0
    con = console()
    con.print("[bold]evaluation[/bold] of a joint plan")
    print_joint_plan(plan, con)
    con.print(
        "every stage re-priced from the model and the cluster: the file's numbers match; the "
        f"bound and the status ({esc(claimed)}) are the file's, checked against the objective"
    )
    for v in violations:
        con.print(f"[red]invalid:[/red] {esc(v)}")
    return 1 if violations else 0


def parse_set(items: list[str]) -> dict:
    """``--set KEY=VALUE`` pairs: VALUE is read as JSON when it parses (numbers, true, objects),
    else kept as a string; keys and types are checked per method by :func:`solve`."""
    extra: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MtppError(f"--set {item[:80]!r}: write KEY=VALUE, e.g. --set population=50")
        try:
            extra[key] = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            extra[key] = value
    return extra


def cmd_solve(args: argparse.Namespace) -> int:
    from solver.cli.progress import SolveProgress
    from solver.pipeline.options import SolveOptions, check_method_options, check_solve_options
    from solver.pipeline.plan import save_plan
    from solver.pipeline.registry import PROGRESS_METHODS, solve

    if args.method == "joint":
        return cmd_solve_joint(args)
    extra = parse_set(args.set)
    if args.optimal_perf:
        if args.method != "poprt":
            raise MtppError(f"--optimal-perf applies to --method poprt, not {args.method}")
        extra["optimal_perf"] = True
    if args.sharding:
        if args.method != "manual":
            raise MtppError(f"--sharding applies to --method manual, not {args.method}")
        extra["sharding"] = args.sharding
    opts = SolveOptions(
        time_limit=args.time_limit,
        workers=args.workers,
        seed=args.seed,
        gap=args.gap,
        progress=not args.quiet,  # on stderr: with --json, stdout holds only the JSON
        extra=extra,
    )
    check_solve_options(opts)  # before loading a big graph
    check_method_options(args.method, extra)
    if args.out is not None:
        from solver.core.files import check_output_file

        check_output_file(args.out, input_paths(args), "--out")
    g, cluster = load_graph_and_cluster(args)
    reporting = args.method in PROGRESS_METHODS and not args.quiet
    with SolveProgress(reporting, f"{args.method} {g.name}") as progress:
        plan = solve(g, cluster, args.method, replace(opts, reporter=progress))
    if plan is None:
        raise MtppError(infeasible_message(g, cluster))
    if args.out is not None:
        save_plan(plan, args.out)
    if args.json:
        out = plan.to_dict()
        if args.out is not None:
            out["plan_file"] = str(args.out)
            del out["assignment"]
        print_json(out)
    else:
        _print_plan(plan)
        if plan.method == "poprt":
            from solver.pipeline.heuristics.poprt import format_sharding

            console().print(esc(format_sharding(plan.stats.get("sharding_nodes", {}))))
        if args.out is not None:
            console().print(f"plan written to {esc(args.out)}")
    return 0


def infeasible_message(g, cluster) -> str:
    """Why no plan exists: name the memory that does not fit."""
    from solver.core.units import format_bytes

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


# ---------------------------------------------------------------------- --method joint
def cmd_solve_joint(args: argparse.Namespace) -> int:
    """``mtpp solve MODEL.onnx --method joint``: stages on sub-meshes, sharded inside."""
    from pathlib import Path

    from solver.cli.common import memory_arg, parse_dims
    from solver.cli.progress import SolveProgress
    from solver.core.cluster import load_cluster
    from solver.joint import plan_joint, save_joint_plan
    from solver.joint.submesh import SPACES
    from solver.pipeline.registry import SolveOptions, check_solve_options

    if Path(args.graph).suffix.lower() != ".onnx":
        raise MtppError(
            f"{args.graph}: --method joint needs the ONNX model (a cost graph has no operators "
            "to shard); pass the .onnx file"
        )
    extra = parse_set(args.set)
    space = extra.pop("space", "joint")
    if extra:
        raise MtppError(f"--set {next(iter(extra))}: --method joint takes only --set space=...")
    if space not in SPACES:
        raise MtppError(f"--set space={str(space)[:40]}: use one of {', '.join(SPACES)}")
    for flag, used in (
        ("--optimal-perf", args.optimal_perf),
        ("--sharding", args.sharding),
        ("--work", args.work != "roofline"),
    ):
        if used:
            raise MtppError(f"{flag} does not apply to --method joint")
    opts = SolveOptions(time_limit=args.time_limit, workers=args.workers, seed=args.seed)
    opts.gap = args.gap
    check_solve_options(opts)
    dims = parse_dims(args)
    if args.out is not None:
        from solver.core.files import check_output_file

        check_output_file(args.out, input_paths(args), "--out")
    cluster = load_cluster(args.cluster, args.devices)
    memory = memory_arg(args)
    title = f"joint {Path(args.graph).name}"
    with SolveProgress(not args.quiet, title, args.time_limit) as progress:
        plan = plan_joint(
            args.graph,
            cluster,
            memory=memory,
            time_limit=args.time_limit,
            dims=dims,
            space=space,
            progress=progress,
            workers=args.workers,
            gap=args.gap,
        )
    if args.out is not None:
        save_joint_plan(plan, args.out)
    if args.json:
        out = plan.to_dict()
        if args.out is not None:
            out["plan_file"] = str(args.out)
        print_json(out)
        return 0
    print_joint_plan(plan)
    if args.out is not None:
        console().print(f"plan written to {esc(args.out)}")
    return 0


def print_joint_plan(plan, con=None) -> None:
    """The joint plan in words and a per-stage table."""
    from rich import box
    from rich.table import Table

    from solver.cli.common import BYTE_UNITS, TIME_UNITS, ColumnUnit
    from solver.pipeline.plan import OPTIMAL

    con = con or console()
    con.print(f"[bold]joint plan[/bold]: model {esc(plan.model_name)}, space {esc(plan.space)}")
    print_list_line(con, "cluster " + CONTROL_CHARS.sub("?", plan.cluster.summary()))
    gap = plan.gap
    status = plan.status + (f" (optimal over {plan.space} space)" if plan.status == OPTIMAL else "")
    con.print(f"status [bold]{status}[/bold]")
    con.print(
        f"objective (slowest stage) {fmt(plan.objective)} s  lower bound {fmt(plan.lower_bound)} "
        f"s  gap {'-' if gap is None else f'{100 * gap:.3g}%'}"
    )
    con.print(f"the bound covers: {esc(plan.bound_space)}")
    con.print(f"universal lower bound (every joint plan) {fmt(plan.universal_bound)} s")
    con.print(
        f"throughput {fmt(plan.throughput)} requests/s  latency {fmt(plan.latency)} s  "
        f"solve time {plan.wall_seconds:.2f} s"
    )
    cols = ("time", "program_time", "io_in", "io_out")
    tu = ColumnUnit([getattr(s, k) for s in plan.stages for k in cols], TIME_UNITS)
    bu = ColumnUnit([s.memory_per_device for s in plan.stages], BYTE_UNITS)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("stage", justify="right", no_wrap=True)
    t.add_column("devices", no_wrap=True)
    t.add_column("mesh", no_wrap=True)
    t.add_column("ops", no_wrap=True)
    for name in ("time", "program", "io in", "io out"):
        t.add_column(f"{name}\n{tu.name}", justify="right", no_wrap=True)
    t.add_column(f"memory\n{bu.name}", justify="right", no_wrap=True)
    worst = max(range(len(plan.stages)), key=lambda i: plan.stages[i].time)
    first = 0
    for s in plan.stages:
        d = list(s.devices)
        devices = f"{d[0]}-{d[-1]}" if len(d) > 1 and d == list(range(d[0], d[-1] + 1)) else ""
        devices = devices or ",".join(map(str, d))
        ops = f"{first}..{first + len(s.ops) - 1}"  # positions in topological order
        first += len(s.ops)
        t.add_row(
            f"{s.index}{' *' if s.index == worst else ''}",
            devices,
            "x".join(map(str, s.mesh.shape)),
            ops,
            *[tu.cell(getattr(s, k)) for k in cols],
            bu.cell(s.memory_per_device),
        )
    con.print(t)
    con.print(
        "(* = slowest stage; time = program + io in + io out; ops = positions in the "
        "topological order, names in --json)"
    )
