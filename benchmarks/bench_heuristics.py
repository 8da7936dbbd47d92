"""Every method on the eight dnn-partitioning inference graphs (issue 5's acceptance numbers).

    python benchmarks/bench_heuristics.py [--time-limit 5]
    python benchmarks/bench_heuristics.py --large 100000 --time-limit 5   # bounded time

Prints the ratio of each method's objective to the known optimum and its wall time, then the
geometric mean ratio per method. Every plan is re-evaluated by the one evaluator.

With ``--large N`` it instead times every method on a generated N-node layered DAG
(``solver.frontends.workloads.layered_dag``) at k = 1, 4 and 64: each must stop near
``--time-limit``
and return a plan (or refuse with a message, e.g. idealdp past its ideal cap).
"""

from __future__ import annotations

import argparse
import math
import time

from common import KNOWN, path

from solver.core.cost import evaluate, validate
from solver.core.errors import MtppError
from solver.frontends import load_graph, resolve_cluster
from solver.pipeline.options import SolveOptions
from solver.pipeline.registry import solve

METHODS = ["uniform", "params", "time", "poprt", "poprt-opt", "slicegraph", "idealdp", "cpsat"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--time-limit", type=float, default=5.0)
    ap.add_argument("--large", type=int, metavar="N", help="time every method on an N-node DAG")
    args = ap.parse_args()
    if args.large:
        large(args.large, args.time_limit)
        return
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


def large(n: int, time_limit: float) -> None:
    """Wall time of every method on an n-node layered DAG at k = 1, 4, 64 (bounded time)."""
    from solver.core.graph import coarse_view
    from solver.frontends.workloads import layered_dag

    t0 = time.perf_counter()
    g = layered_dag(n)
    coarse_view(g)  # cached on the graph: the load step, not the method's
    print(f"graph: {g.n:,} nodes, built in {time.perf_counter() - t0:.1f} s; limit {time_limit} s")
    methods = ["cpsat", "slicegraph", "poprt", "idealdp", "time", "params", "uniform"]
    print("| method | k | wall s | status | objective | gap | note |")
    print("|---|---|---|---|---|---|---|")
    for k in (1, 4, 64):
        c = resolve_cluster(g, devices=k)
        for m in methods:
            t = time.perf_counter()
            try:
                plan = solve(g, c, m, SolveOptions(time_limit=time_limit))
            except MtppError as e:
                wall = time.perf_counter() - t
                print(f"| {m} | {k} | {wall:.2f} | refused | - | - | {str(e)[:60]} |", flush=True)
                continue
            wall = time.perf_counter() - t
            note = plan.stats.get("note") or plan.stats.get("fallback") or ""
            if plan.stats.get("time_limit_reached"):
                note = note or "search stopped at the limit"
            print(
                f"| {m} | {k} | {wall:.2f} | {plan.status} | {plan.objective:.6g} | "
                f"{100 * plan.gap:.3g}% | {str(note)[:60]} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
