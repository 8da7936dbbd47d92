"""mtpp export: the sharded ONNX model of a plan, optionally verified; or, with ``--format``,
the stages of a layer-granular plan in a PyTorch framework's form.

One path for every kind: the options are checked, the plan file is read and loaded
(:func:`solver.cli.plan_files.load_plan`), :func:`solver.backends.dispatch.export` writes it
by its kind, and the report it returns is printed. Exit 1 when ``--verify`` finds a stage
output that differs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter

from solver.backends import dispatch
from solver.backends.dispatch import ONNX, ExportOptions
from solver.backends.frameworks import DTENSOR, export_dtensor, export_joint_frameworks
from solver.cli.common import console, fmt, input_paths, parse_dims, print_json
from solver.cli.plan_files import JOINT, NOT_FOR_JOINT, command_plan, load_plan, refuse_for_kind
from solver.core.errors import MtppError
from solver.core.files import check_output_dir, parse_json, read_text
from solver.core.text import esc
from solver.core.units import format_bytes
from solver.frontends import is_onnx_file
from solver.frontends.onnx.reader import load_onnx
from solver.joint.plan import JOINT_FORMAT


def cmd_export(args: argparse.Namespace) -> int:
    """Write a plan's stages: ONNX stage models (a joint plan: one folder per stage), or with
    ``--format`` a framework's form."""
    if args.plan is not None and args.plan_option is not None and args.plan != args.plan_option:
        raise MtppError("give the plan once: as PLAN or as --plan, not both")
    args.plan = args.plan or args.plan_option
    if args.plan is not None and not is_onnx_file(args.graph):
        raise MtppError(f"{args.graph}: export needs the ONNX model (.onnx) the plan was made for")
    if args.format == DTENSOR:
        return cmd_export_dtensor(args)
    # a joint plan may come alone: it names its model
    plan_file = command_plan(args, "export", "name the plan: mtpp export MODEL.onnx PLAN --out DIR")
    if args.format != ONNX:
        check_framework_request(args, plan_file)
    else:
        refuse_for_kind(args, plan_file, NOT_FOR_JOINT)
    check_output_dir(args.out, input_paths(args), force=args.force, what="export")
    if args.format == ONNX:
        check_verify_options(args)
    loaded = load_plan(args, plan_file)
    options = ExportOptions(
        args.out,
        dims=parse_dims(args),
        verify=args.verify,
        tolerance=args.tolerance,
        seed=args.seed,
        force=args.force,
        inputs=tuple(input_paths(args)),
        verify_memory_ok=args.verify_memory_ok,
        format=args.format,
    )
    record = dispatch.export(loaded, options)
    ok = record.report.get("verify", {}).get("ok", True)
    if args.format != ONNX:
        print_framework_export(record.report, args.json)
    else:
        PRINTERS[record.kind](args, record.report, ok)
    return 0 if ok else 1


def print_framework_export(report: dict, as_json: bool) -> None:
    """What a framework export wrote."""
    if as_json:
        print_json(report)
    else:
        console().print(f"wrote {esc(report['out'])}: {', '.join(report['files'])}")


def print_pipeline_export(args: argparse.Namespace, report: dict, ok: bool) -> None:
    """A pipeline export's report: as JSON, or in words (:func:`print_export`)."""
    if args.json:
        print_json({**report, "out": args.out})
    else:
        print_export(console(), args.out, report, ok)


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
# options of the ONNX export's check, refused with a framework format (given a non-default value)
VERIFY_OPTIONS = {"--verify": False, "--verify-memory-ok": False, "--tolerance": None, "--seed": 0}


def cmd_export_dtensor(args: argparse.Namespace) -> int:
    """``--format dtensor``: an operator-sharding plan's parallelize_plan, or a joint plan's
    layout with both forms (solver.backends.frameworks)."""
    refuse_verify_options(args)
    if args.plan is None:
        raise MtppError("name the plan: mtpp export MODEL.onnx PLAN --format dtensor --out DIR")
    data = parse_json(read_text(args.plan, "plan file"), args.plan)
    check_output_dir(args.out, input_paths(args), force=args.force, what="export")
    if isinstance(data, dict) and data.get("format") == JOINT_FORMAT:
        g = load_onnx(args.graph, dims=parse_dims(args))
        rep = export_joint_frameworks(args.graph, g, data, args.out, args.plan, args.force)
    else:
        rep = export_dtensor(args.graph, data, args.out, args.plan, args.force)
    report = {"format": rep.format, "out": str(rep.out_dir), "files": list(rep.files)}
    print_framework_export(report, args.json)
    return 0


def refuse_verify_options(args: argparse.Namespace) -> None:
    """The ONNX export's check options, refused with a framework format."""
    for option, default in VERIFY_OPTIONS.items():
        if getattr(args, option.lstrip("-").replace("-", "_")) != default:
            raise MtppError(
                f"{option} applies to --format onnx (it runs the stage models), not --format "
                f"{args.format}; drop {option}"
            )


def check_framework_request(args: argparse.Namespace, plan_file) -> None:
    """Refuse what a framework form cannot take: a joint plan, and the ONNX export's check."""
    if plan_file.kind == JOINT:
        raise MtppError(
            f"{plan_file.path}: --format {args.format} takes a pipeline plan that cuts only "
            "between modules (mtpp solve MODEL --granularity layer --out PLAN), not a joint "
            "plan; export a joint plan with --format onnx or dtensor"
        )
    refuse_verify_options(args)


# ---------------------------------------------------------------------- joint plans
def print_joint_export(args: argparse.Namespace, report: dict, ok: bool) -> None:
    """What a joint export wrote (one folder per stage) and its verification through the
    chain, as JSON or in words; a failed verification is named on stderr first."""
    v = report.get("verify")
    if v is not None and not ok:
        print(f"mtpp: verify failed: {v['failure'] or 'a model output differs'}", file=sys.stderr)
    if args.json:
        print_json({**report, "out": args.out})
        return
    con = console()
    con.print(
        f"wrote {esc(args.out)}: "
        + ", ".join(st["folder"] + "/" for st in report["stages"])
        + ", plan.json, manifest.json, README.txt"
    )
    tr = report.get("training")
    if tr is not None:
        con.print(
            f"a training plan ({esc(tr['schedule'])}, m = {tr['microbatches']}, T "
            f"{fmt(tr['iteration_time'])} s): its settings and each stage's F, B, sync and "
            "memory in manifest.json; each stage folder holds its forward graph with its "
            "strategies (the backward is the training framework's)"
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


PRINTERS = {dispatch.PIPELINE: print_pipeline_export, dispatch.JOINT: print_joint_export}
