"""mtpp export: the sharded ONNX model of a plan, optionally verified."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from solver.cli.common import (
    add_graph_options,
    add_json,
    console,
    esc,
    fmt,
    formatter,
    input_paths,
    parse_dims,
    print_json,
)
from solver.core.errors import MtppError
from solver.core.files import check_output_dir
from solver.core.units import format_bytes


def add_parser(sub) -> None:
    """Arguments of ``mtpp export``."""
    p = sub.add_parser(
        "export",
        help="write the sharded ONNX model of a plan (and verify it)",
        description="Write, into a new folder: annotated.onnx (every node carries "
        "__ipu_number, the device its block is placed on, and __pipeline_stage, its stage), "
        "stage{s}.onnx (one model per stage with explicit "
        "boundary tensors; weights kept in external data are copied, holes skipped, into "
        "stage{s}.onnx.data, which annotated.onnx references too), sharding.yaml (PopRT-style "
        "manual sharding that --method manual reads back), stages.json (with the memory "
        "estimate). The folder appears whole or not at all. An existing "
        "empty folder is filled; a non-empty one is replaced only with --force.",
        epilog="examples:\n  mtpp export model.onnx plan.json --out sharded/ --verify\n"
        "  mtpp export model.onnx --plan joint.json --out stages/ --verify\n\n"
        "A joint plan (mtpp solve --method joint) is written as one folder per stage, "
        "stage_{s}/ with annotated.onnx (the stage's sub-model, strategies in metadata_props), "
        "strategies.yaml and plan.json (its sharded program, as mtpp shard --out writes them), "
        "plus plan.json, manifest.json and README.txt; --verify runs the stages one after the "
        "other, each on its emulated devices, and compares every stage's outputs and the "
        "model's with onnxruntime on the whole model (exit 1 naming the first stage and tensor "
        "beyond --tolerance, by default 1e-4 x max(1, max |reference|) for float32/float64, "
        "1e-2 x max(1, max |reference|) for float16/bfloat16, exact for integers and bools).",
        formatter_class=formatter,
    )
    p.add_argument(
        "graph",
        metavar="MODEL.onnx",
        help="the ONNX model the plan was made for (a joint plan may be given alone: it names "
        "its model)",
    )
    p.add_argument(
        "plan",
        metavar="PLAN",
        nargs="?",
        help="the plan, whatever its file name: a pipeline or a joint plan (mtpp solve --out), "
        "or a manual-sharding YAML",
    )
    p.add_argument(
        "--plan", dest="plan_option", metavar="PLAN", help="the plan, as an option instead"
    )
    p.add_argument(
        "--out",
        "-o",
        required=True,
        metavar="DIR",
        help="output folder: new, or empty (a non-empty folder needs --force)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing non-empty output folder (only once the new one is complete); "
        "never the current folder, its parents, or a folder holding an input",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="run the original and the chained stages in onnxruntime on seeded random inputs; "
        "exit 1 if an output differs in shape or dtype, has NaN, or differs by more than "
        "--tolerance. It needs about the model's weights plus activations in memory (the "
        "estimate is printed); when that exceeds the memory available now it refuses, naming "
        "both, unless --verify-memory-ok",
    )
    p.add_argument(
        "--verify-memory-ok",
        action="store_true",
        help="with --verify: run the check even when its memory estimate exceeds the memory "
        "available (the export itself never reads the weights into memory)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="TOL",
        help="largest absolute difference allowed on every output (default: by the output's "
        "type: 1e-4 for float32/float64, 1e-2 for float16/bfloat16, where stage and full "
        "sessions fuse ops differently, exact for integers and bools); the tolerance used "
        "for each output is in the report",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    add_graph_options(p)
    add_json(p)


def cmd_export(args: argparse.Namespace) -> int:
    from solver.backends.export import export_plan
    from solver.cli.plan_files import JOINT, command_plan, load_pipeline_plan, peek_plan_file

    if args.plan is not None and args.plan_option is not None and args.plan != args.plan_option:
        raise MtppError("give the plan once: as PLAN or as --plan, not both")
    args.plan = args.plan or args.plan_option
    if args.plan is None and peek_plan_file(args.graph) is None:
        raise MtppError("name the plan: mtpp export MODEL.onnx PLAN --out DIR")
    if args.plan is not None and Path(args.graph).suffix.lower() != ".onnx":
        raise MtppError(f"{args.graph}: export needs the ONNX model (.onnx) the plan was made for")
    plan = command_plan(args, "export")  # a joint plan may come alone: it names its model
    if plan.kind == JOINT:
        return cmd_export_joint(args, plan)
    check_output_dir(args.out, input_paths(args), force=args.force, what="export")
    check_verify_options(args)
    p = load_pipeline_plan(args, plan)
    report = export_plan(
        args.graph,
        p.graph,
        p.assignment,
        args.out,
        dims=parse_dims(args),
        stage=p.data.get("stages"),  # the stages a manual-sharding YAML states
        verify=args.verify,
        tolerance=args.tolerance,
        seed=args.seed,
        force=args.force,
        inputs=[args.plan],
        verify_memory_ok=args.verify_memory_ok,
        placement=p.placement,  # None: block b on device b
    )
    ok = report.get("verify", {}).get("ok", True)
    if args.json:
        report["out"] = args.out
        print_json(report)
        return 0 if ok else 1
    con = console()
    con.print(
        f"wrote {esc(args.out)}: annotated.onnx, "
        + ", ".join(st["file"] for st in report["stages"] if st["file"])
        + ", sharding.yaml, stages.json"
    )
    if report["data_files"]:
        con.print(
            "external weights copied into "
            + ", ".join(report["data_files"])
            + f": {format_bytes(report['weight_bytes_copied'])} of data (holes skipped)"
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
            f"verify: max abs diff {fmt(v['max_abs_diff'])} ({tolerance_text(v)}) {status}"
            f"; needed about {format_bytes(v['memory_estimate'])} of memory (estimate)"
        )
        for problem in v["problems"]:
            con.print(f"  [red]{esc(problem)}[/red]")
        for name in v["over_tolerance"]:
            con.print(
                f"  [red]{esc(name)}: max abs diff {fmt(v['per_output'][name])} exceeds its "
                f"tolerance {v['tolerance_per_output'][name]:g}[/red]"
            )
    return 0 if ok else 1


def tolerance_text(v: dict) -> str:
    """The tolerance of a verify report in a few words: the one given, or the defaults used."""
    from collections import Counter

    if v["tolerance"] is not None:
        return f"tolerance {v['tolerance']:g}"
    used = sorted(Counter(v["tolerance_per_output"].values()).items(), reverse=True)
    words = [(f"{t:g}" if t else "exact", n) for t, n in used]
    if len(words) == 1:
        return f"tolerance {words[0][0]}, the default for the output type"
    return "default tolerance by output type: " + ", ".join(
        f"{w} for {n} output{'s' if n > 1 else ''}" for w, n in words
    )


def check_verify_options(args: argparse.Namespace) -> None:
    """Refuse --tolerance, --seed and --verify-memory-ok values that make no sense."""
    if args.tolerance is not None and not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise MtppError(f"--tolerance must be a finite number >= 0, got {args.tolerance}")
    if args.seed < 0:
        raise MtppError(f"--seed must be >= 0, got {args.seed}")
    if args.verify_memory_ok and not args.verify:
        raise MtppError("--verify-memory-ok only applies with --verify; add --verify or drop it")


# ---------------------------------------------------------------------- joint plans
def cmd_export_joint(args: argparse.Namespace, plan_file) -> int:
    """One folder per stage (solver.backends.export_joint), optionally verified through the chain;
    ``plan_file`` is the joint plan's :class:`solver.cli.plan_files.PlanFile`."""
    import sys

    from solver.backends.export_joint import export_joint
    from solver.cli.plan_files import load_joint, refuse_pipeline_options

    refuse_pipeline_options(args, {"--work": "roofline"})
    check_verify_options(args)
    check_output_dir(args.out, input_paths(args), force=args.force, what="export")
    plan, _ = load_joint(args, plan_file)
    report = export_joint(
        plan,
        args.graph,
        args.out,
        plan_path=args.plan,
        dims=parse_dims(args),
        verify=args.verify,
        tolerance=args.tolerance,
        seed=args.seed,
        force=args.force,
        inputs=input_paths(args),
        verify_memory_ok=args.verify_memory_ok,
    )
    v = report.get("verify")
    ok = v is None or v["ok"]
    if v is not None and not ok:
        print(f"mtpp: verify failed: {v['failure'] or 'a model output differs'}", file=sys.stderr)
    if args.json:
        report["out"] = args.out
        print_json(report)
        return 0 if ok else 1
    con = console()
    con.print(
        f"wrote {esc(args.out)}: "
        + ", ".join(st["folder"] + "/" for st in report["stages"])
        + ", plan.json, manifest.json, README.txt"
    )
    for st in report["stages"]:
        coll = ", ".join(f"{k} x{n}" for k, n in st["collectives"].items()) or "no collectives"
        con.print(
            f"  stage {st['stage']}: devices {st['devices']}, {st['ops']} operators, "
            f"{len(st['inputs'])} inputs, {len(st['outputs'])} outputs, {coll}"
        )
    if v is not None:
        status = "[green]OK[/green]" if ok else "[red]MISMATCH[/red]"
        con.print(
            f"verify (seed {v['seed']}): {status}; needed about "
            f"{format_bytes(v['memory_estimate'])} of memory (estimate)"
        )
        for name, c in v["outputs"].items():
            con.print(
                f"  {esc(name)}: max abs diff {fmt(c['max_abs_diff'])}, max rel diff "
                f"{fmt(c['max_rel_diff'])} (tolerance {c['tolerance']:.3g})"
            )
    return 0 if ok else 1
