"""The operator graph: per-node costs in numpy arrays, tensors/parameters/edges in CSR form.

A node ``v`` has ``work[v]`` (seconds on the reference device) and ``act[v]`` (bytes of its
working set: inputs + outputs, the default ``peak`` estimate). Each node produces tensors; a
tensor has a size in bytes and a set of consumer nodes, and costs io when it crosses a block
boundary (sent once by its producer's block, received once by every other consuming block).
An original graph has exactly one tensor per node (its output(s), ``sizeout``); a contracted
graph can have several per super-node, which keeps contraction exact.

Order edges ``(u, v)`` demand ``block(u) <= block(v)``. Normally every data edge is an order
edge; training graphs in the dnn-partitioning format order only their forward edges.

Parameters are entities with a size and a set of user nodes: a block stores a parameter once
if any of its nodes uses it. Co-location groups are nodes that must share a block.

Training plans (docs/training.md) read two optional per-node arrays: ``work_backward``
(seconds of the node's backward; default 2 x work, :attr:`Graph.backward_work`) and ``stash``
(bytes the node keeps per in-flight microbatch until its backward; default its output bytes,
:attr:`Graph.stash_bytes`). A graph without them behaves exactly as before.

networkx is imported only to report a cycle (an error path); the strong components that
coarsening needs are computed here (:func:`condensation_order`).
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from solver.core.errors import MtppError

IntArray = np.ndarray
FloatArray = np.ndarray

# Longest node, parameter or graph name a graph file may give (real ONNX names stay far below).
MAX_NAME_CHARS = 1000
# the largest work (seconds), size (bytes) or FLOP count of one node or weight: sums over any
# graph stay finite and every table stays readable; 1e30 bytes is a million yottabytes
MAX_AMOUNT = 1e30


def _csr(rows: np.ndarray, cols: np.ndarray, nrows: int) -> tuple[IntArray, IntArray]:
    """CSR (ptr, idx) of the pairs (rows[i], cols[i]), sorted by row then column."""
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    order = np.lexsort((cols, rows))
    ptr = np.zeros(nrows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=nrows), out=ptr[1:])
    return ptr, cols[order]


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (a[i], b[i]) pairs."""
    if len(a) == 0:
        return np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    pairs = np.unique(np.stack([np.asarray(a, np.int64), np.asarray(b, np.int64)], 1), axis=0)
    return pairs[:, 0], pairs[:, 1]


