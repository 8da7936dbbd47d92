"""The pair-block bound: nodes no two of which fit in one block need a block each.

For two nodes u and v let p(u, v) be a lower bound of f(S) over every block S holding both:
the larger of the cheapest node set around both (``work + io``, the node block's minimum cut
with u and v on the source side) and the work of their hull (every node on an order path
between them lies in the same block), plus the larger of their own overflows. If a set W of
k + 1 nodes has ``p(u, v) > T`` for every pair, no plan with k blocks keeps every block at or
below T (two nodes of W would share a block), so OPT >= min over pairs of W of p(u, v).

Parallel experts are the case it was made for: below the plan's bottleneck, no two experts,
no two additions of the experts' running sum, and no expert with the addition it feeds fit in
one block, so every layer needs a block per expert and per addition (docs/bounds.md, "pair
block"). The cuts run on :func:`node_block.cut_network`'s network with a source vertex pinned
to both nodes; each pair is cut at most once (cached), and only when its hull does not decide
it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline.bounds.node_block import (
    FLOAT_SLACK,
    CutNetwork,
    cut_network,
    min_block_cost,
    own_overflow,
)

MAX_NODES = 2_000  # coarse nodes: the reachability and pair-cost matrices are n x n
BISECTION_STEPS = 14
BISECTION_TOLERANCE = 1e-5  # relative: the search stops when the interval is this narrow
TARGET_PROBE = 1e-7  # the first probe with a target: this much below it
PIN = 1 << 61  # a pinned node's source arc: above every finite cut (node_block.CAPACITY_BITS)


@dataclass(frozen=True)
class PairBlockBound:
    """The bound (0.0: none proven), the nodes of the set that proves it (no two in one
    block below ``value``), and the minimum cuts computed."""

    value: float
    nodes: tuple[int, ...]
    cuts: int


@dataclass
class PairCosts:
    """p(u, v) on demand: the hull decides most pairs, a cached minimum cut the rest."""

    cn: CutNetwork
    work: np.ndarray
    over: np.ndarray
    desc: np.ndarray  # desc[u, w]: w is u or an order descendant of u
    anc: np.ndarray  # anc[v, w]: w is v or an order ancestor of v
    rank: np.ndarray  # topological rank of every node
    single: np.ndarray  # m(v) + overflow({v}): the node block of each node (filled later)
    near: np.ndarray  # near[v]: the cheapest set around v found by its cut (filled later)
    lower: np.ndarray  # lower[u, v]: hull_costs, NaN until computed
    upper: np.ndarray  # upper[u, v]: joint_set_costs, NaN until computed
    known: np.ndarray  # known[u, v]: the pair's cut once computed, -inf before
    t_members: np.ndarray  # the members (producer, consumers) of each exchanged tensor ...
    t_ptr: np.ndarray  # ... where each tensor's members start
    t_count: np.ndarray  # ... how many there are
    t_sec: np.ndarray  # ... and its link seconds
    source: int
    pins: dict[int, int]
    cache: dict[tuple[int, int], float]

    def hull_costs(self, v: int, members: np.ndarray) -> np.ndarray:
        """For each member u, a lower bound of p(u, v) without a cut: the hull work of {u, v}
        plus the larger own overflow (the hull of an unordered pair is the pair), or the node
        block of u or of v when larger."""
        down = (self.desc[members] & self.anc[v]) @ self.work  # u before v
        up = (self.anc[members] & self.desc[v]) @ self.work  # u after v
        pair = self.work[members] + self.work[v]
        hull = np.maximum(np.maximum(down, up), pair)
        hull += np.maximum(self.over[members], self.over[v])
        # a set holding both holds each: the node block of either is a lower bound too
        return np.maximum(hull, np.maximum(self.single[members], self.single[v]))

    def joint_set_costs(self, v: int, members: np.ndarray) -> np.ndarray:
        """For each member u: work + io of one set holding u and v (their hull and the
        cheapest set around each), plus the larger own overflow. p(u, v) is at most this
        (each of its terms is), so at most T decides "may share a block" without a cut."""
        inside = (self.desc[members] & self.anc[v]) | (self.anc[members] & self.desc[v])
        inside |= self.near[members] | self.near[v]
        cost = inside.astype(float) @ self.work + np.maximum(self.over[members], self.over[v])
        if len(self.t_count):
            held = inside[:, self.t_members].astype(np.int32)
            counts = np.add.reduceat(held, self.t_ptr, axis=1)
            cost += ((counts > 0) & (counts < self.t_count)).astype(float) @ self.t_sec
        return cost

    def bounds(self, v: int, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`hull_costs` and :meth:`joint_set_costs` of v and each member (they do not
        depend on T: computed once per pair)."""
        fresh = members[np.isnan(self.lower[members, v])]
        if len(fresh):
            self.lower[fresh, v] = self.hull_costs(v, fresh)
            self.upper[fresh, v] = self.joint_set_costs(v, fresh)
        return self.lower[members, v], self.upper[members, v]

    def inherited(self, v: int, members: np.ndarray) -> np.ndarray:
        """For each member u, the largest pair cost already cut of u or v with a node w on
        an order path between them (-inf: none): a block holding u and v holds w, so it
        pays p(u, w) and p(w, v) too."""
        hull = (self.desc[members] & self.anc[v]) | (self.anc[members] & self.desc[v])
        via_u = np.where(hull, self.known[members], -np.inf).max(axis=1)
        via_v = np.where(hull, self.known[v][None, :], -np.inf).max(axis=1)
        return np.maximum(via_u, via_v)

    def cut(self, u: int, v: int) -> float:
        """The cheapest node set holding u and v (work + io) plus the larger own overflow."""
        key = (min(u, v), max(u, v))
        if key not in self.cache:
            net = self.cn.net
            arcs = [self._pin(x) for x in key]
            for a in arcs:
                net.set_arc_capacity(a, PIN)
            ok = net.solve(self.source, self.cn.sink) == net.OPTIMAL
            value = float(net.optimal_flow()) / self.cn.scale if ok else 0.0
            for a in arcs:
                net.set_arc_capacity(a, 0)
            self.cache[key] = value + max(self.over[u], self.over[v])
            self.known[u, v] = self.known[v, u] = self.cache[key]
        return self.cache[key]

    def pair_cost(self, u: int, v: int) -> float:
        """p(u, v): a lower bound of f(S) for every block S holding u and v."""
        lower = max(self.hull_costs(v, np.array([u]))[0], self.inherited(v, np.array([u]))[0])
        return max(float(lower), self.cut(u, v))

    def _pin(self, x: int) -> int:
        if x not in self.pins:
            self.pins[x] = self.cn.net.add_arc_with_capacity(self.source, x, 0)
        return self.pins[x]


