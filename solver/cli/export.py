"""mtpp export: the sharded ONNX model of a plan, optionally verified; or, with ``--format``,
the stages of a layer-granular plan in a PyTorch framework's form."""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

from solver.backends.export import export_plan
from solver.backends.export_joint import export_joint
from solver.backends.frameworks import export_framework
from solver.cli.common import console, fmt, input_paths, parse_dims, print_json
from solver.cli.plan_files import (
    JOINT,
    command_plan,
    load_joint,
    load_pipeline_plan,
    refuse_pipeline_options,
)
from solver.core.errors import MtppError
from solver.core.files import check_output_dir
from solver.core.text import esc
from solver.core.units import format_bytes


def cmd_export(args: argparse.Namespace) -> int:
    """Write the sharded ONNX model of a pipeline plan (a joint plan: one folder per stage)."""
    if args.plan is not None and args.plan_option is not None and args.plan != args.plan_option:
        raise MtppError("give the plan once: as PLAN or as --plan, not both")
    args.plan = args.plan or args.plan_option
    if args.plan is not None and Path(args.graph).suffix.lower() != ".onnx":
        raise MtppError(f"{args.graph}: export needs the ONNX model (.onnx) the plan was made for")
    # a joint plan may come alone: it names its model
    plan = command_plan(args, "export", "name the plan: mtpp export MODEL.onnx PLAN --out DIR")
    if args.format != ONNX:
        return cmd_export_framework(args, plan)
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
    else:
        print_export(console(), args.out, report, ok)
    return 0 if ok else 1


def print_export(con, out: str, report: dict, ok: bool) -> None:
    """What a pipeline export wrote (files, external weights, stages) and its verification."""
    con.print(
        f"wrote {esc(out)}: annotated.onnx, "
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


def tolerance_text(v: dict) -> str:
    """The tolerance of a verify report in a few words: the one given, or the defaults used."""
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


# ---------------------------------------------------------------------- framework forms
ONNX = "onnx"  # --format of the stage models; the others are solver.backends.frameworks.FORMATS
# options of the ONNX export's check, refused with a framework format (given a non-default value)
VERIFY_OPTIONS = {"--verify": False, "--verify-memory-ok": False, "--tolerance": None, "--seed": 0}


def cmd_export_framework(args: argparse.Namespace, plan_file) -> int:
    """``--format torch|torchtitan|megatron|deepspeed|vllm``: the stages of a plan that cuts
    only between modules, as that framework takes them, with a README.md showing the call."""
    check_framework_request(args, plan_file)
    check_output_dir(args.out, input_paths(args), force=args.force, what="export")
    p = load_pipeline_plan(args, plan_file)
    rep = export_framework(
        args.format, args.graph, p.graph, p.assignment, args.out, args.plan, args.force
    )
    if args.json:
        print_json({"format": rep.format, "out": str(rep.out_dir), "files": list(rep.files)})
    else:
        console().print(f"wrote {esc(str(rep.out_dir))}: {', '.join(rep.files)}")
    return 0


def check_framework_request(args: argparse.Namespace, plan_file) -> None:
    """Refuse what a framework form cannot take: a joint plan, and the ONNX export's check."""
    if plan_file.kind == JOINT:
        raise MtppError(
            f"{plan_file.path}: --format {args.format} takes a pipeline plan that cuts only "
            "between modules (mtpp solve MODEL --granularity layer --out PLAN), not a joint "
            "plan; export a joint plan with --format onnx"
        )
    for option, default in VERIFY_OPTIONS.items():
        if getattr(args, option.lstrip("-").replace("-", "_")) != default:
            raise MtppError(
                f"{option} applies to --format onnx (it runs the stage models), not --format "
                f"{args.format}; drop {option}"
            )


# ---------------------------------------------------------------------- joint plans
def cmd_export_joint(args: argparse.Namespace, plan_file) -> int:
    """One folder per stage (solver.backends.export_joint), optionally verified through the chain;
    ``plan_file`` is the joint plan's :class:`solver.cli.plan_files.PlanFile`."""

    refuse_pipeline_options(args, {"--work": "roofline"})
    check_verify_options(args)
    check_output_dir(args.out, input_paths(args), force=args.force, what="export")
    plan = load_joint(args, plan_file).plan
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
