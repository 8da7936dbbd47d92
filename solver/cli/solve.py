"""mtpp solve: compute a plan (a pipeline method, or --method joint), and the printers of plans.

The joint planner's names are imported on first use (:class:`solver.api.OnFirstUse`): a
pipeline solve does not load the joint and SPMD planners (docs/architecture.md, "Start-up").
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from solver import api
from solver.cli.common import (
    BYTE_UNITS,
    TIME_UNITS,
    ColumnUnit,
    console,
    fmt,
    input_paths,
    load_graph_and_cluster,
    memory_arg,
    parse_dims,
    print_json,
    print_list_line,
)
from solver.cli.progress import SolveProgress
from solver.core.errors import MtppError
from solver.core.files import check_output_file
from solver.core.text import CONTROL_CHARS, esc
from solver.core.training import TrainingSpec
from solver.core.units import format_bytes
from solver.frontends import is_onnx_file
from solver.frontends.onnx.modules import read_layout
from solver.pipeline import registry
from solver.pipeline.granularity import GRANULARITY_KEY, solve_layer_granular
from solver.pipeline.heuristics.poprt import format_sharding
from solver.pipeline.options import SolveOptions
from solver.pipeline.plan import OPTIMAL, Plan, save_plan

if TYPE_CHECKING:  # the joint planner itself is imported on first use (see the top)
    from solver.joint.plan import JointPlan

SAVE_JOINT_PLAN = api.OnFirstUse("solver.joint.plan", "save_joint_plan")
JOINT_TRAINING_LINES = api.OnFirstUse("solver.joint.training", "training_lines")


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


def print_plan(
    plan, violations=(), title: str = "plan", claim: dict | None = None, con=None
) -> None:
    """The plan in words and a per-block table that fits 80 columns (times and bytes in one
    unit per column group, named in the header)."""
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
        f"objective ({objective_name(plan)}) {fmt(plan.objective)} s  lower bound {fmt(lb)} s  "
        f"gap {'-' if gap is None else f'{100 * gap:.3g}%'}"
    )
    bound = plan.stats.get("bound")
    if isinstance(bound, dict) and bound.get("binding"):
        docs = "docs/bounds.md" if plan.training is None else "docs/training.md"
        con.print(f"binding lower bound: {esc(bound['binding'])} ({docs})")
    unpriced = (bound.get("certified") or {}).get("unpriced") if isinstance(bound, dict) else None
    if unpriced and plan.status != OPTIMAL:
        con.print(f"not priced by the bounds (the gap may be there): {esc(', '.join(unpriced))}")
    tie = plan.stats.get("tie_break")
    if isinstance(tie, dict) and tie.get("summary"):
        con.print(esc(tie["summary"]))
    if claim is not None:
        con.print(
            f"claimed by the file: status {esc(claim['claimed_status'] or '-')}, lower bound "
            f"{fmt(claim['claimed_lower_bound'])} s"
        )
        con.print(f"claim: {esc(claim['claim'])}")
    if plan.training is not None:
        print_training(con, plan)
    else:
        con.print(
            f"throughput {fmt(plan.evaluation.throughput)} requests/s  latency "
            f"{fmt(plan.evaluation.latency)} s  solve time {plan.wall_seconds:.2f} s"
        )
        con.print(block_table(plan))
        con.print("(* = bottleneck block; a..b = empty blocks)")
    for v in violations:
        con.print(f"[red]invalid:[/red] {esc(v)}")


def objective_name(plan: Plan) -> str:
    """What the objective of ``plan`` is, in words."""
    tc = plan.training
    if tc is None:
        return "max f"
    v = f", v = {tc.spec.virtual_stages}" if tc.spec.virtual_stages > 1 else ""
    return f"iteration time T, {tc.spec.schedule}, m = {tc.spec.microbatches}{v}"


def print_training(con, plan: Plan) -> None:
    """A training plan's stages (F, B, t, memory within capacity, microbatches in flight) and
    how the practitioners' splits and other plans tried compare."""
    from rich import box
    from rich.table import Table

    tc = plan.training
    con.print(
        f"slowest stage t {fmt(tc.max_stage_time)} s  state factor "
        f"{tc.spec.optimizer_state:g}  solve time {plan.wall_seconds:.2f} s"
    )
    stages = tc.stages
    tu = ColumnUnit([x for s in stages for x in (s.forward, s.backward, s.time)], TIME_UNITS)
    caps = [s.capacity for s in stages if s.capacity is not None]
    bu = ColumnUnit([s.memory for s in stages] + caps, BYTE_UNITS)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in ("stage", "block", "nodes"):
        t.add_column(name, justify="right", no_wrap=True)
    for name in ("F", "B", "t"):
        t.add_column(f"{name}\n{tu.name}", justify="right", no_wrap=True)
    t.add_column(f"memory\n{bu.name}", justify="right", no_wrap=True)
    t.add_column(f"capacity\n{bu.name}", justify="right", no_wrap=True)
    t.add_column("in\nflight", justify="right", no_wrap=True)
    for s in stages:
        t.add_row(
            f"{s.stage}{' *' if s.time == tc.max_stage_time else ''}",
            str(s.block),
            str(s.nodes),
            *[tu.cell(x) for x in (s.forward, s.backward, s.time)],
            bu.cell(s.memory),
            "-" if s.capacity is None else bu.cell(s.capacity),
            f"{s.inflight:g}",
        )
    con.print(t)
    con.print("(* = slowest stage; t = F + B; memory = state x params + peak + in flight x stash)")
    tried = plan.stats.get("training_solve", {}).get("tried", {})
    splits = [
        f"{esc(name)} {_versus(row, plan.objective)}"
        for name, row in tried.items()
        if name in PRACTITIONER_SPLITS
    ]
    if splits:
        con.print("practitioners' splits: " + "; ".join(splits))


