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
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from solver.core.cluster import MAX_DEVICES
from solver.core.errors import MtppError
from solver.core.files import shown, validation_message
from solver.core.graph import MAX_NAME_CHARS, Graph

# Strict types: a boolean, string or null where a number or id belongs is refused, and so are
# NaN, infinities, negative amounts and integers beyond int64 (ids) or a float (amounts).
Amount = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
NodeId = Annotated[int, Field(strict=True, ge=0, le=2**63 - 1)]
Flag = Annotated[bool, Field(strict=True)] | Literal[0, 1]
# cpuLatency, layerId, ... are not used; defer_build: validators built on first use (start-up)
_KEEP_OTHER_KEYS = ConfigDict(extra="ignore", defer_build=True)


class _Node(BaseModel):
    model_config = _KEEP_OTHER_KEYS
    id: NodeId
    name: Annotated[str, Field(strict=True, max_length=MAX_NAME_CHARS)] | None = None
    fpgaLatency: Amount
    size: Amount = 0.0
    isBackwardNode: Flag = False
    colorClass: NodeId | Annotated[str, Field(strict=True, max_length=MAX_NAME_CHARS)] | None = None


class _Edge(BaseModel):
    model_config = _KEEP_OTHER_KEYS
    sourceId: NodeId
    destId: NodeId
    cost: Amount
    size: Amount = 0.0


class _File(BaseModel):
    model_config = _KEEP_OTHER_KEYS
    nodes: list[_Node] = Field(min_length=1)
    edges: list[_Edge]
    maxFPGAs: Annotated[int, Field(strict=True, ge=1, le=MAX_DEVICES)] = 1
    maxSizePerFPGA: Amount | None = None


def looks_like(data: object) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("nodes"), list)
        and isinstance(data.get("edges"), list)
        and ("maxFPGAs" in data or "maxSizePerFPGA" in data)
    )


def _describe(e: ValidationError, where: str, data: dict) -> str:
    """The validation message, naming the node (id and name) when the error is inside one."""
    msg = validation_message(e, where, data)
    loc = e.errors()[0]["loc"]
    if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
        item = data["nodes"][loc[1]]
        if isinstance(item, dict) and "id" in item:
            label = f"id {shown(item['id'])}"
            if isinstance(item.get("name"), str):
                label += f", {shown(item['name'])}"
            msg += f" (node {label})"
    return msg


def from_dict(data: dict, name: str, where: str) -> Graph:
    """Build the graph (and its cluster hints) from a parsed dnn-partitioning file."""
    try:
        f = _File.model_validate(data)
    except ValidationError as e:
        raise MtppError(_describe(e, where, data)) from None
    nodes, edges = f.nodes, f.edges
    ids = [nd.id for nd in nodes]
    if len(set(ids)) != len(ids):
        dup = next(x for x, c in Counter(ids).items() if c > 1)
        raise MtppError(f"{where}: node id {dup!r} appears more than once")
    index = {x: i for i, x in enumerate(ids)}
    raw = [nd.id if nd.name is None else nd.name for nd in nodes]
    raw = [str(x) for x in raw]
    names = (
        raw
        if len(set(raw)) == len(raw)
        else [f"{r}@{nd.id}" for r, nd in zip(raw, nodes, strict=True)]
    )
    work = [nd.fpgaLatency for nd in nodes]
    backward = np.array([bool(nd.isBackwardNode) for nd in nodes])

    ratios: Counter = Counter()
    cost = defaultdict(float)
    pairs = []
    for i, e in enumerate(edges):
        try:
            u, v = index[e.sourceId], index[e.destId]
        except KeyError as err:
            raise MtppError(f"{where}: edges[{i}] names unknown node id {err.args[0]!r}") from None
        c, s = e.cost, e.size
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
        if nd.size > 0:
            params.append((f"{names[i]}:size", nd.size, [i]))
    classes = defaultdict(list)
    for i, nd in enumerate(nodes):
        if nd.colorClass is not None:
            classes[nd.colorClass].append(i)
    cluster = {
        "name": f"{name}-accelerators",
        "description": "accelerators of the dnn-partitioning file (CPU cores ignored)",
        "devices": f.maxFPGAs,
        "fast_memory": "inf",
        "link_bandwidth": bw,
    }
    if f.maxSizePerFPGA is not None:
        cluster["capacity"] = f.maxSizePerFPGA
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
