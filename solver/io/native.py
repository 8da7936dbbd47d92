"""The native mtpp graph JSON format (documented in docs/graph-format.md).

{"format": "mtpp-graph", "version": 1, "name": "toy",
 "cluster": {"devices": 2, "link_bandwidth": "1GB/s"},           (optional hints)
 "nodes": [{"name": "a", "work": 0.001, "sizeout": 4096}, ...],   (act, flops, op_type optional)
 "edges": [["a", "b"], {"from": "b", "to": "c", "ordered": false}],
 "params": [{"name": "w", "bytes": 1024, "users": ["a", "c"]}],
 "colocate": [["a", "c"]]}
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from solver.errors import MtppError
from solver.graph import Graph

FORMAT = "mtpp-graph"
VERSION = 1


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    work: float = Field(ge=0)
    sizeout: float = Field(default=0.0, ge=0)
    act: float | None = Field(default=None, ge=0)
    flops: float | None = Field(default=None, ge=0)
    op_type: str | None = None


class _Edge(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    src: str = Field(alias="from")
    dst: str = Field(alias="to")
    ordered: bool = True


class _Param(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    bytes: float = Field(ge=0)
    users: list[str] = Field(min_length=1)


class _GraphFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str
    version: int = VERSION
    name: str = "graph"
    cluster: dict[str, Any] | None = None
    nodes: list[_Node] = Field(min_length=1)
    edges: list[_Edge | tuple[str, str]] = []
    params: list[_Param] = []
    colocate: list[list[str]] = []


def looks_like(data: object) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT


def from_dict(data: dict, where: str = "graph") -> Graph:
    """Validate a native graph mapping and build the :class:`Graph`."""
    try:
        f = _GraphFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise MtppError(f"{where}: key {loc!r}: {err['msg']}") from None
    if f.version != VERSION:
        raise MtppError(
            f"{where}: graph format version {f.version} is not supported (use {VERSION})"
        )
    names = [n.name for n in f.nodes]
    index: dict[str, int] = {}
    for i, nm in enumerate(names):
        if nm in index:
            raise MtppError(f"{where}: node name {nm!r} appears more than once")
        index[nm] = i

    def idx(name: str, what: str) -> int:
        try:
            return index[name]
        except KeyError:
            raise MtppError(f"{where}: {what} names unknown node {name!r}") from None

    edges, ordered = [], []
    for e in f.edges:
        s, d, o = (e.src, e.dst, e.ordered) if isinstance(e, _Edge) else (e[0], e[1], True)
        edges.append((idx(s, "an edge"), idx(d, "an edge")))
        ordered.append(o)
    params = [
        (p.name, p.bytes, [idx(u, f"parameter {p.name!r}") for u in p.users]) for p in f.params
    ]
    coloc = [[idx(u, "a co-location group") for u in grp] for grp in f.colocate]
    has_act = [n.act is not None for n in f.nodes]
    if any(has_act) and not all(has_act):
        raise MtppError(f"{where}: give 'act' for every node or for none")
    has_flops = any(n.flops is not None for n in f.nodes)
    return Graph.build(
        names,
        [n.work for n in f.nodes],
        [n.sizeout for n in f.nodes],
        np.asarray(edges, dtype=np.int64).reshape(-1, 2),
        ordered=ordered,
        params=params,
        act=[n.act for n in f.nodes] if all(has_act) else None,
        colocate=coloc,
        name=f.name,
        flops=[n.flops or 0.0 for n in f.nodes] if has_flops else None,
        op_types=[n.op_type or "" for n in f.nodes] if any(n.op_type for n in f.nodes) else None,
        hints={"cluster": f.cluster} if f.cluster else {},
    )


def to_dict(g: Graph) -> dict:
    """The native JSON mapping of a graph with one output tensor per node (round-trips)."""
    if g.num_tensors != g.n or not np.array_equal(g.t_producer, np.arange(g.n)):
        raise MtppError("only graphs with one output tensor per node can be written as mtpp-graph")
    nodes = []
    for i, nm in enumerate(g.names):
        d: dict[str, Any] = {"name": nm, "work": float(g.work[i]), "sizeout": float(g.t_size[i])}
        d["act"] = float(g.act[i])
        if g.flops is not None:
            d["flops"] = float(g.flops[i])
        if g.op_types is not None and g.op_types[i]:
            d["op_type"] = g.op_types[i]
        nodes.append(d)
    ordered = {(int(u), int(v)) for u, v in zip(g.e_src, g.e_dst, strict=True)}
    src, dst = g.data_edges
    edges: list[Any] = []
    for u, v in zip(src.tolist(), dst.tolist(), strict=True):
        if (u, v) in ordered:
            edges.append([g.names[u], g.names[v]])
        else:
            edges.append({"from": g.names[u], "to": g.names[v], "ordered": False})
    params = [
        {
            "name": g.p_names[p],
            "bytes": float(g.p_size[p]),
            "users": [g.names[u] for u in g.p_users[g.p_ptr[p] : g.p_ptr[p + 1]]],
        }
        for p in range(g.num_params)
    ]
    out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "name": g.name, "nodes": nodes}
    if g.hints.get("cluster"):
        out["cluster"] = g.hints["cluster"]
    out["edges"] = edges
    out["params"] = params
    out["colocate"] = [[g.names[v] for v in m] for m in g.groups]
    return out