@dataclass(frozen=True, eq=False)
class Graph:
    """A DAG of operators with costs, ready for the evaluator and the solvers.

    Build one with :meth:`Graph.build` (validates everything); the arrays are read-only by
    convention. ``hints`` carries cluster facts a file states (devices, capacity, ...).
    """

    names: tuple[str, ...]
    work: FloatArray
    act: FloatArray
    t_producer: IntArray
    t_size: FloatArray
    t_ptr: IntArray
    t_cons: IntArray
    e_src: IntArray
    e_dst: IntArray
    p_names: tuple[str, ...]
    p_size: FloatArray
    p_ptr: IntArray
    p_users: IntArray
    group: IntArray
    name: str = "graph"
    flops: FloatArray | None = None
    op_types: tuple[str, ...] | None = None
    hints: dict = field(default_factory=dict)
    work_backward: FloatArray | None = None  # as given; None: 2 x work (backward_work)
    stash: FloatArray | None = None  # as given; None: the output bytes (stash_bytes)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        names: Sequence[str],
        work: Sequence[float] | np.ndarray,
        sizeout: Sequence[float] | np.ndarray,
        edges: Iterable[tuple[int, int]] | np.ndarray,
        *,
        ordered: Sequence[bool] | np.ndarray | None = None,
        params: Iterable[tuple[str, float, Sequence[int]]] = (),
        act: Sequence[float] | np.ndarray | None = None,
        colocate: Iterable[Sequence[int]] = (),
        name: str = "graph",
        flops: Sequence[float] | np.ndarray | None = None,
        op_types: Sequence[str] | None = None,
        hints: dict | None = None,
        work_backward: Sequence[float] | np.ndarray | None = None,
        stash: Sequence[float] | np.ndarray | None = None,
    ) -> Graph:
        """Validate and build a graph with one output tensor per node.

        ``edges`` are data edges (producer index, consumer index); ``ordered[i]`` says whether
        edge i also constrains the block order (default: all do). ``params`` are
        ``(name, bytes, user node indices)``. ``act`` defaults to each node's output bytes plus
        the output bytes of its distinct data predecessors (the largest single-op working set).
        ``work_backward`` (seconds) and ``stash`` (bytes per in-flight microbatch) are the
        optional training costs (default 2 x work and sizeout).

        >>> g = Graph.build(["a", "b"], [1.0, 2.0], [8, 4], [(0, 1)])
        >>> g.n, g.m, g.act.tolist()
        (2, 1, [8.0, 12.0])
        """
        names = _node_names(names)
        n = len(names)
        work_a = _costs(work, n, names, "work")
        size_a = _costs(sizeout, n, names, "sizeout")
        e = _edge_arrays(edges, ordered, n, names)
        t_ptr, t_cons = _csr(e.src, e.dst, n)
        act_a = _default_act(size_a, e) if act is None else _costs(act, n, names, "act")
        p = _param_arrays(params, n)
        g = cls(
            names=names,
            work=work_a,
            act=act_a,
            t_producer=np.arange(n, dtype=np.int64),
            t_size=size_a,
            t_ptr=t_ptr,
            t_cons=t_cons,
            e_src=e.order_src,
            e_dst=e.order_dst,
            p_names=p.names,
            p_size=p.size,
            p_ptr=p.ptr,
            p_users=p.users,
            group=_groups(colocate, n, names),
            name=name,
            flops=None if flops is None else _costs(flops, n, names, "flops"),
            op_types=None if op_types is None else tuple(op_types),
            hints=dict(hints or {}),
            work_backward=_optional_costs(work_backward, n, names, "work_backward"),
            stash=_optional_costs(stash, n, names, "stash"),
        )
        g.topo_order  # noqa: B018  -- raises MtppError naming a node on a cycle
        return g

    # ------------------------------------------------------------------ sizes
    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.names)

    @property
    def m(self) -> int:
        """Number of order edges."""
        return len(self.e_src)

    @property
    def num_tensors(self) -> int:
        return len(self.t_producer)

    @property
    def num_params(self) -> int:
        return len(self.p_size)

    @cached_property
    def sizeout(self) -> FloatArray:
        """Bytes of each node's output tensors."""
        return np.bincount(self.t_producer, weights=self.t_size, minlength=self.n)

    @cached_property
    def backward_work(self) -> FloatArray:
        """Seconds of each node's backward (gradients) on the reference device: the given
        ``work_backward``, or 2 x work (two matrix products per forward one)."""
        return 2.0 * self.work if self.work_backward is None else self.work_backward

    @cached_property
    def stash_bytes(self) -> FloatArray:
        """Bytes each node keeps per in-flight microbatch until its backward runs: the given
        ``stash``, or its output bytes (sizeout)."""
        return self.sizeout if self.stash is None else self.stash

    @cached_property
    def index(self) -> dict[str, int]:
        """Node name -> node index."""
        return {name: i for i, name in enumerate(self.names)}

    @cached_property
    def pair_tensor(self) -> IntArray:
        """For each (tensor, consumer) pair in ``t_cons``, the tensor index."""
        return np.repeat(np.arange(self.num_tensors), np.diff(self.t_ptr))

    @cached_property
    def produced_by(self) -> list[list[int]]:
        """For each node, the tensors it produces."""
        out: list[list[int]] = [[] for _ in range(self.n)]
        for t, p in enumerate(self.t_producer.tolist()):
            out[p].append(t)
        return out

    @cached_property
    def read_by(self) -> list[list[int]]:
        """For each node, the tensors it reads."""
        out: list[list[int]] = [[] for _ in range(self.n)]
        for t, c in zip(self.pair_tensor.tolist(), self.t_cons.tolist(), strict=True):
            out[c].append(t)
        return out

    @cached_property
    def pair_param(self) -> IntArray:
        """For each (parameter, user) pair in ``p_users``, the parameter index."""
        return np.repeat(np.arange(self.num_params), np.diff(self.p_ptr))

    @cached_property
    def data_edges(self) -> tuple[IntArray, IntArray]:
        """Distinct (producer node, consumer node) pairs of all tensors."""
        return _unique_pairs(self.t_producer[self.pair_tensor], self.t_cons)

    @cached_property
    def succ(self) -> tuple[IntArray, IntArray]:
        """CSR of order-edge successors."""
        return _csr(self.e_src, self.e_dst, self.n)

    @cached_property
    def pred(self) -> tuple[IntArray, IntArray]:
        """CSR of order-edge predecessors."""
        return _csr(self.e_dst, self.e_src, self.n)

    @cached_property
    def param_bytes_total(self) -> float:
        return float(self.p_size.sum())

    @cached_property
    def groups(self) -> list[IntArray]:
        """Co-location groups with two or more nodes, as arrays of node indices."""
        g = self.group
        ids = np.unique(g[g >= 0])
        out = [np.flatnonzero(g == i) for i in ids]
        return [x for x in out if len(x) > 1]

    @cached_property
    def fingerprint(self) -> str:
        """Hash of node names and order edges: a plan made for another graph is detected."""
        h = hashlib.sha256()
        h.update("\x00".join(self.names).encode())
        h.update(np.ascontiguousarray(self.e_src).tobytes())
        h.update(np.ascontiguousarray(self.e_dst).tobytes())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ order
    @cached_property
    def topo_order(self) -> IntArray:
        """A topological order of the order edges (Kahn, smallest index first among ties)."""
        ptr, idx = self.succ
        indeg = np.bincount(self.e_dst, minlength=self.n)
        ready = [int(v) for v in np.flatnonzero(indeg == 0)]
        heapq.heapify(ready)
        indeg = indeg.tolist()
        ptr_l, idx_l = ptr.tolist(), idx.tolist()
        out = []
        while ready:
            v = heapq.heappop(ready)
            out.append(v)
            for j in range(ptr_l[v], ptr_l[v + 1]):
                w = idx_l[j]
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(ready, w)
        if len(out) != self.n:
            raise MtppError(self._cycle_message())
        return np.asarray(out, dtype=np.int64)

    def _cycle_message(self) -> str:
        import networkx as nx  # heavy: networkx (about 0.8 s to import)

        cyc = nx.find_cycle(self.to_networkx())
        path = " -> ".join(self.names[u] for u, _ in cyc[:6])
        more = " -> ..." if len(cyc) > 6 else f" -> {self.names[cyc[0][0]]}"
        return f"the graph has a cycle through node {self.names[cyc[0][0]]!r}: {path}{more}"

    @cached_property
    def topo_rank(self) -> IntArray:
        """Position of each node in :attr:`topo_order`."""
        r = np.empty(self.n, dtype=np.int64)
        r[self.topo_order] = np.arange(self.n)
        return r

    def to_networkx(self):
        """The order edges as a networkx DiGraph on node indices (for algorithms that need it)."""
        import networkx as nx  # heavy: networkx (about 0.8 s to import)

        d = nx.DiGraph()
        d.add_nodes_from(range(self.n))
        d.add_edges_from(zip(self.e_src.tolist(), self.e_dst.tolist(), strict=True))
        return d

    def ancestors(self, v: int) -> IntArray:
        """Indices of the nodes with an order path to ``v`` (``v`` excluded)."""
        return _reach(self.pred, v, self.n)

    def descendants(self, v: int) -> IntArray:
        """Indices of the nodes reachable from ``v`` by order edges (``v`` excluded)."""
        return _reach(self.succ, v, self.n)

    def node(self, name: str) -> int:
        """Index of the node called ``name``; a clear error if there is none."""
        try:
            return self.index[name]
        except KeyError:
            raise MtppError(f"no node named {name!r} in graph {self.name!r}") from None

    def with_work(self, work: np.ndarray) -> Graph:
        """The same graph with other per-node work (e.g. roofline times for another cluster);
        a given ``work_backward`` is kept, the default (2 x work) follows the new work."""
        return replace(self, work=_costs(work, self.n, self.names, "work"))