def pair_block_bound(
    g: Graph,
    cluster: Cluster,
    k: int,
    seconds: float,
    floor: float = 0.0,
    target: float | None = None,
) -> PairBlockBound:
    """The largest T (above ``floor``, below ``target`` when given) for which a greedy
    search finds k + 1 nodes pairwise unable to share a block of cost T (bisection; each
    step's set is a proof, the value reported is its least pair cost). Homogeneous clusters
    and at most MAX_NODES coarse nodes (0.0 otherwise)."""
    t0 = time.perf_counter()
    cg, _ = coarse_view(g)
    if not cluster.homogeneous or cg.n > MAX_NODES or cg.n <= k:
        return PairBlockBound(0.0, (), 0)
    costs = pair_costs(cg, cluster)
    order = visit_order(costs, cg.n)
    lo = floor
    hi = target if target is not None else float(cg.work.sum() + costs.over.max())
    best = PairBlockBound(0.0, (), 0)
    for step in range(BISECTION_STEPS):
        if time.perf_counter() - t0 > seconds or hi <= lo * (1 + BISECTION_TOLERANCE):
            break
        # with a known plan, first just below its cost: one probe proves a tight bound
        mid = hi * (1 - TARGET_PROBE) if step == 0 and target is not None else 0.5 * (lo + hi)
        clique = _greedy_clique(costs, order, mid, k + 1, t0 + seconds)
        if len(clique) > k:
            value = _least_pair_cost(costs, clique, mid) * (1 - FLOAT_SLACK)
            if value > best.value:
                best = PairBlockBound(value, tuple(clique), len(costs.cache))
            lo = max(mid, value)
        else:
            hi = mid
    return PairBlockBound(best.value, best.nodes, len(costs.cache))


