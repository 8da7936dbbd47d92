"""The native mtpp graph JSON format (documented in docs/graph-format.md).

{"format": "mtpp-graph", "version": 1, "name": "toy",
 "cluster": {"devices": 2, "link_bandwidth": "1GB/s"},           (optional hints)
 "nodes": [{"name": "a", "work": 0.001, "sizeout": 4096}, ...],   (act, flops, op_type,
                                                                   work_backward, stash optional)
 "edges": [["a", "b"], {"from": "b", "to": "c", "ordered": false}],
 "params": [{"name": "w", "bytes": 1024, "users": ["a", "c"]}],
 "colocate": [["a", "c"]]}
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from solver.core.errors import MtppError
from solver.core.files import shown, validation_message
from solver.core.graph import MAX_NAME_CHARS, Graph

FORMAT = "mtpp-graph"
VERSION = 1

# Numbers are strict: a boolean, a string or null where a number belongs is refused, not coerced;
# NaN, infinities and integers too large for a float are refused too.
Amount = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Name = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_NAME_CHARS)]
# defer_build: the validators are built on the first graph file read, not at import (start-up)
_STRICT = ConfigDict(extra="forbid", strict=True, defer_build=True)


class _Node(BaseModel):
    model_config = _STRICT
    name: Name
    work: Amount
    sizeout: Amount = 0.0
    act: Amount | None = None
    flops: Amount | None = None
    op_type: Annotated[str, Field(max_length=MAX_NAME_CHARS)] | None = None
    work_backward: Amount | None = None  # training: seconds of the backward (default 2 x work)
    stash: Amount | None = None  # training: bytes kept per in-flight microbatch (default sizeout)


class _Edge(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, defer_build=True)
    src: Name = Field(alias="from")
    dst: Name = Field(alias="to")
    ordered: bool = True


class _Param(BaseModel):
    model_config = _STRICT
    name: Name
    bytes: Amount
    users: list[Name] = Field(min_length=1)


class _GraphFile(BaseModel):
    # not strict as a whole: an edge may be a JSON list [from, to] (a tuple in lax mode)
    model_config = ConfigDict(extra="forbid", defer_build=True)
    format: str
    version: Annotated[int, Field(strict=True)] = VERSION
    name: Annotated[str, Field(strict=True, max_length=MAX_NAME_CHARS)] = "graph"
    cluster: dict[str, Any] | None = None
    nodes: list[_Node] = Field(min_length=1)
    edges: list[_Edge | tuple[Name, Name]] = []
    params: list[_Param] = []
    colocate: list[list[Name]] = []


def looks_like(data: object) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT


def from_dict(data: dict, where: str = "graph") -> Graph:
    """Validate a native graph mapping and build the :class:`Graph`."""
    try:
        f = _GraphFile.model_validate(data)
    except ValidationError as e:
        raise MtppError(_describe(e, where, data)) from None
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
    seen: set[str] = set()
    for p in f.params:  # two entries of one name would silently store the weight twice
        if p.name in seen:
            raise MtppError(f"{where}: parameter name {p.name!r} appears more than once")
        seen.add(p.name)
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
        work_backward=_per_node(f.nodes, "work_backward", lambda n: 2.0 * n.work),
        stash=_per_node(f.nodes, "stash", lambda n: n.sizeout),
    )


def _per_node(nodes: list[_Node], key: str, default) -> list[float] | None:
    """The optional training field ``key`` of every node (``default(node)`` where a node
    omits it), or None when no node gives it (the graph's own default applies)."""
    if all(getattr(n, key) is None for n in nodes):
        return None
    return [default(n) if getattr(n, key) is None else getattr(n, key) for n in nodes]


def _describe(e: ValidationError, where: str, data: dict) -> str:
    """The validation message, naming the node when the error is inside one."""
    msg = validation_message(e, where, data)
    loc = e.errors()[0]["loc"]
    nodes = data.get("nodes")
    if len(loc) >= 2 and loc[0] == "nodes" and isinstance(nodes, list):
        i = loc[1]
        if isinstance(i, int) and 0 <= i < len(nodes) and isinstance(nodes[i], dict):
            name = nodes[i].get("name")
            if isinstance(name, str):
                msg += f" (node {shown(name)})"
    return msg


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
        if g.work_backward is not None:
            d["work_backward"] = float(g.work_backward[i])
        if g.stash is not None:
            d["stash"] = float(g.stash[i])
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
