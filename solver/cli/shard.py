"""mtpp shard: operator-level (SPMD) sharding of an ONNX model: sharding propagation, the obvious
patterns (data parallel, Megatron), or the exact CP-SAT optimum with a certified bound."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from solver.backends.export_spmd import write_out
from solver.backends.spmd_execute import verify_backward
from solver.backends.verify import verify
from solver.cli.common import console, input_paths, parse_dims, print_json
from solver.cli.progress import SolveProgress
from solver.core.errors import MtppError
from solver.core.files import check_output_dir
from solver.core.options import check_spmd_options
from solver.core.text import esc
from solver.core.units import format_bytes, format_time
from solver.frontends import is_onnx_file
from solver.spmd.plan import ShardResult
from solver.spmd.solve import solve_sharding
from solver.spmd.strategy import fmt_strategy
from solver.spmd.training import TrainingSpec


def cmd_shard(args: argparse.Namespace) -> int:
    """Choose a sharding strategy per operator, optionally run it (--verify), write it (--out)."""
    if not is_onnx_file(args.model):
        raise MtppError(f"{args.model}: mtpp shard needs an ONNX model (.onnx)")
    check_spmd_options(args.time_limit, args.workers, args.seed)
    training = _training_spec(args)
    if args.out is not None:
        check_output_dir(args.out, input_paths(args), force=args.force, what="--out")
    res = _solve(args, training)
    plan = res.to_dict()
    plan["warnings"] = _replicated_warning(res.planner)
    if args.verify:
        plan["verify"] = verify(res.planner, res.program, seed=args.seed)
        if training is not None:
            plan["verify_backward"] = verify_backward(res.planner, res.program, seed=args.seed)
    if args.out is not None:
        write_out(args.out, res.planner.sm, res.strategies, plan)
        plan["out"] = args.out
    for w in plan["warnings"]:
        print(f"mtpp: warning: {w}", file=sys.stderr)
    if args.json:
        print_json(plan)
    else:
        print_shard(console(), res, plan)
    ok = plan["verify"]["ok"] if args.verify else True
    if "verify_backward" in plan:
        ok = ok and plan["verify_backward"]["ok"]
    return 0 if ok else 1


def _training_spec(args: argparse.Namespace) -> TrainingSpec | None:
    """--training (with --optimizer-state), or None for an inference plan."""
    if not args.training:
        if args.optimizer_state is not None:
            raise MtppError("--optimizer-state needs --training")
        return None
    if args.optimizer_state is None:
        return TrainingSpec()
    return TrainingSpec(args.optimizer_state)


def _solve(args: argparse.Namespace, training: TrainingSpec | None) -> ShardResult:
    """The sharding search, its progress on stderr for --method cpsat (not with --json)."""
    show = args.method == "cpsat" and not args.json
    with SolveProgress(show, f"shard {Path(args.model).name}") as progress:
        return solve_sharding(
            args.model,
            devices=args.devices,
            mesh=args.mesh,
            method=args.method,
            memory=args.memory,
            config=args.config,
            time_limit=args.time_limit,
            cluster=args.cluster,
            dims=parse_dims(args),
            weights=args.verify or args.out is not None,  # planning alone reads no big weights
            workers=args.workers,
            seed=args.seed,
            progress=progress if show else None,
            training=training,
        )


def _replicated_warning(planner) -> list[str]:
    """The operators no sharding rule covers (they run replicated), as a warning."""
    if not planner.replicated_ops:
        return []
    ops = ", ".join(planner.replicated_ops)
    return [f"no sharding rule for {ops}; they run replicated"]


def print_shard(con, res: ShardResult, plan: dict) -> None:
    """The sharding result: the table, its totals, the bound, the verification, the files."""
    con.print(human_table(res.program, plan))
    for line in totals_lines(plan):
        con.print(esc(line))
    if res.lower_bound is not None:
        con.print(
            f"lower bound {format_time(res.lower_bound)} (every plan), gap "
            f"{100 * (res.gap or 0.0):.3g}%, {res.wall_seconds:.2f} s"
        )
    if "verify" in plan:
        v = plan["verify"]
        con.print(f"verify: {'ok' if v['ok'] else 'FAILED'}, max abs diff {v['max_abs_diff']}")
        if not v["ok"]:
            con.print(f"  [red]{esc(v.get('error') or 'an output differs')}[/red]")
    if "verify_backward" in plan:
        v = plan["verify_backward"]
        con.print(
            f"verify backward: {'ok' if v['ok'] else 'FAILED'}, {v['weights']} weight gradients "
            f"against numerical ones, max relative error {v['max_rel_error']:.3g}"
        )
        if not v["ok"]:
            con.print(f"  [red]{esc(v.get('error') or 'a gradient differs')}[/red]")
    if "out" in plan:
        con.print(f"wrote {esc(plan['out'])}: strategies.yaml, plan.json, annotated.onnx")


def human_table(program, plan: dict):
    """A rich table of a sharding result: one row per operator."""
    from rich.table import Table

    t = Table(title=f"mtpp shard: {esc(plan['model'])} on mesh {plan['mesh']['shape']}")
    for col in ("node", "op", "strategy", "local out shape", "compute", "communication"):
        t.add_column(
            col,
            justify="right" if col in ("compute", "communication") else "left",
            no_wrap=col == "strategy",  # a strategy is read whole (and searched for by tests)
        )
    for row, sh in zip(plan["operators"], program.shardings, strict=True):
        t.add_row(
            esc(row["name"]),
            row["op_type"],
            fmt_strategy(sh.strategy),
            " ".join("x".join(map(str, s)) or "()" for s in row["local_shape"]),
            format_time(row["compute"]),
            format_time(row["communication"]) if row["communication"] else "-",
        )
    return t


def totals_lines(plan: dict) -> list[str]:
    """The totals under the table: status and objective, collectives, memory per device."""
    return [
        f"status {plan['status']}, objective {format_time(plan['objective'])} "
        f"(compute {format_time(plan['compute_time'])}, "
        f"communication {format_time(plan['communication_time'])})",
        "collectives: "
        + (", ".join(f"{k} x{v}" for k, v in plan["collectives"].items()) or "none")
        + f", {format_bytes(plan['comm_bytes_per_device'])} sent per device",
        f"memory per device: {format_bytes(plan['max_memory_per_device'])} "
        f"(weights {format_bytes(plan['weight_memory_per_device'])}"
        + (" with gradients and optimizer state" if "training" in plan else "")
        + f", activation peak {format_bytes(plan['peak_activation_memory_per_device'])})",
        *training_lines(plan),
    ]


def training_lines(plan: dict) -> list[str]:
    """The training terms under the totals (none for an inference plan)."""
    if "training" not in plan:
        return []
    tr = plan["training"]
    mode = {s["weight"]: s["mode"] for s in tr["gradient_sync"]}
    modes = list(mode.values())
    return [
        f"training: forward {format_time(tr['forward_time'])}, backward compute "
        f"{format_time(tr['backward_compute_time'])}, backward communication "
        f"{format_time(tr['backward_communication_time'])}, gradient sync "
        f"{format_time(tr['gradient_sync_time'])}",
        f"gradient sync: {modes.count('allreduce')} AllReduce, {modes.count('zero1')} ZeRO-1 "
        f"(optimizer state sharded), {tr['trainable_weights'] - len(mode)} weights need none; "
        f"optimizer state factor {tr['optimizer_state']:g}",
    ]
