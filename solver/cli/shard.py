"""mtpp shard: operator-level (SPMD) sharding of an ONNX model: sharding propagation, the obvious
patterns (data parallel, Megatron), or the exact CP-SAT optimum with a certified bound."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from solver.cli.common import (
    add_json,
    console,
    esc,
    formatter,
    input_paths,
    parse_dims,
    print_json,
)
from solver.core.errors import MtppError

EPILOG = """\
methods:
  propagate  sharding propagation (MindSpore, seed 002) from the configured operators (default)
  dp         data parallel: every operator splits its batch dim over all devices when it can
  megatron   Megatron-LM: weight MatMuls alternate column and row splits, then propagation
  cpsat      exact: every strategy of every operator under --memory; a Lagrangian relaxation
             of the memory limit solved exactly (variable elimination) bounds it and, with the
             three above, warm-starts CP-SAT; OPTIMAL only with a proof, else FEASIBLE + gap

examples:
  mtpp shard ffn.onnx --devices 8 --config ffn.yaml   # "dense1.matmul: [[2, 1], [1, 4]]"
  mtpp shard model.onnx --devices 8 --method cpsat --memory 1GB --time-limit 60
  mtpp shard model.onnx --devices 8 --mesh 2x4 --verify --json
  mtpp shard model.onnx --devices 8 --config s.yaml --out plan/
      (writes strategies.yaml, plan.json, annotated.onnx)

A strategy gives, for every data input of a node (weights included, shape inputs excluded), how
many slices each dimension is cut into; devices a strategy leaves unused replicate.
"""


def add_parser(sub) -> None:
    """Arguments of ``mtpp shard``."""
    p = sub.add_parser(
        "shard",
        help="split single operators across devices (SPMD): propagation, patterns or exact",
        description="Operator-level sharding: choose a sharding strategy per operator "
        "(propagation of configured strategies, data parallel, Megatron, or the exact CP-SAT "
        "optimum under a memory limit), price every redistribution with ring collectives, and "
        "optionally run the sharded program on emulated devices to prove it computes what the "
        "model computes.",
        epilog=EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX model")
    p.add_argument("--devices", "-k", type=int, metavar="N", help="number of devices")
    p.add_argument("--mesh", metavar="AxB", help="logical device mesh, e.g. 2x4 (default: [N])")
    p.add_argument("--config", metavar="FILE", help="YAML of 'node name: [[2, 1], [1, 4]]'")
    p.add_argument(
        "--method",
        choices=["propagate", "dp", "megatron", "cpsat"],
        default="propagate",
        help="how strategies are chosen (see methods below; default propagate)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds for --method cpsat (default 60)",
    )
    p.add_argument("--workers", type=int, default=0, help="CP-SAT workers (default: all cores)")
    p.add_argument(
        "--cluster", metavar="PRESET|FILE", help="cluster preset or YAML (compute, link)"
    )
    p.add_argument("--memory", metavar="SIZE", help="memory per device, e.g. 16GiB")
    p.add_argument(
        "--dim", action="append", default=[], metavar="NAME=VALUE", help="fix a dynamic dim"
    )
    p.add_argument("--out", metavar="DIR", help="write strategies.yaml, plan.json, annotated.onnx")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    p.add_argument("--verify", action="store_true", help="run the sharded program and compare")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of --verify's inputs and of CP-SAT (default 0)"
    )
    add_json(p)


def cmd_shard(args: argparse.Namespace) -> int:
    from solver.backends.export_spmd import write_out
    from solver.cli.progress import SolveProgress
    from solver.core.files import check_output_dir
    from solver.spmd.report import plan_dict
    from solver.spmd.solve import check_options, solve_sharding

    if Path(args.model).suffix.lower() != ".onnx":
        raise MtppError(f"{args.model}: mtpp shard needs an ONNX model (.onnx)")
    check_options(args.time_limit, args.workers, args.seed)
    if args.out is not None:
        check_output_dir(args.out, input_paths(args), force=args.force, what="--out")
    show = args.method == "cpsat" and not args.json
    with SolveProgress(show, f"shard {Path(args.model).name}") as progress:
        res = solve_sharding(
            args.model,
            devices=args.devices,
            mesh=args.mesh,
            method=args.method,
            memory=args.memory,
            config=args.config,
            time_limit=args.time_limit,
            cluster=args.cluster,
            dims=parse_dims(args),
            workers=args.workers,
            seed=args.seed,
            progress=progress if show else None,
        )
    planner, program = res.planner, res.program
    plan = plan_dict(planner, program, args.method, res.status)
    plan["cluster"] = planner.cluster.to_dict()
    plan["configured"] = sorted(res.configured)
    plan["memory_limit"] = res.memory_limit
    plan["lower_bound"] = res.lower_bound
    plan["gap"] = res.gap
    plan["wall_seconds"] = res.wall_seconds
    plan["stats"] = res.stats
    warnings = []
    if planner.replicated_ops:
        warnings.append(
            "no sharding rule for " + ", ".join(planner.replicated_ops) + "; they run replicated"
        )
    plan["warnings"] = warnings
    ok = True
    if args.verify:
        from solver.backends.verify import verify

        plan["verify"] = verify(planner, program, seed=args.seed)
        ok = plan["verify"]["ok"]
    if args.out is not None:
        write_out(args.out, planner.sm, res.strategies, plan)
        plan["out"] = args.out
    for w in warnings:
        print(f"mtpp: warning: {w}", file=sys.stderr)
    if args.json:
        print_json(plan)
        return 0 if ok else 1
    con = console()
    con.print(human_table(program, plan))
    for line in totals_lines(plan):
        con.print(esc(line))
    if res.lower_bound is not None:
        from solver.core.units import format_time

        con.print(
            f"lower bound {format_time(res.lower_bound)} (every plan), gap "
            f"{100 * (res.gap or 0.0):.3g}%, {res.wall_seconds:.2f} s"
        )
    if args.verify:
        v = plan["verify"]
        con.print(f"verify: {'ok' if v['ok'] else 'FAILED'}, max abs diff {v['max_abs_diff']}")
        if not v["ok"]:
            con.print(f"  [red]{esc(v.get('error') or 'an output differs')}[/red]")
    if args.out is not None:
        con.print(f"wrote {esc(args.out)}: strategies.yaml, plan.json, annotated.onnx")
    return 0 if ok else 1


def human_table(program, plan: dict):
    """A rich table of a sharding result: one row per operator."""
    from rich.table import Table

    from solver.core.units import format_time
    from solver.spmd.program import fmt_strategy

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
    from solver.core.units import format_bytes, format_time

    return [
        f"status {plan['status']}, objective {format_time(plan['objective'])} "
        f"(compute {format_time(plan['compute_time'])}, "
        f"communication {format_time(plan['communication_time'])})",
        "collectives: "
        + (", ".join(f"{k} x{v}" for k, v in plan["collectives"].items()) or "none")
        + f", {format_bytes(plan['comm_bytes_per_device'])} sent per device",
        f"memory per device: {format_bytes(plan['max_memory_per_device'])} "
        f"(weights {format_bytes(plan['weight_memory_per_device'])}, activation peak "
        f"{format_bytes(plan['peak_activation_memory_per_device'])})",
    ]
