"""mtpp inspect: sizes, work, parameters and heaviest operators of a graph."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from solver.cli.common import console, fmt, load_graph_and_cluster, print_json
from solver.core.cost import lower_bound
from solver.core.text import esc
from solver.core.units import format_bytes, format_time


def cmd_inspect(args: argparse.Namespace) -> int:
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
    if args.training_costs:
        add_training_costs(info, g, top)
    for key, val in g.hints.items():
        if key not in ("cluster", "format"):
            info.setdefault(key, val)
    if args.json:
        print_json(info)
        return 0
    print_inspect(console(), g, cluster, info, ops)
    return 0


def add_training_costs(info: dict, g, top: np.ndarray) -> None:
    """``--training-costs``: the backward work and the stash per in-flight microbatch, in
    total and of each heaviest operator (a graph without them: their defaults)."""
    backward, stash = g.backward_work, g.stash_bytes
    info["work_backward"] = float(backward.sum())
    info["stash"] = float(stash.sum())
    for row, v in zip(info["heaviest"], top, strict=True):
        row["work_backward"] = float(backward[v])
        row["stash"] = float(stash[v])


def print_inspect(con, g, cluster, info: dict, ops: Counter) -> None:
    """The summary, operator types and heaviest operators as tables that fit the console
    (80 columns in a pipe): long names wrap in their column instead of widening the table."""
    from rich import box
    from rich.table import Table

    con.print(f"[bold]graph[/bold] {esc(g.name)}")
    t = Table(show_header=False, box=box.SIMPLE, pad_edge=False)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")
    t.add_row("nodes / edges", f"{g.n} / {info['edges']} ({g.m} ordering)")
    t.add_row("parameters", f"{g.num_params} entities, {format_bytes(g.param_bytes_total)}")
    t.add_row("activations", f"{format_bytes(info['activation_bytes'])} (sum of outputs)")
    t.add_row("total work", format_time(info["work"]))
    if "work_backward" in info:
        t.add_row("backward work", format_time(info["work_backward"]))
        t.add_row("stash", f"{format_bytes(info['stash'])} per in-flight microbatch")
    if g.flops is not None:
        t.add_row("total FLOPs", f"{info['flops']:.4g}")
    t.add_row("co-location groups", str(len(g.groups)))
    t.add_row("cluster", esc(cluster.summary()))
    t.add_row(f"lower bound (k={cluster.devices})", f"{format_time(info['lower_bound'])} on max f")
    con.print(t)
    if ops:
        o = Table(title="operator types", box=box.SIMPLE_HEAD)
        o.add_column("op", overflow="fold")
        o.add_column("count", justify="right", no_wrap=True)
        for name, c in ops.most_common(15):
            o.add_row(esc(name), str(c))
        con.print(o)
    top = info["heaviest"]
    h = Table(title=f"heaviest {len(top)} operators", box=box.SIMPLE_HEAD)
    h.add_column("node", overflow="fold")
    if g.op_types is not None:
        h.add_column("op", overflow="fold", max_width=20)
    h.add_column("work", justify="right", no_wrap=True)
    if g.flops is not None:
        h.add_column("FLOPs", justify="right", no_wrap=True)
    h.add_column("output", justify="right", no_wrap=True)
    for row in top:
        cells = [esc(row["name"])]
        if g.op_types is not None:
            cells.append(esc(row["op_type"] or "-"))
        cells.append(format_time(row["work"]))
        if g.flops is not None:
            cells.append(fmt(row["flops"]))
        cells.append(format_bytes(row["sizeout"]))
        h.add_row(*cells)
    con.print(h)