def _node_names(names: Sequence[str]) -> tuple[str, ...]:
    """The node names as strings; refuses an empty graph and a name given twice."""
    names = tuple(str(x) for x in names)
    if not names:
        raise MtppError("the graph has no nodes")
    if len(set(names)) != len(names):
        seen: set[str] = set()
        dup = next(x for x in names if x in seen or seen.add(x))
        raise MtppError(f"node name {dup!r} appears more than once; node names must be unique")
    return names


@dataclass(frozen=True)
class _EdgeArrays:
    """Distinct data edges (``src``, ``dst``) and the distinct order edges among them."""

    src: IntArray
    dst: IntArray
    order_src: IntArray
    order_dst: IntArray


def _edge_arrays(edges, ordered, n: int, names: Sequence[str]) -> _EdgeArrays:
    """Check the edges (node indices, no self-loop, one ``ordered`` flag each; default: all
    order the blocks) and return them without duplicates."""
    try:
        e = np.asarray(edges if isinstance(edges, np.ndarray) else list(edges), np.int64)
        e = e.reshape(-1, 2)
    except (TypeError, ValueError, OverflowError):
        raise MtppError("edges must be pairs of node indices") from None
    if len(e) and (e.min() < 0 or e.max() >= n):
        bad = e[(e < 0).any(1) | (e >= n).any(1)][0]
        raise MtppError(f"edge {tuple(bad.tolist())} refers to a node index outside 0..{n - 1}")
    loops = e[:, 0] == e[:, 1]
    if loops.any():
        raise MtppError(f"edge from node {names[e[loops][0, 0]]!r} to itself (self-loop)")
    ordm = np.ones(len(e), bool) if ordered is None else np.asarray(ordered, dtype=bool)
    if len(ordm) != len(e):
        raise MtppError("the 'ordered' flags must match the edges one to one")
    src, dst = _unique_pairs(e[:, 0], e[:, 1])
    osrc, odst = _unique_pairs(e[ordm, 0], e[ordm, 1])
    return _EdgeArrays(src, dst, osrc, odst)