PRACTITIONER_SPLITS = ("uniform", "fewer-at-ends", "by-parameters")


def _versus(row: dict, objective: float) -> str:
    """A plan tried, against the plan found: its T and the ratio, or why it is not valid."""
    if not row.get("valid"):
        return "does not fit the memory"
    T = row["iteration_time"]
    return f"T {fmt(T)} s ({T / objective:.3f}x)" if objective > 0 else f"T {fmt(T)} s"


TIME_COLUMNS = (("work", "work"), ("io in", "io_in"), ("io out", "io_out"))
TIME_COLUMNS += (("overflow", "overflow"), ("f(S)", "f"))
BYTE_COLUMNS = (("params", "param_bytes"), ("peak", "peak_bytes"))


def block_table(plan):
    """Per-block table: one time unit for all time columns, one byte unit for the memory
    columns, units in the header; 9 narrow columns without side borders fit 80 columns."""
    from rich import box
    from rich.table import Table

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


# exact chain DP needs 4-7 s on a 7B decoder at k = 64; small graphs finish at once)


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
    """Plan the graph with a pipeline method or ``--method joint`` (solver.api.solve), write
    the plan (--out) and show it."""
    check_granularity(args)
    opts = solve_options(args)
    problem = api.Problem(
        graph_path=args.graph, cluster=args.cluster, devices=args.devices, work=args.work
    )
    api.check_request(problem, args.method, opts)  # every refusal before a big graph is read
    if args.out is not None:
        check_output_file(args.out, input_paths(args), "--out")
    if args.method == api.JOINT:
        plan = _solve_joint(args, problem, opts)
    else:
        plan = _solve_pipeline(args, opts)
    if args.out is not None:
        save_solved(plan, args.out)
    if args.json:
        print_json(solve_record(plan, args.out))
        return 0
    PRINT[plan.kind](plan)
    if args.out is not None:
        console().print(f"plan written to {esc(args.out)}")
    return 0


def solve_options(args: argparse.Namespace) -> SolveOptions:
    """The search options and the method's own (``--set``, and ``--optimal-perf`` and
    ``--sharding`` for the methods they belong to; joint refuses them in solver.api)."""
    extra = parse_set(args.set)
    pipeline = args.method != api.JOINT
    if args.optimal_perf:
        if pipeline and args.method != "poprt":
            raise MtppError(f"--optimal-perf applies to --method poprt, not {args.method}")
        extra["optimal_perf"] = True
    if args.sharding:
        if pipeline and args.method != "manual":
            raise MtppError(f"--sharding applies to --method manual, not {args.method}")
        extra["sharding"] = args.sharding
    return SolveOptions(
        time_limit=args.time_limit,
        workers=args.workers,
        seed=args.seed,
        gap=args.gap,
        progress=not args.quiet,  # on stderr: with --json, stdout holds only the JSON
        extra=extra,
        training=training_spec(args),
    )


TRAINING_FLAGS = (
    ("--microbatches", "microbatches"),
    ("--virtual-stages", "virtual_stages"),
    ("--optimizer-state", "optimizer_state"),
)


