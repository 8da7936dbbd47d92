"""Importer for the dnn-partitioning JSON (msr-fiddle/dnn-partitioning, Tarnawski et al. 2020).

The file's own cost model is kept exactly (``../shared/benchmarks/dnn-partitioning/README.md``):

- work(v) = ``fpgaLatency``; CPU cores are ignored (accelerators only).
- io: edge ``cost`` is the time to move the source node's output, paid once by the sending
  device and once by each receiving device. We set the link bandwidth B to the file's usual
  ``size / cost`` ratio and sizeout(u) = cost(u) * B, so io = sizeout / B = cost exactly (up to
  float rounding) while sizes stay in bytes where cost and size agree.
- memory: node ``size`` (bytes) is a parameter entity of that node; ``maxSizePerFPGA`` is the
  hard capacity C; there is no activation peak (act = 0) and no fast-memory overflow (M = inf).
- ``colorClass``: nodes sharing a class are co-located; ``maxFPGAs`` is the default k.
- training graphs: only forward edges (neither end a backward node) constrain the block order.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from solver.errors import MtppError
from solver.graph import Graph

_NODE_KEYS = ("id", "fpgaLatency")
_EDGE_KEYS = ("sourceId", "destId", "cost")


def looks_like(data: object) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("nodes"), list)
        and isinstance(data.get("edges"), list)
        and ("maxFPGAs" in data or "maxSizePerFPGA" in data)
    )


def from_dict(data: dict, name: str, where: str) -> Graph:
    """Build the graph (and its cluster hints) from a parsed dnn-partitioning file."""
    nodes, edges = data["nodes"], data["edges"]
    for i, nd in enumerate(nodes):
        if not isinstance(nd, dict) or any(k not in nd for k in _NODE_KEYS):
            raise MtppError(f"{where}: nodes[{i}] needs the keys {', '.join(_NODE_KEYS)}")
    for i, e in enumerate(edges):
        if not isinstance(e, dict) or any(k not in e for k in _EDGE_KEYS):
            raise MtppError(f"{where}: edges[{i}] needs the keys {', '.join(_EDGE_KEYS)}")
    ids = [nd["id"] for nd in nodes]
    if len(set(ids)) != len(ids):
        dup = next(x for x, c in Counter(ids).items() if c > 1)
        raise MtppError(f"{where}: node id {dup!r} appears more than once")
    index = {x: i for i, x in enumerate(ids)}
    raw = [str(nd.get("name", nd["id"])) for nd in nodes]
    names = (
        raw
        if len(set(raw)) == len(raw)
        else [f"{r}@{nd['id']}" for r, nd in zip(raw, nodes, strict=True)]
    )
    work = [float(nd["fpgaLatency"]) for nd in nodes]
    backward = np.array([bool(nd.get("isBackwardNode", 0)) for nd in nodes])

    ratios: Counter = Counter()
    cost = defaultdict(float)
    pairs = []
    for i, e in enumerate(edges):
        try:
            u, v = index[e["sourceId"]], index[e["destId"]]
        except KeyError as err:
            raise MtppError(f"{where}: edges[{i}] names unknown node id {err.args[0]!r}") from None
        c, s = float(e["cost"]), float(e.get("size", 0.0))
        if not np.isfinite(c) or c < 0:
            raise MtppError(f"{where}: edges[{i}] has a negative or non-finite cost {e['cost']!r}")
        cost[u] = max(cost[u], c)
        if c > 0 and s > 0:
            ratios[s / c] += 1
        pairs.append((u, v))
    bw = ratios.most_common(1)[0][0] if ratios else 1.0
    sizeout = np.zeros(len(nodes))
    for u, c in cost.items():
        sizeout[u] = c * bw
    e = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    ordered = ~(backward[e[:, 0]] | backward[e[:, 1]]) if len(e) else np.zeros(0, bool)

    params = []
    for i, nd in enumerate(nodes):
        size = float(nd.get("size", 0.0) or 0.0)
        if size > 0:
            params.append((f"{names[i]}:size", size, [i]))
    classes = defaultdict(list)
    for i, nd in enumerate(nodes):
        if nd.get("colorClass") is not None:
            classes[nd["colorClass"]].append(i)
    cluster = {
        "name": f"{name}-accelerators",
        "description": "accelerators of the dnn-partitioning file (CPU cores ignored)",
        "devices": int(data.get("maxFPGAs", 1) or 1),
        "fast_memory": "inf",
        "link_bandwidth": bw,
    }
    if data.get("maxSizePerFPGA") is not None:
        cluster["capacity"] = float(data["maxSizePerFPGA"])
    return Graph.build(
        names,
        work,
        sizeout,
        e,
        ordered=ordered,
        params=params,
        act=np.zeros(len(nodes)),
        colocate=[m for m in classes.values() if len(m) > 1],
        name=name,
        hints={"cluster": cluster, "format": "dnn-partitioning", "time_unit": "file units"},
    )
