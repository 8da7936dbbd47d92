"""CP-SAT on the dnn-partitioning graphs (issue 4's acceptance numbers).

    python benchmarks/bench_exact.py --suite file      # 8 inference graphs at the file's k
    python benchmarks/bench_exact.py --suite ks        # the same at k = 2, 4, 8, 16
    python benchmarks/bench_exact.py --suite training  # training graphs at the file's k

Prints one Markdown row per run: status, objective, lower bound, gap, known optimum, wall time.
"""

from __future__ import annotations

import argparse
import sys
import time

from common import KNOWN, TRAINING, path

from solver.frontends import load_graph, resolve_cluster
from solver.pipeline.options import SolveOptions
from solver.pipeline.registry import solve


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--suite", choices=["file", "ks", "training"], default="file")
    ap.add_argument("--time-limit", type=float, default=None)
    ap.add_argument("--ks", default="2,4,8,16")
    ap.add_argument("--only", default=None, help="substring filter on graph keys")
    ap.add_argument(
        "--no-tie-break", action="store_true", help="skip the cheapest-cut tie-break stage"
    )
    args = ap.parse_args()
    if args.suite == "file":
        runs = [(key, None) for key in KNOWN]
        limit = args.time_limit or 10.0
    elif args.suite == "ks":
        runs = [(key, int(k)) for key in KNOWN for k in args.ks.split(",")]
        limit = args.time_limit or 60.0
    else:
        runs = [(key, None) for key in TRAINING]
        limit = args.time_limit or 60.0
    if args.only:
        runs = [r for r in runs if args.only in r[0]]
    print("| graph | nodes | k | status | objective | lower bound | gap | known optimum | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, k in runs:
        g = load_graph(path(key))
        c = resolve_cluster(g, devices=k)
        t0 = time.perf_counter()
        extra = {"tie_break": False} if args.no_tie_break else {}
        plan = solve(g, c, "cpsat", SolveOptions(time_limit=limit, extra=extra))
        wall = time.perf_counter() - t0
        known = KNOWN.get(key) if k is None else None
        if plan is None:
            print(f"| {key} | {g.n} | {c.devices} | INFEASIBLE | - | - | - | - | {wall:.2f} |")
            continue
        print(
            f"| {key} | {g.n} | {c.devices} | {plan.status} | {plan.objective:.10g} | "
            f"{plan.lower_bound:.10g} | {100 * plan.gap:.4f}% | {known if known else '-'} | "
            f"{wall:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
