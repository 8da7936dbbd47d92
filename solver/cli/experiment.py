"""mtpp experiment: a YAML sweep of methods x graphs x clusters x k."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from solver.cli.common import add_json, console, esc, formatter, print_json
from solver.core.errors import MtppError
from solver.pipeline.plan import ERROR


def add_parser(sub) -> None:
    """Arguments of ``mtpp experiment``."""
    p = sub.add_parser(
        "experiment",
        help="run a YAML experiment: methods x graphs x clusters x k, with reports",
        description="Run every combination of a YAML experiment config, in parallel processes "
        "on this machine (--backend local) or as Ray tasks (--backend ray: a local Ray instance, "
        "or the cluster at --address), and write results.jsonl, runs/, plans/, results.csv, "
        "summary.md and PNG plots into --output. Each finished run is saved at once by this "
        "process; Ctrl-C stops, keeps what finished and exits 130; --resume skips recorded runs "
        "(whichever backend recorded them). Locally each run gets max(1, cores / jobs) CP-SAT "
        "workers; on Ray a run asks for its method's 'cpus:' (CP-SAT default: a node's cores, "
        "at most 8). Paths in the config are resolved beside the config file, then in the "
        "current folder. dnn-partitioning graphs are read from the config's 'benchmark_dir:', "
        "else $MTPP_BENCH, else ../shared/benchmarks/dnn-partitioning beside the project.",
        epilog="examples:\n  mtpp experiment configs/experiments/smoke.yaml --output results/smoke"
        "\n  mtpp experiment configs/experiments/heuristic_vs_exact.yaml -o results/hve --jobs 2"
        " --resume"
        "\n  mtpp experiment configs/experiments/smoke.yaml -o results/smoke --backend ray"
        "\n  mtpp experiment configs/experiments/heuristic_vs_exact.yaml -o results/hve "
        "--backend ray --address HEAD_IP:6379",
        formatter_class=formatter,
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="experiment config (configs/experiments)")
    p.add_argument(
        "--output",
        "-o",
        required=True,
        metavar="DIR",
        help="results folder: new or empty, or an unfinished one with --resume",
    )
    p.add_argument(
        "--jobs", "-j", type=int, default=None, help="local backend: runs in parallel (default 1)"
    )
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default=None,
        help="local: a process pool on this machine; ray: one Ray task per run (needs the "
        "'ray' extra). Default: the config's 'backend:', else local",
    )
    p.add_argument(
        "--address",
        metavar="ADDRESS",
        default=None,
        help="with --backend ray: join the Ray cluster there (HOST:PORT, 'auto', or "
        "ray://HOST:10001); without it a local Ray instance is started on all cores",
    )
    p.add_argument("--resume", action="store_true", help="continue a folder, skip finished runs")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    add_json(p)


MAX_JOBS = 1024


def cmd_experiment(args: argparse.Namespace) -> int:
    """Run the experiment; 0 when every run worked, 1 when some ended in ERROR, 130 on Ctrl-C."""
    from solver.experiments.driver import ExperimentInterrupted, run_experiment

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
