"""mtpp inspect: sizes, work, parameters and heaviest operators of a graph."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from solver.cli.common import (
    add_graph_options,
    add_json,
    console,
    esc,
    fmt,
    formatter,
    load_graph_and_cluster,
    print_json,
)


def add_parser(sub) -> None:
    """Arguments of ``mtpp inspect``."""
    p = sub.add_parser(
        "inspect",
        help="summarise a graph: nodes, edges, work, parameters, heaviest operators",
        description="Summarise a graph file: sizes, total work and FLOPs, parameter and "
        "activation bytes, operator types, and the heaviest operators.",
        epilog="example:\n  mtpp inspect ../shared/benchmarks/dnn-partitioning/throughput-inputs/"
        "LayerGraphs/bert24_inference.json --json",
        formatter_class=formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument("--top", type=int, default=10, help="heaviest operators to list (default 10)")
    add_graph_options(p)
    add_json(p)


def cmd_inspect(args: argparse.Namespace) -> int:
    from solver.cost import lower_bound

    g, cluster = load_graph_and_cluster(args)
    ops = Counter(g.op_types) if g.op_types is not None else Counter()
    top = np.argsort(-g.work, kind="stable")[: max(0, args.top)]
    info = {
        "graph": g.name,
        "format": g.hints.get("format", "onnx" if g.op_types is not None else "mtpp-graph"),
        "nodes": g.n,
        "edges": int(len(g.data_edges[0])),
        "order_edges": g.m,
        "tensors": g.num_tensors,
        "params": g.num_params,
        "param_bytes": g.param_bytes_total,
        "activation_bytes": float(g.sizeout.sum()),
        "work": float(g.work.sum()),
        "flops": None if g.flops is None else float(g.flops.sum()),
        "colocation_groups": len(g.groups),
        "op_types": dict(ops.most_common()),
        "cluster": cluster.to_dict(),
        "lower_bound": lower_bound(g, cluster),
        "heaviest": [
            {
                "name": g.names[v],
                "op_type": g.op_types[v] if g.op_types is not None else None,
                "work": float(g.work[v]),
                "flops": None if g.flops is None else float(g.flops[v]),
                "sizeout": float(g.sizeout[v]),
            }
            for v in top
        ],
    }
    for key, val in g.hints.items():
        if key not in ("cluster", "format"):
            info.setdefault(key, val)
    if args.json:
        print_json(info)
        return 0
    from rich.table import Table

    from solver.units import format_bytes, format_time

    con = console()
    t = Table(title=f"graph {esc(g.name)}", show_header=False)
    t.add_row("nodes / edges", f"{g.n} / {info['edges']} ({g.m} ordering)")
    t.add_row("parameters", f"{g.num_params} entities, {format_bytes(g.param_bytes_total)}")
    t.add_row("activations (sum of outputs)", format_bytes(info["activation_bytes"]))
    t.add_row("total work", format_time(info["work"]))
    if g.flops is not None:
        t.add_row("total FLOPs", f"{info['flops']:.4g}")
    t.add_row("co-location groups", str(len(g.groups)))
    t.add_row("cluster", esc(cluster.summary()))
    t.add_row(f"lower bound on max f (k={cluster.devices})", format_time(info["lower_bound"]))
    con.print(t)
    if ops:
        o = Table(title="operator types")
        o.add_column("op")
        o.add_column("count", justify="right")
        for name, c in ops.most_common(15):
            o.add_row(esc(name), str(c))
        con.print(o)
    h = Table(title=f"heaviest {len(top)} operators")
    for col in ("node", "op", "work", "FLOPs", "output"):
        h.add_column(col, justify="left" if col in ("node", "op") else "right")
    for row in info["heaviest"]:
        h.add_row(
            esc(row["name"]),
            esc(row["op_type"] or "-"),
            format_time(row["work"]),
            fmt(row["flops"]),
            format_bytes(row["sizeout"]),
        )
    con.print(h)
    return 0
