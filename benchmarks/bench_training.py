"""Training plans of the Llama-2-7B shape on dgx-a100-x2: certified 1F1B plans and the
practitioners' splits (docs/training.md).

    python benchmarks/bench_training.py [--time-limit 120] [--memory 80GB,40GB]
        [--schedule 1f1b] [--microbatches 32] [--seq 4096] [--optimizer-state 8]

Builds the Llama-2-7B shape (models/llama.py: fp16 weights in a sparse file that is never
written nor read) at ``--seq`` tokens per microbatch, and for each capacity runs

    mtpp solve llama7b.onnx --cluster dgx-a100-x2 --schedule 1f1b --microbatches 32
        --memory 80GB --optimizer-state 8 --time-limit 120 --json

in a subprocess (the ONNX model gets each operator's backward work and stash from the table
of solver/frontends/onnx/backward.py). It prints one Markdown row per capacity: status, the
iteration time T of the plan, the certified lower bound and the gap, the bound that binds,
the stage count, the largest stage memory, wall seconds; then the ratio of each practitioners'
split (uniform, fewer-at-ends, by-parameters: solver/pipeline/training/splits.py) to the
certified optimum. When the plan is not proven optimal, the optimum lies between the lower
bound and T, so a split's ratio lies between T(split) / T and T(split) / bound: both are
printed, as "low-high". ``--optimizer-state 8`` is mixed-precision Adam (fp32 master weights
and two moments, fp16 weights and gradients: 16 bytes per 2-byte weight).
Runs one case at a time (the machine is shared); the load is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPLITS = ("uniform", "fewer-at-ends", "by-parameters")


@dataclass(frozen=True)
class Case:
    """One solve: the capacity and the command that runs it."""

    memory: str
    command: list[str]


@dataclass(frozen=True)
class Outcome:
    """What one solve printed (its plan JSON), or the error line it ended with."""

    case: Case
    plan: dict | None
    error: str | None
    wall: float


def model_path(seq: int, out_dir: Path) -> Path:
    """The Llama-2-7B shape at ``seq`` tokens, built afresh (well under a second: the weight
    file is a sparse hole), so that it is the current generator's."""
    path = out_dir / f"llama7b-s{seq}.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "models" / "llama.py"), "--preset", "7b", "--force"]
    subprocess.run([*cmd, "--seq", str(seq), "--out", str(path)], check=True, capture_output=True)
    return path


def cases(path: Path, args: argparse.Namespace) -> list[Case]:
    """One ``mtpp solve`` per capacity."""
    base = [sys.executable, "-m", "solver.cli", "solve", str(path), "--cluster", args.cluster]
    base += ["--schedule", args.schedule, "--microbatches", str(args.microbatches)]
    base += ["--optimizer-state", str(args.optimizer_state)]
    base += ["--time-limit", str(args.time_limit), "--json"]
    return [Case(m, [*base, "--memory", m]) for m in args.memory.split(",")]


def run(case: Case) -> Outcome:
    """Run one case in a fresh process; its plan, or the last line of its error."""
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT)))
    t0 = time.perf_counter()
    r = subprocess.run(case.command, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        error = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return Outcome(case, None, error, wall)
    return Outcome(case, json.loads(r.stdout), None, wall)


def split_ratio(plan: dict, name: str) -> str:
    """A split's T over the certified optimum: exact when the plan is proven optimal, else
    the interval [T(split) / T, T(split) / bound] the optimum's position allows."""
    tried = plan.get("stats", {}).get("training_solve", {}).get("tried", {})
    row = tried.get(name)
    if row is None:
        return "-"
    if not row.get("valid"):
        return "does not fit"
    t, best, low = row["iteration_time"], plan["objective"], plan["lower_bound"]
    if plan["status"] == "OPTIMAL" or low <= 0:
        return f"{t / best:.3f}"
    return f"{t / best:.3f}-{t / low:.3f}"


def row(o: Outcome, args: argparse.Namespace) -> str:
    """The Markdown row of one outcome."""
    head = f"| {args.schedule} m={args.microbatches} | {o.case.memory} "
    if o.plan is None:
        return head + f"| error: {o.error} |"
    p = o.plan
    stages = p["training"]["stages"]
    mem = max(s["memory_bytes"] for s in stages) / 1e9
    gap = "-" if p.get("gap") is None else f"{100 * p['gap']:.2f}%"
    cells = [
        p["status"],
        f"{p['objective'] * 1e3:.2f} ms",
        f"{p['lower_bound'] * 1e3:.2f} ms",
        gap,
        p.get("stats", {}).get("bound", {}).get("binding", "-"),
        str(len(stages)),
        f"{mem:.1f} GB",
        f"{o.wall:.0f}",
        *(split_ratio(p, s) for s in SPLITS),
    ]
    return head + "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per solve")
    ap.add_argument("--memory", default="80GB,40GB", help="capacities, comma-separated")
    ap.add_argument("--cluster", default="dgx-a100-x2")
    ap.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    ap.add_argument("--microbatches", type=int, default=32)
    ap.add_argument("--seq", type=int, default=4096, help="tokens per microbatch")
    ap.add_argument("--optimizer-state", type=float, default=8.0)
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/llm"))
    args = ap.parse_args(argv)
    path = model_path(args.seq, args.out_dir)
    todo = cases(path, args)
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    print(f"command: {shlex.join(todo[0].command)}")
    cols = ["schedule", "capacity", "status", "T", "lower bound", "gap", "binding bound"]
    cols += ["stages", "largest stage memory", "wall s"]
    cols += [f"{s} / optimum" for s in SPLITS]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for case in todo:
        print(row(run(case), args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