def _default_act(size: FloatArray, e: _EdgeArrays) -> FloatArray:
    """Each node's output bytes plus those of its distinct data predecessors."""
    act = size.copy()
    np.add.at(act, e.dst, size[e.src])
    return act


@dataclass(frozen=True)
class _ParamArrays:
    """Parameter entities: names, bytes, and their users in CSR form (``ptr``, ``users``)."""

    names: tuple[str, ...]
    size: FloatArray
    ptr: IntArray
    users: IntArray


def _param_arrays(params: Iterable[tuple[str, float, Sequence[int]]], n: int) -> _ParamArrays:
    """Check every ``(name, bytes, user node indices)`` and store them as arrays."""
    p_names, p_size, p_rows, p_cols = [], [], [], []
    for j, (pname, pbytes, users) in enumerate(params):
        p_size.append(_param_bytes(pname, pbytes))
        us = _param_users(pname, users, n)
        p_names.append(str(pname))
        p_rows += [j] * len(us)
        p_cols += us
    ptr, users = _csr(np.asarray(p_rows, np.int64), np.asarray(p_cols, np.int64), len(p_names))
    return _ParamArrays(tuple(p_names), np.asarray(p_size, dtype=np.float64), ptr, users)


def _param_bytes(pname: str, pbytes: object) -> float:
    """A parameter's bytes: finite, >= 0 and at most MAX_AMOUNT."""
    try:
        b = float(pbytes) if not isinstance(pbytes, (bool, str)) else math.nan
    except (TypeError, ValueError, OverflowError):
        b = math.nan
    if not np.isfinite(b) or b < 0:
        raise MtppError(f"parameter {pname!r}: bytes must be finite and >= 0, got {pbytes!r}")
    if b > MAX_AMOUNT:
        raise MtppError(f"parameter {pname!r}: bytes must be at most {MAX_AMOUNT:g}, got {b:g}")
    return b


