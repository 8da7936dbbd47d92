"""mtpp experiment: a YAML sweep of methods x graphs x clusters x k."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from solver.cli.common import console, print_json
from solver.core.errors import MtppError
from solver.core.text import esc
from solver.experiments.driver import ExperimentInterrupted, run_experiment
from solver.pipeline.plan import ERROR

MAX_JOBS = 1024


def cmd_experiment(args: argparse.Namespace) -> int:
    """Run the experiment; 0 when every run worked, 1 when some ended in ERROR, 130 on Ctrl-C."""
    if args.jobs is not None and not 1 <= args.jobs <= MAX_JOBS:
        raise MtppError(f"--jobs must be in 1..{MAX_JOBS}, got {args.jobs}")
    if args.address is not None and not args.address.strip():
        raise MtppError("--address is empty; give HOST:PORT of the Ray head node, or 'auto'")
    try:
        records = run_experiment(
            args.config,
            args.output,
            jobs=args.jobs,
            resume=args.resume,
            progress=not args.quiet,  # on stderr: with --json, stdout holds only the JSON
            backend=args.backend,
            address=args.address,
        )
    except ExperimentInterrupted as e:
        print(
            f"mtpp: interrupted: {e.recorded} of {e.total} runs recorded in {e.output}; "
            "run the same command with --resume to continue",
            file=sys.stderr,
        )
        return 130
    errors = [r for r in records if r.get("status") == ERROR]
    if args.json:
        print_json({"output": args.output, "runs": len(records), "errors": len(errors)})
    else:
        con = console()
        summary = (Path(args.output) / "summary.md").read_text().splitlines()
        con.print("\n".join(esc(line) for line in summary), soft_wrap=True)  # markdown rows
        written = ["results.csv", "summary.md"] + sorted(
            p.name for p in Path(args.output).glob("*.png")
        )
        con.print(f"{len(records)} runs; results in {esc(args.output)} ({', '.join(written)})")
        for r in errors[:5]:
            what = f"{r['graph']} {r['method']}: {r.get('error')}"
            con.print(f"[red]error[/red] {esc(what)}")
    return 0 if not errors else 1