def pair_costs(cg: Graph, cluster: Cluster) -> PairCosts:
    """The cut network with a source vertex, and the order reachability of every node."""
    cn = cut_network(cg, cluster)
    n = cg.n
    anc = np.zeros((n, n), dtype=bool)
    ptr, idx = cg.pred
    for v in cg.topo_order.tolist():
        row = anc[v]
        row[v] = True
        for p in idx[ptr[v] : ptr[v + 1]].tolist():
            row |= anc[p]
    tensors = _exchanged_tensors(cg, cluster.link_bandwidth)
    return PairCosts(
        cn,
        cg.work.astype(float),
        own_overflow(cg, cluster),
        anc.T.copy(),
        anc,
        cg.topo_rank,
        np.zeros(n),
        np.zeros((n, n), dtype=bool),
        np.full((n, n), np.nan),
        np.full((n, n), np.nan),
        np.full((n, n), -np.inf),
        *tensors,
        cn.net.num_nodes(),
        {},
        {},
    )


def _exchanged_tensors(cg: Graph, bandwidth: float):
    """The tensors a set can split (two members or more, bytes > 0) as a flat member list
    with start offsets and counts, and each one's link seconds."""
    members, counts, secs = [], [], []
    for t in range(cg.num_tensors):
        cons = cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]].tolist()
        mem = sorted({int(cg.t_producer[t]), *cons})
        if len(mem) < 2 or cg.t_size[t] <= 0:
            continue
        members.extend(mem)
        counts.append(len(mem))
        secs.append(float(cg.t_size[t]) / bandwidth)
    count = np.array(counts, dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    return np.array(members, dtype=np.int64), ptr, count, np.array(secs)


def visit_order(costs: PairCosts, n: int) -> list[int]:
    """Nodes by decreasing node-block value m(v) (the cheapest set around v alone): the
    nodes that are costly to group come first. Records m(v) and the set of each cut."""
    single = np.zeros(n)
    cn = costs.cn
    for v in range(n):
        single[v] = min_block_cost(cn, v) + costs.over[v]
        costs.near[v, v] = True
        if cn.singleton[v] > cn.work[v]:  # a cut was run (else {v} is the cheapest set)
            costs.near[v, [w for w in cn.net.get_source_side_min_cut() if w < n]] = True
    costs.single = single * (1 - FLOAT_SLACK)
    return np.argsort(-single, kind="stable").tolist()


def _greedy_clique(costs: PairCosts, order: list[int], T: float, need: int, deadline: float):
    """Nodes taken in ``order`` when every pair with those already taken costs more than T
    (the hull first, a minimum cut when the hull does not decide); stops at ``need``."""
    clique: list[int] = []
    for v in order:
        if len(clique) >= need or time.perf_counter() > deadline:
            break
        members = np.array(clique, dtype=np.int64)
        if len(clique):
            lower, upper = costs.bounds(v, members)
            if (upper <= T).any():
                continue  # a set holding v and a member costs at most T
            lower = np.maximum(lower, costs.inherited(v, members))
            undecided = members[lower <= T]
            # the nearest in topological order first: the likeliest to share a block with v
            undecided = undecided[np.argsort(np.abs(costs.rank[undecided] - costs.rank[v]))]
            if any(costs.cut(int(u), v) <= T for u in undecided):
                continue
        clique.append(v)
    return clique


def _least_pair_cost(costs: PairCosts, clique: list[int], T: float) -> float:
    """A lower bound of min over pairs of the set of p(u, v) (> T: the set was taken at T),
    the T below which no two share a block: a pair its hull decided (its hull's lower bounds
    > T) counts them, the others the larger of those and their cut (computed by the search)."""
    members = np.array(clique, dtype=np.int64)
    least = np.inf
    for i, v in enumerate(clique[1:], start=1):
        hull = np.maximum(costs.hull_costs(v, members[:i]), costs.inherited(v, members[:i]))
        for j, u in enumerate(clique[:i]):
            h = float(hull[j])
            least = min(least, h if h > T else max(h, costs.cut(u, v)))
    return float(least)
