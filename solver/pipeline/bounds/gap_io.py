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
MAX_WINDOW_FLOWS = 128  # pinned max-flows per gap for its volume windows; then no more windows
MAX_WINDOWS = 2  # volume windows kept per gap
WINDOW_STEP = 0.05  # a window is kept when it raises the cut by this fraction at least
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
    n = len(gg.local)
    positive = [i for i in range(1, n - 1) if size[gg.local[i]] > 0]
    if len(positive) < 2:
        return math.inf
    first, last = _extreme_nodes(gg, positive, n)
    pairs = [(a, b) for a in first for b in last if a != b]
    if len(pairs) > MAX_PAIRS or not pairs:
        return -1.0
    net = PinnedNetwork.build(gg, first, last)
    best = math.inf
    for a, b in pairs:
        cut = net.cut(a, b)
        if cut is None:
            return -1.0  # no claim
        best = min(best, cut)  # inf: b is an ancestor of a, no such boundary
    return best


@dataclass
class PinnedNetwork:
    """The gap cut's max-flow network with a zero-capacity arc from the source to each node
    of ``left`` and from each node of ``right`` to the sink; :meth:`cut` opens one of each."""

    flow: object  # ortools' SimpleMaxFlow
    never: int  # above every cut: an order arc, or a pin
    left: dict[int, int]  # local node -> its arc from the source
    right: dict[int, int]  # local node -> its arc to the sink
    sink: int

    @classmethod
    def build(cls, gg: GapGraph, left: list[int], right: list[int]) -> PinnedNetwork:
        from ortools.graph.python import max_flow  # heavy (OR-Tools): only when the bound runs

        n = len(gg.local)
        never = sum(size for _, _, size in gg.tensors) + 1
        f = max_flow.SimpleMaxFlow()
        nxt = n
        for p, cons, size in gg.tensors:
            f.add_arc_with_capacity(p, nxt, size)
            for c in cons:
                f.add_arc_with_capacity(nxt, c, never)
            nxt += 1
        for b, a in gg.order:
            f.add_arc_with_capacity(b, a, never)
        pin_left = {a: f.add_arc_with_capacity(0, a, 0) for a in left}
        pin_right = {b: f.add_arc_with_capacity(b, n - 1, 0) for b in right}
        return cls(f, never, pin_left, pin_right, n - 1)

    def cut(self, a: int, b: int) -> float | None:
        """The least cut (bytes) with ``a`` on the left and ``b`` on the right (and the left
        side closed under predecessors); inf when none exists (b precedes a), None when the
        solver failed (no claim)."""
        f = self.flow
        f.set_arc_capacity(self.left[a], self.never)
        f.set_arc_capacity(self.right[b], self.never)
        ok = f.solve(0, self.sink) == f.OPTIMAL
        value = float(f.optimal_flow()) if ok else None
        f.set_arc_capacity(self.left[a], 0)
        f.set_arc_capacity(self.right[b], 0)
        if value is None:
            return None
        return value if value < self.never else math.inf


@dataclass(frozen=True)
class Windows:
    """Volume windows of a gap's interior cut: a boundary strictly inside the gap whose left
    side (the gap nodes in blocks up to it) holds more than ``at[j]`` of volume pays at least
    ``cut[j]`` bytes; both lists increase, and ``cut[0]`` exceeds the plain interior cut."""

    at: list[float]
    cut: list[float]


def interior_windows(
    gg: GapGraph,
    size: np.ndarray,
    floor: float,
    most: int = MAX_WINDOWS,
    step: float = WINDOW_STEP,
) -> Windows:
    """The gap's volume windows above ``floor`` (its interior cut, bytes), by pinning
    (docs/bounds.md, "volume windows"): a set R of positive-volume gap nodes closed under
    positive ancestors grows one node at a time; every left side D with more volume than R
    holds a *frontier* node (positive, outside R, its positive ancestors in the gap all in R),
    so it pays at least the least pinned cut of a frontier node against a "last" node. R takes
    the cheapest frontier node next. Each node is priced once (one max-flow per last node);
    at most MAX_WINDOW_FLOWS max-flows, then the windows found so far. A window is kept
    when it raises the cut by the fraction ``step`` (each costs the chain program a state
    class), at most ``most`` of them."""
    n = len(gg.local)
    vol = np.array([float(size[v]) for v in gg.local])
    vol[0] = vol[-1] = 0.0
    positive = [i for i in range(1, n - 1) if vol[i] > 0]
    if len(positive) < 3:
        return Windows([], [])
    first, last = _extreme_nodes(gg, positive, n)
    parents = _positive_parents(gg, vol > 0, n)
    children: dict[int, list[int]] = {v: [] for v in positive}
    for v in positive:
        for a in parents[v]:
            children[a].append(v)
    waiting = {v: len(parents[v]) for v in positive}
    pricing = _Pricing(PinnedNetwork.build(gg, positive, last), last)
    frontier = {v: pricing.price(v) for v in first}
    inside, best, out = 0.0, floor, Windows([], [])
    while frontier and None not in frontier.values() and len(out.at) < most:
        v = min(frontier, key=frontier.__getitem__)
        least = frontier.pop(v)
        # any D with more volume than R holds a frontier node
        if inside > 0 and least > best * (1 + step):
            out.at.append(inside)
            out.cut.append(least)
            best = least
        inside += vol[v]
        for w in children[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                frontier[w] = pricing.price(w)
    return out


@dataclass
class _Pricing:
    """Each node's least pinned cut against the last nodes, within a budget of max-flows."""

    net: PinnedNetwork
    last: list[int]
    flows: int = 0

    def price(self, v: int) -> float | None:
        """The least cut with v on the left and some last node other than v on the right
        (inf: none); None when the budget is spent or a max-flow failed (no claim)."""
        best = math.inf
        for b in self.last:
            if b == v:
                continue
            self.flows += 1
            cut = self.net.cut(v, b) if self.flows <= MAX_WINDOW_FLOWS else None
            if cut is None:
                return None
            best = min(best, cut)
        return best


def _positive_parents(gg: GapGraph, is_pos: np.ndarray, n: int) -> list[set[int]]:
    """Per local node, its nearest positive-volume ancestors among the gap's nodes (through
    gap nodes of no volume)."""
    preds: list[list[int]] = [[] for _ in range(n)]
    for b, a in gg.order:
        preds[b].append(a)
    near: list[set[int]] = [set() for _ in range(n)]
    for v in range(1, n - 1):  # local order is topological
        for a in preds[v]:
            if 0 < a < n - 1:
                near[v] |= {a} if is_pos[a] else near[a]
    return near


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