def training_spec(args: argparse.Namespace) -> TrainingSpec | None:
    """The training spec of ``--schedule`` and its options (None: an inference plan); each
    option that does not apply is refused in one line."""
    if args.schedule is None:
        given = next((flag for flag, key in TRAINING_FLAGS if getattr(args, key) is not None), None)
        if given is not None:
            raise MtppError(
                f"{given} applies to training plans; add --schedule gpipe|1f1b|interleaved"
            )
        return None
    if args.method == api.JOINT:  # the joint planner's own refusal, before the model is read
        api.CHECK_JOINT_TRAINING.get()(TrainingSpec(schedule=args.schedule))
    if args.granularity == LAYER:
        raise MtppError("--schedule does not apply with --granularity layer yet; drop one of them")
    if args.virtual_stages is not None and args.schedule != "interleaved":
        raise MtppError(f"--virtual-stages applies to --schedule interleaved, not {args.schedule}")
    default = TrainingSpec()
    return TrainingSpec(
        schedule=args.schedule,
        microbatches=default.microbatches if args.microbatches is None else args.microbatches,
        virtual_stages=default.virtual_stages
        if args.virtual_stages is None
        else args.virtual_stages,
        optimizer_state=(
            default.optimizer_state if args.optimizer_state is None else args.optimizer_state
        ),
    )


LAYER = "layer"  # --granularity layer: cut only between modules


def check_granularity(args: argparse.Namespace) -> None:
    """Refuse, before anything is read, ``--granularity layer`` where there are no modules to
    cut between or the plan is not a pipeline method's search."""
    if args.granularity != LAYER:
        return
    if args.method == api.JOINT:
        raise MtppError("--granularity layer applies to pipeline methods, not --method joint")
    if args.method == "manual":
        raise MtppError(
            "--granularity layer does not apply to --method manual (its sharding points fix "
            "the cuts); drop --granularity"
        )
    if not is_onnx_file(args.graph):
        raise MtppError(
            f"{args.graph}: --granularity layer needs an ONNX model exported from torch (its "
            "nodes name their modules); a JSON graph has no module information"
        )


def _solve_pipeline(args: argparse.Namespace, opts: SolveOptions) -> Plan:
    """A pipeline method on the graph and cluster of the command line (progress shown for the
    methods that report it); with ``--granularity layer`` cutting only between modules."""
    g, cluster = load_graph_and_cluster(args)
    layout = read_layout(args.graph, g) if args.granularity == LAYER else None
    reporting = args.method in registry.PROGRESS_METHODS and not args.quiet
    with SolveProgress(reporting, f"{args.method} {g.name}") as progress:
        opts = replace(opts, reporter=progress)
        if layout is not None:
            plan = solve_layer_granular(g, layout, cluster, args.method, opts)
        else:
            plan = api.solve(api.Problem(graph=g, cluster=cluster), args.method, opts)
    if plan is None:
        raise MtppError(infeasible_message(g, cluster, opts.training))
    return plan


def _solve_joint(args: argparse.Namespace, problem: api.Problem, opts: SolveOptions) -> JointPlan:
    """``--method joint``: pipeline stages on sub-meshes of the cluster, sharded inside."""
    problem = replace(problem, dims=parse_dims(args), memory=memory_arg(args))
    title = f"joint {Path(args.graph).name}"
    with SolveProgress(not args.quiet, title, args.time_limit) as progress:
        return api.solve(problem, api.JOINT, replace(opts, reporter=progress))


def solve_record(plan: Plan | JointPlan, plan_file: str | None) -> dict:
    """The JSON object of mtpp solve: the plan's, with the file it was written to (a pipeline
    plan's assignment is then left to the file)."""
    out = plan.to_dict()
    if plan_file is not None:
        out["plan_file"] = str(plan_file)
        out.pop("assignment", None)
    return out


def print_pipeline_plan(plan: Plan) -> None:
    """A pipeline plan as mtpp solve shows it (poprt: also its sharding points)."""
    print_plan(plan)
    granularity = plan.stats.get(GRANULARITY_KEY)
    if isinstance(granularity, dict):
        console().print(esc(restriction_line(granularity)))
    if plan.method == "poprt":
        console().print(esc(format_sharding(plan.stats.get("sharding_nodes", {}))))


def restriction_line(granularity: dict) -> str:
    """What cutting only between modules costs, from a plan's ``stats["granularity"]``."""
    c = granularity["restriction_cost"]
    return (
        f"layer-granular: {len(granularity['units'])} modules, cuts only between them; the "
        "status and bound above are over such plans. Operator-level: objective "
        f"{fmt(c['operator_objective'])} s ({c['operator_status']}), bound "
        f"{fmt(c['operator_lower_bound'])} s; the restriction costs between "
        f"{fmt(c['at_least'])} s and {fmt(c['at_most'])} s"
    )


def infeasible_message(g, cluster, training: TrainingSpec | None = None) -> str:
    """Why no plan exists: name the memory that does not fit."""
    cap = cluster.capacity
    need = g.param_bytes_total
    text = f"proven: no valid plan of {g.name!r} exists on {cluster.devices} device(s)"
    if training is not None:
        return (
            f"proven: no training plan of {g.name!r} fits the memory of {cluster.devices} "
            f"device(s) with {training.schedule}, m = {training.microbatches} (state x params "
            "+ peak + in-flight x stash per stage); use more devices, fewer microbatches, "
            "another schedule or a smaller --optimizer-state"
        )
    if cap is not None:
        text += (
            f"; the device capacity {format_bytes(cap)} cannot hold the parameters "
            f"({format_bytes(need)} in total) and activations of any split; use more devices "
            "(--devices) or a cluster with more memory"
        )
    return text


