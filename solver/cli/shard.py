"""mtpp shard: operator-level (SPMD) sharding of an ONNX model by sharding propagation."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from solver.cli.common import add_json, console, esc, formatter, parse_dims, print_json
from solver.errors import MtppError

EPILOG = """\
examples:
  mtpp shard ffn.onnx --devices 8 --config ffn.yaml   # "dense1.matmul: [[2, 1], [1, 4]]"
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
        help="split single operators across devices (SPMD) by sharding propagation",
        description="Operator-level sharding: propagate configured sharding strategies over the "
        "model (MindSpore's sharding propagation), price every redistribution with ring "
        "collectives, and optionally run the sharded program on emulated devices to prove it "
        "computes what the model computes.",
        epilog=EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX model")
    p.add_argument("--devices", "-k", type=int, metavar="N", help="number of devices")
    p.add_argument("--mesh", metavar="AxB", help="logical device mesh, e.g. 2x4 (default: [N])")
    p.add_argument("--config", metavar="FILE", help="YAML of 'node name: [[2, 1], [1, 4]]'")
    p.add_argument("--method", choices=["propagate"], default="propagate", help="(default)")
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
    p.add_argument("--seed", type=int, default=0, help="seed of --verify's inputs (default 0)")
    add_json(p)


def cmd_shard(args: argparse.Namespace) -> int:
    from solver.cluster import load_cluster
    from solver.files import check_output_dir
    from solver.plan import FEASIBLE, INVALID
    from solver.sharding.config import from_attributes, read_config
    from solver.sharding.mesh import make_mesh, parse_mesh
    from solver.sharding.model import load_model
    from solver.sharding.program import Planner, evaluate
    from solver.sharding.propagate import propagate
    from solver.sharding.report import human_table, plan_dict, write_out
    from solver.units import parse_quantity

    if Path(args.model).suffix.lower() != ".onnx":
        raise MtppError(f"{args.model}: mtpp shard needs an ONNX model (.onnx)")
    if args.seed < 0:
        raise MtppError(f"--seed must be >= 0, got {args.seed}")
    inputs = [args.model] + ([args.config] if args.config else [])
    if args.out:
        check_output_dir(args.out, inputs, force=args.force, what="shard")
    cluster = load_cluster(args.cluster, args.devices)
    shape = parse_mesh(args.mesh, cluster.devices)
    mesh = make_mesh(shape, cluster)
    limit = cluster.capacity
    if args.memory is not None:
        limit = parse_quantity(args.memory, "bytes", "--memory")
    sm = load_model(args.model, parse_dims(args))
    planner = Planner(sm, mesh, cluster)
    configured = from_attributes(sm)
    if args.config:
        configured.update(read_config(args.config, sm))
    for name, strategy in configured.items():
        op = sm.op_by_name(name)
        try:
            planner.sharding(op.index, strategy)
        except MtppError as e:
            where = args.config if args.config else args.model
            raise MtppError(f"{where}: {e}") from None
    strategies = propagate(planner, configured)
    program = evaluate(planner, strategies)
    fits = limit is None or not math.isfinite(limit) or program.memory_per_device <= limit
    status = FEASIBLE if fits else INVALID
    plan = plan_dict(planner, program, args.method, status)
    plan["cluster"] = cluster.to_dict()
    plan["configured"] = sorted(configured)
    plan["memory_limit"] = None if limit is None or not math.isfinite(limit) else limit
    warnings = []
    if planner.replicated_ops:
        warnings.append(
            "no sharding rule for " + ", ".join(planner.replicated_ops) + "; they run replicated"
        )
    if not fits:
        warnings.append("the plan needs more memory per device than the limit")
    plan["warnings"] = warnings
    ok = True
    if args.verify:
        from solver.sharding.execute import verify

        plan["verify"] = verify(planner, program, seed=args.seed)
        ok = plan["verify"]["ok"]
    if args.out:
        write_out(args.out, sm, strategies, plan, args.force)
        plan["out"] = args.out
    for w in warnings:
        print(f"mtpp: warning: {w}", file=sys.stderr)
    if args.json:
        print_json(plan)
        return 0 if ok else 1
    con = console()
    table, totals = human_table(planner, program, plan)
    con.print(table)
    for line in totals:
        con.print(esc(line))
    if args.verify:
        v = plan["verify"]
        con.print(f"verify: {'ok' if v['ok'] else 'FAILED'}, max abs diff {v['max_abs_diff']}")
    if args.out:
        con.print(f"wrote {esc(args.out)}: strategies.yaml, plan.json, annotated.onnx")
    return 0 if ok else 1