def _param_users(pname: str, users: Iterable[int], n: int) -> list[int]:
    """A parameter's distinct user nodes, sorted: at least one, each an index in 0..n-1."""
    users = list(users) if not isinstance(users, np.ndarray) else users.tolist()
    if all(type(u) is int and -(2**63) <= u < 2**63 for u in users):  # the common case,
        us = sorted(set(users))  # without numpy's per-call cost (1,500 parameters: 30 ms)
    else:
        try:
            us = np.unique(np.asarray(users, dtype=np.int64)).tolist()
        except (TypeError, ValueError, OverflowError):
            raise MtppError(f"parameter {pname!r}: users must be node indices") from None
    if not us:
        raise MtppError(f"parameter {pname!r} has no user node")
    if us[0] < 0 or us[-1] >= n:
        raise MtppError(f"parameter {pname!r} names a user node index outside 0..{n - 1}")
    return us


def _reach(csr: tuple[IntArray, IntArray], v: int, n: int) -> IntArray:
    ptr, idx = csr
    seen = np.zeros(n, dtype=bool)
    stack = [int(v)]
    while stack:
        u = stack.pop()
        for w in idx[ptr[u] : ptr[u + 1]].tolist():
            if not seen[w]:
                seen[w] = True
                stack.append(w)
    seen[v] = False
    return np.flatnonzero(seen)


def _costs(values, n: int, names: Sequence[str], what: str) -> FloatArray:
    """``values`` as a float array of one finite, non-negative number per node."""
    if not isinstance(values, np.ndarray):
        values = list(values)
        for i, x in enumerate(values[:n]):
            if isinstance(x, (bool, str)) or x is None:  # numpy would coerce these silently
                raise MtppError(f"node {names[i]!r}: {what} must be a number, got {x!r:.40}")
    try:
        a = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise MtppError(f"{what}: expected one number per node") from None
    if a.shape != (n,):
        raise MtppError(f"{what}: expected {n} values (one per node), got shape {a.shape}")
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise MtppError(f"node {names[i]!r}: {what} must be finite and >= 0, got {float(a[i])!r}")
    if len(a) and a.max() > MAX_AMOUNT:
        i = int(np.argmax(a))
        raise MtppError(f"node {names[i]!r}: {what} must be at most {MAX_AMOUNT:g}, got {a[i]:g}")
    return a


def _optional_costs(values, n: int, names: Sequence[str], what: str) -> FloatArray | None:
    """:func:`_costs` of an optional per-node array (None stays None: the default applies)."""
    return None if values is None else _costs(values, n, names, what)


