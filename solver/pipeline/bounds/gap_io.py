"""What a bin of the chain io program must pay inside one gap (docs/bounds.md, "chain io",
"interior cuts and io density").

A gap g holds the nodes between separators s_{g-1} and s_g; the chain program treats its
volume (``size``: work, or ``B_mem * work + charged`` bytes) as divisible. Two facts about
every plan sharpen that:

- **interior cut** of gap g (0 < g < m): when a block boundary falls strictly inside the gap
  (the gap nodes D in blocks up to it hold some volume and leave some: 0 < size(D) <
  size(gap)), the tensors crossing it (the gap cut's tensors: produced by s_{g-1} or in D,
  consumed in the rest of the gap or by s_g, separator-to-separator ones left out) are at
  least the least such cut. ``inf`` when no boundary can: fewer than two nodes of positive
  size. It is at least the gap cut (the least cut over every D).
- **io density** of gap g: every set S of gap-g nodes with size(S) > 0 has
  ``io(S) >= density * size(S)``, io(S) the link seconds of the tensors with members on both
  sides of S (the evaluator charges each at least once to the block S when S is a block).

Both are computed by max-flows (OR-Tools SimpleMaxFlow) on the gap's own subgraph, on
integer capacities rounded down, so each value is at most the exact one (a relaxation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.core.graph import Graph

MAX_GAP_NODES = 2_000  # larger gaps get no interior cut and no density (no claim)
MAX_PAIRS = 32  # (first, last) node pairs tried for an interior cut; more: no claim
DENSITY_STEPS = 12  # bisection steps of the density (each one max-flow)
DENSITY_UNITS = 1024.0  # capacity units per byte in the density's network


@dataclass(frozen=True)
class GapIo:
    """Per gap (m + 1 entries): the interior cut and the io density, in bytes and bytes per
    unit of size (divide by the link bandwidth for seconds)."""

    interior: np.ndarray
    density: np.ndarray


@dataclass(frozen=True)
class GapGraph:
    """The gap's own subgraph: ``local`` = [s_{g-1}, gap nodes in topological order, s_g]
    (coarse ids), the tensors of the gap cut as (producer index, consumer indices, bytes),
    and the order arcs (a, b) meaning "b on the left forces a on the left"."""

    local: list[int]
    tensors: list[tuple[int, list[int], int]]
    order: list[tuple[int, int]]


def gap_graph(cg: Graph, members: list[int], left: int, right: int, pos, g: int) -> GapGraph:
    """The subgraph the gap cut of gap g runs on (as :func:`chain_io.gap_cuts` counts it:
    tensors produced by s_{g-1} or a gap node with a consumer inside, separator-to-separator
    tensors of s_{g-1} left out, bytes as integers)."""
    rank = cg.topo_rank
    local = [left, *sorted(members, key=lambda v: rank[v]), right]
    idx = {v: i for i, v in enumerate(local)}
    tensors = []
    for v in local[:-1]:
        for t in cg.produced_by[v]:
            cons = cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]]
            if v == left and (pos[cons] > g - 1).any():
                continue  # a separator-to-separator tensor: the chain io counts it
            inside = [idx[c] for c in cons.tolist() if c in idx and c != v]
            size = int(cg.t_size[t])
            if inside and size > 0:
                tensors.append((idx[v], inside, size))
    order = []
    for b in local:
        for a in _preds(cg, b):
            if a in idx:
                order.append((idx[b], idx[a]))
    return GapGraph(local, tensors, order)


def interior_cut(gg: GapGraph, size: np.ndarray) -> float:
    """The least cut (bytes) of the gap with some volume on each side, or ``inf`` when no
    boundary can fall strictly inside it; the gap cut's own minimum when the pairs to try
    exceed MAX_PAIRS (returned as -1: no claim above the gap cut)."""
    from ortools.graph.python import max_flow  # heavy (OR-Tools): only when the bound runs

    n = len(gg.local)
    inner = range(1, n - 1)
    positive = [i for i in inner if size[gg.local[i]] > 0]
    if len(positive) < 2:
        return math.inf
    first, last = _extreme_nodes(gg, positive, n)
    pairs = [(a, b) for a in first for b in last if a != b]
    if len(pairs) > MAX_PAIRS or not pairs:
        return -1.0
    total = sum(size for _, _, size in gg.tensors)
    never = total + 1
    f = max_flow.SimpleMaxFlow()
    nxt = n
    for p, cons, size in gg.tensors:
        f.add_arc_with_capacity(p, nxt, size)
        for c in cons:
            f.add_arc_with_capacity(nxt, c, never)
        nxt += 1
    for b, a in gg.order:
        f.add_arc_with_capacity(b, a, never)
    pin_left = {a: f.add_arc_with_capacity(0, a, 0) for a in first}
    pin_right = {b: f.add_arc_with_capacity(b, n - 1, 0) for b in last}
    best = math.inf
    for a, b in pairs:
        f.set_arc_capacity(pin_left[a], never)
        f.set_arc_capacity(pin_right[b], never)
        if f.solve(0, n - 1) != f.OPTIMAL:
            return -1.0  # no claim
        if f.optimal_flow() < never:  # else b is an ancestor of a: no such boundary
            best = min(best, float(f.optimal_flow()))
        f.set_arc_capacity(pin_left[a], 0)
        f.set_arc_capacity(pin_right[b], 0)
    return best


def _extreme_nodes(gg: GapGraph, positive: list[int], n: int) -> tuple[list[int], list[int]]:
    """The positive-size gap nodes with no positive-size ancestor in the gap (every D with
    volume holds one) and those with no positive-size descendant (every D that leaves volume
    leaves one)."""
    preds: list[list[int]] = [[] for _ in range(n)]
    for b, a in gg.order:
        preds[b].append(a)
    is_pos = np.zeros(n, dtype=bool)
    is_pos[positive] = True
    above = np.zeros(n, dtype=bool)  # some positive gap node is a strict ancestor
    below = np.zeros(n, dtype=bool)  # ... a strict descendant
    for v in range(1, n - 1):  # local order is topological
        above[v] = any((0 < a < n - 1) and (is_pos[a] or above[a]) for a in preds[v])
    for v in range(n - 2, 0, -1):
        for a in preds[v]:
            if 0 < a < n - 1 and (is_pos[v] or below[v]):
                below[a] = True
    first = [v for v in positive if not above[v]]
    last = [v for v in positive if not below[v]]
    return first, last


def io_density(cg: Graph, members: list[int], size: np.ndarray) -> float:
    """The largest proven d (bytes per unit of size) with io(S) >= d * size(S) for every set S
    of the gap's nodes: bisection on d, each step a max-flow proving
    ``min over S of cut(S) + d * size(gap minus S) >= d * size(gap)`` (source arcs d * size
    rounded up, tensor arcs exact: the flow proves it for the rounded-up sizes, which are
    larger)."""
    from ortools.graph.python import max_flow  # heavy (OR-Tools): only when the bound runs

    vol = float(size[members].sum())
    if vol <= 0 or not members:
        return 0.0
    idx = {v: i + 1 for i, v in enumerate(members)}  # 0: source, n + 1: sink
    sink = len(members) + 1
    hyper = _gap_tensors(cg, members, idx)
    whole = sum(b for inside, outside, b in hyper if outside)  # S = the whole gap
    if whole <= 0:
        return 0.0
    never = int(DENSITY_UNITS * (sum(b for _, _, b in hyper) + 1)) + 1
    f = max_flow.SimpleMaxFlow()
    nxt = sink + 1
    for inside, outside, b in hyper:
        a_t, b_t = nxt, nxt + 1
        nxt += 2
        f.add_arc_with_capacity(a_t, b_t, int(DENSITY_UNITS * b))
        for x in inside:
            f.add_arc_with_capacity(x, a_t, never)
            if not outside:
                f.add_arc_with_capacity(b_t, x, never)
        if outside:
            f.add_arc_with_capacity(b_t, sink, never)
    arcs = [f.add_arc_with_capacity(0, idx[v], 0) for v in members]
    units = np.array([float(size[v]) for v in members]) * DENSITY_UNITS
    lo, hi = 0.0, whole / vol
    for _ in range(DENSITY_STEPS):
        mid = 0.5 * (lo + hi)
        # rounded up: a flow of their sum proves cut(S) >= caps(S) >= mid * size(S) for all S
        caps = np.ceil(mid * units).astype(np.int64)
        if caps.sum() >= never:
            hi = mid
            continue
        f.set_arcs_capacity(np.array(arcs, dtype=np.int32), caps)
        ok = f.solve(0, sink) == f.OPTIMAL
        if ok and f.optimal_flow() >= int(caps.sum()):
            lo = mid
        else:
            hi = mid
    return lo


def _gap_tensors(cg: Graph, members: list[int], idx: dict[int, int]):
    """Every tensor with a member (producer or consumer) among the gap's nodes: its members
    inside (network indices), whether it has one outside, and its bytes."""
    out = []
    seen: set[int] = set()
    for v in members:
        for t in [*cg.produced_by[v], *cg.read_by[v]]:
            if t in seen:
                continue
            seen.add(t)
            all_members = {
                int(cg.t_producer[t]),
                *cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]].tolist(),
            }
            inside = [idx[x] for x in all_members if x in idx]
            size = int(cg.t_size[t])
            if size > 0 and len(all_members) > 1:
                out.append((inside, len(inside) < len(all_members), size))
    return out


def _preds(cg: Graph, v: int) -> list[int]:
    ptr, idx = cg.pred
    return idx[ptr[v] : ptr[v + 1]].tolist()
