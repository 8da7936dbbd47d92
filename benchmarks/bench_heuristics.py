"""Every method on the eight dnn-partitioning inference graphs (issue 5's acceptance numbers).

    python benchmarks/bench_heuristics.py [--time-limit 5]

Prints the ratio of each method's objective to the known optimum and its wall time, then the
geometric mean ratio per method. Every plan is re-evaluated by the one evaluator.
"""

from __future__ import annotations

import argparse
import math
import time

from common import KNOWN, path

from solver.cost import evaluate, validate
from solver.errors import MtppError
from solver.io import load_graph, resolve_cluster
from solver.methods import SolveOptions, solve

METHODS = ["uniform", "params", "time", "poprt", "poprt-opt", "slicegraph", "idealdp", "cpsat"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--time-limit", type=float, default=5.0)
    args = ap.parse_args()
    ratios: dict[str, list[float]] = {m: [] for m in METHODS}
    print("| graph | " + " | ".join(METHODS) + " |")
    print("|---|" + "---|" * len(METHODS))
    for key, opt in KNOWN.items():
        g = load_graph(path(key))
        c = resolve_cluster(g)
        cells = []
        for m in METHODS:
            method, extra = ("poprt", {"optimal_perf": True}) if m == "poprt-opt" else (m, {})
            t0 = time.perf_counter()
            try:
                plan = solve(g, c, method, SolveOptions(time_limit=args.time_limit, extra=extra))
            except MtppError as e:
                cells.append(f"- ({str(e).split(';')[0][:28]})")
                continue
            wall = time.perf_counter() - t0
            obj = evaluate(g, c, plan.assignment).objective
            assert abs(obj - plan.objective) <= 1e-9 * obj
            assert obj >= opt * (1 - 1e-6), (key, m, obj, opt)
            bad = validate(g, c, plan.assignment)
            r = obj / opt
            ratios[m].append(r)
            cells.append(f"{r:.4f}{' (invalid)' if bad else ''} {wall:.2f}s")
        print(f"| {key} | " + " | ".join(cells) + " |", flush=True)
    gm = [math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan") for v in ratios.values()]
    print("| **geometric mean ratio** | " + " | ".join(f"{x:.4f}" for x in gm) + " |")


if __name__ == "__main__":
    main()