def _groups(colocate: Iterable[Sequence[int]], n: int, names: Sequence[str]) -> IntArray:
    """Union-find over the co-location lists; -1 for nodes in no group."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    member = np.zeros(n, dtype=bool)
    for grp in colocate:
        g = [int(x) for x in grp]
        for x in g:
            if not 0 <= x < n:
                raise MtppError(f"co-location group names a node index {x} outside 0..{n - 1}")
        member[g] = True
        for x in g[1:]:
            a, b = find(g[0]), find(x)
            if a != b:
                parent[b] = a
    roots = np.array([find(i) for i in range(n)])
    out = np.full(n, -1, dtype=np.int64)
    _, lab = np.unique(roots[member], return_inverse=True)
    out[member] = lab
    return out


# ---------------------------------------------------------------------- derived graphs
def contract(g: Graph, labels: np.ndarray, names: Sequence[str] | None = None) -> Graph:
    """Merge nodes with equal labels (0..L-1) into super-nodes, exactly.

    Work adds up, ``act`` takes the maximum (peak is a maximum over ops), tensors keep their
    identity with consumers mapped to super-nodes (a tensor consumed only inside its own
    super-node disappears), parameters map their users. For any plan that keeps each super-node
    in one block, the contracted graph has exactly the block costs of the original.
    The caller must make sure the quotient has no cycle (see :func:`coarsen_labels`).
    """
    labels = np.asarray(labels, dtype=np.int64)
    L = int(labels.max()) + 1 if len(labels) else 0
    work = np.bincount(labels, weights=g.work, minlength=L)
    act = np.zeros(L)
    np.maximum.at(act, labels, g.act)
    tp = labels[g.t_producer]
    pt = g.pair_tensor
    cons = labels[g.t_cons]
    keep = cons != tp[pt]
    pt, cons = _unique_pairs(pt[keep], cons[keep])
    live = np.unique(pt)
    remap = np.full(g.num_tensors, -1, dtype=np.int64)
    remap[live] = np.arange(len(live))
    t_ptr, t_cons = _csr(remap[pt], cons, len(live))
    es, ed = labels[g.e_src], labels[g.e_dst]
    k = es != ed
    es, ed = _unique_pairs(es[k], ed[k])
    pp, pu = _unique_pairs(g.pair_param, labels[g.p_users])
    p_ptr, p_users = _csr(pp, pu, g.num_params)
    if names is None:
        first = np.full(L, -1, dtype=np.int64)
        for i in range(g.n - 1, -1, -1):
            first[labels[i]] = i
        names = [g.names[i] for i in first]
    flops = None if g.flops is None else np.bincount(labels, weights=g.flops, minlength=L)
    backward = None  # the default 2 x work adds up exactly
    if g.work_backward is not None:
        backward = np.bincount(labels, weights=g.work_backward, minlength=L)
    # stash adds up; the default (sizeout) would lose the tensors a super-node consumes inside
    stash = np.bincount(labels, weights=g.stash_bytes, minlength=L)
    return Graph(
        names=tuple(names),
        work=work,
        act=act,
        t_producer=tp[live],
        t_size=g.t_size[live],
        t_ptr=t_ptr,
        t_cons=t_cons,
        e_src=es,
        e_dst=ed,
        p_names=g.p_names,
        p_size=g.p_size,
        p_ptr=p_ptr,
        p_users=p_users,
        group=np.full(L, -1, dtype=np.int64),
        name=g.name,
        flops=flops,
        op_types=None,
        hints=dict(g.hints),
        work_backward=backward,
        stash=stash,
    )


def coarsen_labels(g: Graph) -> np.ndarray:
    """Labels that merge every co-location group and every cycle the merge creates.

    Nodes of a group must share a block; if the quotient then has a cycle, every node on it
    must share that block too (the block order is a total order). The result labels are
    numbered in a topological order of the (acyclic) quotient: the order networkx's
    ``topological_sort(condensation(...))`` gives, reproduced by :func:`condensation_order`.
    """
    lab = np.arange(g.n, dtype=np.int64)
    for members in g.groups:
        lab[members] = members[0]
    _, lab = np.unique(lab, return_inverse=True)
    L = int(lab.max()) + 1
    es, ed = lab[g.e_src], lab[g.e_dst]
    k = es != ed
    return condensation_order(L, es[k].tolist(), ed[k].tolist())[lab]


# Written by hand rather than taken from networkx: importing networkx costs about 0.2 s of
# every solve's start-up, and this is the only part of it a solve needs. It reproduces
# networkx's order exactly (Tarjan's algorithm with Nuutila's modification as
# ``strongly_connected_components`` runs it, then ``topological_generations`` of the
# condensation), so the coarse graph's numbering, and every plan found on it, stay as they
# were; tests/core/test_condensation.py compares both on random graphs.
def condensation_order(n: int, src: list[int], dst: list[int]) -> np.ndarray:
    """For each of the ``n`` nodes of the directed graph with edges ``src[i] -> dst[i]``, the
    position of its strongly connected component in a topological order of the components."""
    succ: list[dict[int, None]] = [{} for _ in range(n)]  # successors, first occurrence order
    for u, v in zip(src, dst, strict=True):
        succ[u][v] = None
    comp = _strong_components(succ)
    nc = int(comp.max()) + 1 if n else 0
    csucc: list[dict[int, None]] = [{} for _ in range(nc)]
    for u in range(n):
        for v in succ[u]:
            if comp[u] != comp[v]:
                csucc[comp[u]][comp[v]] = None
    pos = np.empty(nc, dtype=np.int64)
    pos[_topological_order(csucc)] = np.arange(nc)
    return pos[comp]


def _strong_components(succ: list[dict[int, None]]) -> np.ndarray:
    """Component number of every node, components numbered in the order Tarjan's algorithm
    (non-recursive, Nuutila's variant, nodes tried in index order) completes them."""
    n = len(succ)
    preorder = [0] * n  # 0 = not visited yet
    lowlink = [0] * n
    comp = np.full(n, -1, dtype=np.int64)
    scc_stack: list[int] = []
    neighbors = [iter(s) for s in succ]
    counter, found = 0, 0
    for source in range(n):
        if comp[source] >= 0:
            continue
        queue = [source]
        while queue:
            v = queue[-1]
            if not preorder[v]:
                counter += 1
                preorder[v] = counter
            descended = False
            for w in neighbors[v]:
                if not preorder[w]:
                    queue.append(w)
                    descended = True
                    break
            if descended:
                continue
            low = preorder[v]
            for w in succ[v]:
                if comp[w] < 0:
                    low = min(low, lowlink[w] if preorder[w] > preorder[v] else preorder[w])
            lowlink[v] = low
            queue.pop()
            if low == preorder[v]:
                comp[v] = found
                while scc_stack and preorder[scc_stack[-1]] > preorder[v]:
                    comp[scc_stack.pop()] = found
                found += 1
            else:
                scc_stack.append(v)
    return comp


def _topological_order(succ: list[dict[int, None]]) -> list[int]:
    """Kahn's algorithm generation by generation, as networkx's ``topological_sort``."""
    indegree = [0] * len(succ)
    for s in succ:
        for v in s:
            indegree[v] += 1
    generation = [v for v in range(len(succ)) if indegree[v] == 0]
    order: list[int] = []
    while generation:
        order.extend(generation)
        following = []
        for u in generation:
            for v in succ[u]:
                indegree[v] -= 1
                if indegree[v] == 0:
                    following.append(v)
        generation = following
    return order


def coarse_view(g: Graph) -> tuple[Graph, np.ndarray]:
    """The graph with co-location groups (and the cycles they close) merged, and the label of
    every original node; cached on the graph. Solvers work on it and map back with
    ``assignment = coarse_assignment[labels]``."""
    cached = g.__dict__.get("_coarse")
    if cached is None:
        labels = coarsen_labels(g)
        cached = (contract(g, labels), labels)
        g.__dict__["_coarse"] = cached
    return cached


def induced_subgraph(g: Graph, nodes: Sequence[int] | np.ndarray) -> Graph:
    """The subgraph on ``nodes`` (in the given order); tensors and edges from outside vanish."""
    nodes = np.asarray(nodes, dtype=np.int64)
    new = np.full(g.n, -1, dtype=np.int64)
    new[nodes] = np.arange(len(nodes))
    inside = new >= 0
    tkeep = np.flatnonzero(inside[g.t_producer])
    tmap = np.full(g.num_tensors, -1, dtype=np.int64)
    tmap[tkeep] = np.arange(len(tkeep))
    pt = g.pair_tensor
    keep = inside[g.t_producer[pt]] & inside[g.t_cons]
    t_ptr, t_cons = _csr(tmap[pt[keep]], new[g.t_cons[keep]], len(tkeep))
    ke = inside[g.e_src] & inside[g.e_dst]
    kp = inside[g.p_users]
    pp, pu = g.pair_param[kp], new[g.p_users[kp]]
    used = np.unique(pp)
    premap = np.full(g.num_params, -1, dtype=np.int64)
    premap[used] = np.arange(len(used))
    p_ptr, p_users = _csr(premap[pp], pu, len(used))
    grp = g.group[nodes]
    return Graph(
        names=tuple(g.names[i] for i in nodes),
        work=g.work[nodes],
        act=g.act[nodes],
        t_producer=new[g.t_producer[tkeep]],
        t_size=g.t_size[tkeep],
        t_ptr=t_ptr,
        t_cons=t_cons,
        e_src=new[g.e_src[ke]],
        e_dst=new[g.e_dst[ke]],
        p_names=tuple(g.p_names[i] for i in used),
        p_size=g.p_size[used],
        p_ptr=p_ptr,
        p_users=p_users,
        group=grp,
        name=f"{g.name}[sub]",
        flops=None if g.flops is None else g.flops[nodes],
        op_types=None if g.op_types is None else tuple(g.op_types[i] for i in nodes),
        hints=dict(g.hints),
        work_backward=None if g.work_backward is None else g.work_backward[nodes],
        stash=None if g.stash is None else g.stash[nodes],
    )
