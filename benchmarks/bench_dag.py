"""Certificates on random layered DAGs (``solver.frontends.workloads.layered_dag``).

    python benchmarks/bench_dag.py [--nodes 100,300,1000,3000,10000] [--k 4,16]
        [--time-limit 60] [--seed 0] [--out-dir /tmp/bench_dag] [--method cpsat]

Writes each graph once as a native JSON file into ``--out-dir`` (never committed), then runs
``mtpp solve GRAPH -k K --time-limit T --json --quiet`` for every case, one at a time, in a
child process under ``/usr/bin/time -v`` (when present) for its peak resident memory, and
prints one Markdown row per case: status, objective, bound, binding bound, gap, wall seconds,
peak memory and the 1-minute load average before the case (the machine may be shared: say
how loaded it was). The issue's target: gap <= 1% within 60 s, peak memory <= 4 GB.

``--cover-seconds S`` adds a column: the block cover bound (docs/bounds.md, "block cover";
graphs of at most 150 coarse nodes) computed alone in this process for S seconds, from the
solve's certified bound up to its plan: what the set-partitioning relaxation adds where the
solve's bounds stop (it is not a stage of the solve: it costs seconds on graphs CP-SAT
proves alone).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from solver.frontends import load_graph, resolve_cluster
from solver.frontends.native import to_dict
from solver.frontends.workloads import layered_dag
from solver.pipeline.bounds.block_cover import block_cover_bound

TIME_V = "/usr/bin/time"  # GNU time: -v prints "Maximum resident set size (kbytes)"
COLUMNS = ["nodes", "k", "status", "objective", "bound", "binding", "gap", "wall s", "peak MB"]


@dataclass(frozen=True)
class Case:
    """One solve: the graph's node count and file, and k."""

    nodes: int
    path: Path
    k: int


def graph_file(n: int, seed: int, out_dir: Path) -> Path:
    """The JSON file of an n-node layered DAG (written once)."""
    path = out_dir / f"layered-{n}-seed{seed}.json"
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(to_dict(layered_dag(n, seed=seed))))
    return path


def peak_mb(stderr: str) -> float | None:
    """Peak resident memory (MB) from GNU time's -v report, None without one."""
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    return None if m is None else int(m.group(1)) / 1024


def solve(case: Case, time_limit: float, method: str) -> dict:
    """``mtpp solve`` on one case: its JSON, with wall seconds, peak memory and the load."""
    load = os.getloadavg()[0]
    cmd = [sys.executable, "-m", "solver.cli", "solve", str(case.path), "-k", str(case.k)]
    cmd += ["--time-limit", str(time_limit), "--json", "--quiet", "--method", method]
    if os.path.exists(TIME_V):
        cmd = [TIME_V, "-v", *cmd]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("\t")]
        return {"error": (lines or ["?"])[-1], "load": load, "wall": wall}
    out = json.loads(r.stdout)
    out.update(wall=wall, load=load, peak_mb=peak_mb(r.stderr))
    return out


def cover_alone(case: Case, r: dict, seconds: float) -> str:
    """The block cover bound of the case alone, from the solve's bound up to its plan."""
    if "error" in r:
        return "-"
    t0 = time.perf_counter()
    g = load_graph(case.path)
    cluster = resolve_cluster(g, None, case.k)
    lo, hi = r.get("lower_bound") or 0.0, r["objective"]
    res = block_cover_bound(g, cluster, case.k, seconds, lo, hi)
    seconds = time.perf_counter() - t0
    return f"{res.value * 1e3:.6g} ms ({res.proven}/{res.probes} probes, {seconds:.1f} s)"


def row(case: Case, r: dict, cover: str | None = None) -> str:
    """One Markdown row of a solve's JSON (and the block cover column when asked for)."""
    if "error" in r:
        cells = [case.nodes, case.k, f"error: {r['error']}", "", "", "", "", f"{r['wall']:.1f}"]
        return "| " + " | ".join(str(c) for c in [*cells, "", f"{r['load']:.1f}"]) + " |"
    bound = (r.get("stats") or {}).get("bound") or {}
    binding = bound.get("binding") if isinstance(bound, dict) else None
    gap = r.get("gap")
    peak = r.get("peak_mb")
    cells = [
        case.nodes,
        case.k,
        r.get("status"),
        f"{r['objective'] * 1e3:.6g} ms",
        f"{(r.get('lower_bound') or 0.0) * 1e3:.6g} ms",
        binding or "-",
        "-" if gap is None else f"{100 * gap:.2f}%",
        f"{r['wall']:.1f}",
        "-" if peak is None else f"{peak:.0f}",
        f"{r['load']:.1f}",
    ]
    if cover is not None:
        cells.append(cover)
    return "| " + " | ".join(str(c) for c in cells) + " |"


def int_list(text: str, flag: str) -> list[int]:
    """A comma-separated list of whole numbers >= 1 (exit 2 naming the flag otherwise)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        print(f"{flag}: give comma-separated whole numbers >= 1, got {text!r}", file=sys.stderr)
        raise SystemExit(2)
    return values


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", default="100,300,1000,3000,10000")
    ap.add_argument("--k", default="4,16", help="comma-separated device counts")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0, help="layered_dag's seed")
    ap.add_argument("--method", default="cpsat")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/bench_dag"))
    ap.add_argument("--cover-seconds", type=float, default=0.0, help="see above (0: no column)")
    args = ap.parse_args()
    nodes, ks = int_list(args.nodes, "--nodes"), int_list(args.k, "--k")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    cols = [*COLUMNS, "load"] + (["block cover alone"] if args.cover_seconds > 0 else [])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for n in nodes:
        path = graph_file(n, args.seed, args.out_dir)
        for k in ks:
            case = Case(n, path, k)
            r = solve(case, args.time_limit, args.method)
            cover = cover_alone(case, r, args.cover_seconds) if args.cover_seconds > 0 else None
            print(row(case, r, cover), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