def print_joint_plan(plan, con=None) -> None:
    """The joint plan in words and a per-stage table."""
    from rich import box
    from rich.table import Table

    con = con or console()
    con.print(f"[bold]joint plan[/bold]: model {esc(plan.model_name)}, space {esc(plan.space)}")
    print_list_line(con, "cluster " + CONTROL_CHARS.sub("?", plan.cluster.summary()))
    gap = plan.gap
    stride = plan.stats.get("cut_stride", 1)  # a joint training plan over every k-th cut point
    restricted = f", one in every {stride} cut points" if stride != 1 else ""
    status = plan.status + (
        f" (optimal over {plan.space} space{restricted})" if plan.status == OPTIMAL else ""
    )
    con.print(f"status [bold]{status}[/bold]")
    con.print(
        f"objective ({plan.objective_label}) {fmt(plan.objective)} s  lower bound "
        f"{fmt(plan.lower_bound)} "
        f"s  gap {'-' if gap is None else f'{100 * gap:.3g}%'}"
    )
    con.print(f"the bound covers: {esc(plan.bound_space)}")
    con.print(f"universal lower bound (every joint plan) {fmt(plan.universal_bound)} s")
    if plan.training is None:
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
    for line in JOINT_TRAINING_LINES.get()(plan):
        con.print(esc(line))


def save_solved(plan: Plan | JointPlan, path: str) -> None:
    """Write the plan file of a pipeline plan (save_plan) or a joint plan (save_joint_plan)."""
    save = save_plan if plan.kind == Plan.kind else SAVE_JOINT_PLAN.get()
    save(plan, path)


# the printer of each kind of plan mtpp solve makes (Result.kind)
PRINT = {Plan.kind: print_pipeline_plan, api.JOINT: print_joint_plan}


def print_training_simulation(con, ts, cluster, gantt: str | None = None) -> None:
    """A training plan's simulated schedule (:class:`solver.backends.schedule.
    TrainingSimulation`) next to its model: makespan vs T, and per stage the busy fraction,
    the peak in-flight count and memory, simulated vs the model's."""
    from rich import box
    from rich.table import Table

    spec = ts.cost.spec
    v = f", v = {spec.virtual_stages}" if spec.virtual_stages > 1 else ""
    con.print(
        f"[bold]training schedule[/bold]: graph {esc(ts.graph)}, {spec.schedule}, "
        f"m = {spec.microbatches}{v}"
    )
    print_list_line(con, "cluster " + CONTROL_CHARS.sub("?", cluster.summary()))
    ratio = "-" if ts.ratio is None else f"{ts.ratio:.4f}"
    con.print(
        f"makespan {fmt(ts.makespan)} s  model T {fmt(ts.iteration_time)} s  "
        f"makespan / T {ratio}  valid {ts.valid}"
    )
    rel = ts.relation
    if rel.exact is not None:
        con.print(f"proven here: makespan = {fmt(rel.exact)} s (GPipe's formula below)")
    else:
        upper = "" if rel.upper is None else f", <= {fmt(rel.upper)} s"
        con.print(f"proven here: makespan >= {fmt(rel.lower)} s{upper}")
    con.print(esc(rel.rule))
    mems = [s.memory_model for s in ts.stages] + [s.memory_simulated or 0.0 for s in ts.stages]
    bu = ColumnUnit(mems, BYTE_UNITS)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in ("stage", "block", "busy", "in flight\nsimulated", "in flight\nmodel"):
        t.add_column(name, justify="right", no_wrap=True)
    for name in ("memory\nsimulated", "memory\nmodel", "capacity"):
        t.add_column(f"{name}\n{bu.name}", justify="right", no_wrap=True)
    for s in ts.stages:
        t.add_row(
            str(s.stage),
            str(s.block),
            f"{100 * s.busy_fraction:.1f}%",
            f"{s.inflight_simulated:g}",
            f"{s.inflight_model:g}",
            "-" if s.memory_simulated is None else bu.cell(s.memory_simulated),
            bu.cell(s.memory_model),
            "-" if s.capacity is None else bu.cell(s.capacity),
        )
    con.print(t)
    for violation in ts.cost.violations:
        con.print(f"[red]invalid:[/red] {esc(violation)}")
    if gantt is not None:
        con.print(f"Gantt chart written to {esc(gantt)}")
