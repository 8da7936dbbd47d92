"""mtpp experiment: a YAML sweep of methods x graphs x clusters x k."""

from __future__ import annotations

import argparse
from pathlib import Path

from solver.cli.common import add_json, console, formatter, print_json
from solver.errors import MtppError


def add_parser(sub) -> None:
    """Arguments of ``mtpp experiment``."""
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
        formatter_class=formatter,
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="experiment config (configs/experiments)")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="results folder")
    p.add_argument("--jobs", "-j", type=int, default=1, help="runs in parallel (default 1)")
    p.add_argument("--resume", action="store_true", help="continue a folder, skip finished runs")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    add_json(p)


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
        print_json({"output": args.output, "runs": len(records), "errors": len(errors)})
    else:
        con = console()
        con.print((Path(args.output) / "summary.md").read_text())
        con.print(
            f"{len(records)} runs; results in {args.output} (results.csv, summary.md, "
            "ratio_by_method.png, time_vs_size.png)"
        )
        for r in errors[:5]:
            con.print(f"[red]error[/red] {r['graph']} {r['method']}: {r.get('error')}")
    return 0 if not errors else 1
