"""Evaluator and SliceGraph speed on large generated graphs.

python benchmarks/bench_evaluate.py                 # 100,000-node evaluation, 10,000-node slicing
python benchmarks/bench_evaluate.py --nodes 1000000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from solver.core.cluster import load_cluster
from solver.core.cost import evaluate, validate
from solver.core.graph import Graph
from solver.frontends.workloads import layered_dag
from solver.pipeline.heuristics.slicing import slice_order
from solver.pipeline.options import SolveOptions
from solver.pipeline.registry import solve


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--slice-nodes", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=16)
    args = ap.parse_args()
    c = load_cluster("ipu-pod", devices=args.k)
    print("| measurement | nodes | k | seconds |")
    print("|---|---|---|---|")
    g = layered_dag(args.nodes)

    def rebuild() -> None:
        params = [
            (g.p_names[p], g.p_size[p], g.p_users[g.p_ptr[p] : g.p_ptr[p + 1]])
            for p in range(g.num_params)
        ]
        edges = np.stack(g.data_edges, 1)
        Graph.build(g.names, g.work, g.sizeout, edges, act=g.act, params=params)

    print(
        f"| Graph.build (validation, topological order) | {g.n} | - | {best_of(rebuild, 1):.3f} |"
    )
    a = np.empty(g.n, dtype=np.int64)
    a[g.topo_order] = np.arange(g.n) * args.k // g.n
    print(f"| evaluate one plan | {g.n} | {args.k} | {best_of(lambda: evaluate(g, c, a)):.3f} |")
    print(f"| validate one plan | {g.n} | {args.k} | {best_of(lambda: validate(g, c, a)):.3f} |")
    gs = layered_dag(args.slice_nodes, seed=1)
    t = time.perf_counter()
    val, _ = slice_order(gs, c, gs.topo_order)
    print(f"| optimal slicing of one order | {gs.n} | {args.k} | {time.perf_counter() - t:.3f} |")
    t = time.perf_counter()
    plan = solve(gs, c, "slicegraph", SolveOptions(time_limit=5))
    print(f"| slicegraph method (5 s limit) | {gs.n} | {args.k} | {time.perf_counter() - t:.3f} |")
    print(f"\nslicing objective {val:.6g}, slicegraph objective {plan.objective:.6g}")


if __name__ == "__main__":
    main()
