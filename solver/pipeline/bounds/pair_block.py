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
MAX_SIBLINGS = 32  # nodes in one set of parallel branches
BISECTION_TOLERANCE = 1e-3  # relative: the search stops when the interval is this narrow
TARGET_PROBE = 1e-7  # the first probe with a target: this much below it
FLOOR_PROBE = 1e-4  # the probe just above the best bound: this much above it
PIN = 1 << 61  # a pinned node's source arc: above every finite cut (node_block.CAPACITY_BITS)


@dataclass(frozen=True)
class PairBlockBound:
    """The bound (0.0: none proven), the nodes of the set that proves it (no two in one
    block below ``value``), and the minimum cuts computed."""

    value: float
    nodes: tuple[tuple[int, ...], ...]  # the groups (a group of two or more needs two blocks)
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
    near: np.ndarray  # near[v]: the cheapest set around v found by its cut ({v} until then)
    lower: np.ndarray  # lower[u, v]: hull_costs, NaN until computed
    upper: np.ndarray  # upper[u, v]: joint_set_costs, NaN until computed
    known: np.ndarray  # known[u, v]: the pair's cut once computed, -inf before
    in_cuts: np.ndarray  # the nodes of a pair cut so far (the only columns of known set)
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

    def lower_bounds(self, v: int, members: np.ndarray) -> np.ndarray:
        """:meth:`hull_costs` of v and each member (not depending on T: once per pair)."""
        fresh = members[np.isnan(self.lower[members, v])]
        if len(fresh):
            self.lower[fresh, v] = self.hull_costs(v, fresh)
        return self.lower[members, v]

    def upper_bounds(self, v: int, members: np.ndarray) -> np.ndarray:
        """:meth:`joint_set_costs` of v and each member (once per pair)."""
        fresh = members[np.isnan(self.upper[members, v])]
        if len(fresh):
            self.upper[fresh, v] = self.joint_set_costs(v, fresh)
        return self.upper[members, v]

    def inherited(self, v: int, members: np.ndarray) -> np.ndarray:
        """For each member u, the largest pair cost already cut of u or v with a node w on
        an order path between them (-inf: none): a block holding u and v holds w, so it
        pays p(u, w) and p(w, v) too."""
        cols = np.flatnonzero(self.in_cuts)  # the nodes of some pair cut so far
        if not len(cols):
            return np.full(len(members), -np.inf)
        rows = np.ix_(members, cols)
        hull = (self.desc[rows] & self.anc[v, cols]) | (self.anc[rows] & self.desc[v, cols])
        via_u = np.where(hull, self.known[rows], -np.inf).max(axis=1)
        via_v = np.where(hull, self.known[v, cols][None, :], -np.inf).max(axis=1)
        return np.maximum(via_u, via_v)

    def cut(self, u: int, v: int) -> float:
        """The cheapest node set holding u and v (work + io) plus the larger own overflow."""
        key = (min(u, v), max(u, v))
        if key not in self.cache:
            value = self._pinned_cut(list(key), PIN)
            self.cache[key] = value + max(self.over[u], self.over[v])
            self.known[u, v] = self.known[v, u] = self.cache[key]
            self.in_cuts[[u, v]] = True
        return self.cache[key]

    def set_cost(self, nodes: list[int]) -> float:
        """A lower bound of f(S) for every block S holding all of ``nodes``: the largest of
        their hull's work (every node on an order path between two of them) and their node
        blocks, and the cut with all of them pinned, each with the largest own overflow.
        The cut is skipped (no claim from it) when the pins' capacities could overflow."""
        at = np.array(nodes, dtype=np.int64)
        over = float(self.over[at].max())
        hull = self.desc[at].any(axis=0) & self.anc[at].any(axis=0)
        lower = max(float(self.work[hull].sum()) + over, float(self.single[at].max()))
        pin = int(float(self.cn.work.sum()) * self.cn.scale * (1 + 1e-9)) + 2
        if pin * len(nodes) >= PIN << 1:
            return lower
        return max(lower, self._pinned_cut(nodes, pin) + over)

    def _pinned_cut(self, nodes: list[int], capacity: int) -> float:
        """The least cut with ``nodes`` pinned to the source side (their source arcs at
        ``capacity``, unpinned again after), in the graph's units; 0 (no claim) when the
        max-flow does not solve."""
        net = self.cn.net
        arcs = [self._pin(x) for x in nodes]
        for a in arcs:
            net.set_arc_capacity(a, capacity)
        ok = net.solve(self.source, self.cn.sink) == net.OPTIMAL
        value = float(net.optimal_flow()) / self.cn.scale if ok else 0.0
        for a in arcs:
            net.set_arc_capacity(a, 0)
        return value

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
    if floor > 0 and not _may_prove(costs, floor * (1 + FLOOR_PROBE), k + 1):
        return PairBlockBound(0.0, (), 0)  # the usual case on chains: at once, no cut
    search = _Search(costs, visit_order(costs, cg.n), k + 1, t0 + seconds)
    lo = floor
    hi = target if target is not None else float(cg.work.sum() + costs.over.max())
    best = PairBlockBound(0.0, (), 0)
    for step in range(BISECTION_STEPS):
        if time.perf_counter() > search.deadline or hi <= lo * (1 + BISECTION_TOLERANCE):
            break
        mid, above_floor = _next_probe(step, lo, hi, target is not None)
        groups = search.probe(mid)
        if groups.blocks > k:
            value = _least_cost(costs, groups, mid) * (1 - FLOAT_SLACK)
            if value > best.value:
                nodes = tuple(tuple(group) for group in groups.nodes)
                best = PairBlockBound(value, nodes, len(costs.cache))
            lo = max(mid, value)
        elif above_floor:
            break  # nothing just above the best bound: no higher T either (the usual case)
        else:
            hi = mid
    return PairBlockBound(best.value, best.nodes, len(costs.cache))


def _next_probe(step: int, lo: float, hi: float, has_target: bool) -> tuple[float, bool]:
    """The next T to try, and whether it is the probe just above the best bound: with a
    known plan first just below its cost (one probe proves a tight bound), then just above
    the best bound (when that fails the search ends: it cannot help), then bisection."""
    if has_target and step == 0:
        return hi * (1 - TARGET_PROBE), False
    if step == int(has_target) and lo > 0:
        return lo * (1 + FLOOR_PROBE), True
    return 0.5 * (lo + hi), False


@dataclass
class _Search:
    """The greedy searches of one bound: nodes alone first; where they fail, the sets of
    parallel branches (computed once) before them."""

    costs: PairCosts
    order: list[int]
    need: int
    deadline: float
    siblings: list[list[int]] | None = None
    singles_failed: float = np.inf  # the least T at which nodes alone failed

    def probe(self, T: float) -> _Groups:
        singles = [[v] for v in self.order]
        if self.singles_failed > T:  # nodes alone failed at a lower T: here too (mostly)
            groups = _greedy_groups(self.costs, singles, T, self.need, self.deadline)
            if groups.blocks >= self.need:
                return groups
            self.singles_failed = T
        if self.siblings is None:
            self.siblings = sibling_sets(self.costs, self.order)
        return _greedy_groups(self.costs, self.siblings + singles, T, self.need, self.deadline)


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
        np.eye(n, dtype=bool),
        np.full((n, n), np.nan),
        np.full((n, n), np.nan),
        np.full((n, n), -np.inf),
        np.zeros(n, dtype=bool),
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


def _may_prove(costs: PairCosts, T: float, need: int) -> bool:
    """An optimistic search before any cut: nodes by decreasing singleton cost, each taken
    unless its hull with a node taken (the pair itself when no path joins them) costs at
    most T as a set. False (too few nodes) ends the bound: the real search, which also
    rejects pairs by their cheapest sets, would find fewer (mostly)."""
    taken: list[int] = []
    for v in np.argsort(-costs.cn.singleton, kind="stable").tolist():
        if len(taken) >= need:
            return True
        members = np.array(taken, dtype=np.int64)
        if not len(taken) or (costs.joint_set_costs(v, members) > T).all():
            taken.append(v)
    return len(taken) >= need


def visit_order(costs: PairCosts, n: int) -> list[int]:
    """Nodes by decreasing node-block value m(v) (the cheapest set around v alone): the
    nodes that are costly to group come first. Records m(v) and the set of each cut."""
    single = np.zeros(n)
    cn = costs.cn
    for v in range(n):
        single[v] = min_block_cost(cn, v) + costs.over[v]
        if cn.singleton[v] > cn.work[v]:  # a cut was run (else {v} is the cheapest set)
            costs.near[v, [w for w in cn.net.get_source_side_min_cut() if w < n]] = True
    costs.single = single * (1 - FLOAT_SLACK)
    return np.argsort(-single, kind="stable").tolist()


@dataclass
class _Groups:
    """Node groups no two of which share a block below T (every cross pair conflicts); a
    group of weight 2 cannot fit in one block either (its own cost exceeds T)."""

    nodes: list[list[int]]
    weight: list[int]
    cost: list[float]  # the group's cost (its lower bound) when its weight is 2

    @property
    def blocks(self) -> int:
        return sum(self.weight)

    def members(self) -> np.ndarray:
        return np.array([v for group in self.nodes for v in group], dtype=np.int64)

    def group_of(self) -> np.ndarray:
        return np.array([i for i, group in enumerate(self.nodes) for _ in group], np.int64)


def _greedy_groups(
    costs: PairCosts, candidates: list[list[int]], T: float, need: int, deadline: float
) -> _Groups:
    """Candidates taken in order when every node of one conflicts with every node already
    taken (p > T); a candidate of two nodes or more weighs 2 when it cannot fit in one block
    below T (and is passed over otherwise). Stops when the weights reach ``need``."""
    groups = _Groups([], [], [])
    taken: set[int] = set()
    for nodes in candidates:
        if groups.blocks >= need or time.perf_counter() > deadline:
            break
        if any(v in taken for v in nodes):
            continue  # a node is in one group at most
        members = groups.members()
        cost = costs.set_cost(nodes) if len(nodes) > 1 else np.inf
        if cost <= T:
            continue
        if len(members) and any(_may_share(costs, v, members, T) for v in nodes):
            continue
        groups.nodes.append(list(nodes))
        taken.update(nodes)
        groups.weight.append(2 if len(nodes) > 1 else 1)
        groups.cost.append(cost)
    return groups


def sibling_sets(costs: PairCosts, order: list[int]) -> list[list[int]]:
    """Sets of two nodes or more with the same node block and no order path between any
    two (parallel branches: the experts of a layer), greedily in topological order within
    each value, at most MAX_SIBLINGS each."""
    classes: dict[float, list[int]] = {}
    for v in sorted(order, key=lambda v: (-float(costs.single[v]), costs.rank[v])):
        classes.setdefault(round(float(costs.single[v]), 12), []).append(v)
    out: list[list[int]] = []
    for left in classes.values():
        while len(left) > 1:
            chosen = [left[0]]
            for w in left[1:]:
                if len(chosen) >= MAX_SIBLINGS:
                    break
                if not (costs.desc[chosen, w].any() or costs.anc[chosen, w].any()):
                    chosen.append(w)
            taken = set(chosen)
            left = [w for w in left if w not in taken]
            if len(chosen) > 1:
                out.append(chosen)
    return out


def _may_share(costs: PairCosts, v: int, members: np.ndarray, T: float) -> bool:
    """True when v may share a block of cost T with a member: for the members whose lower
    bounds do not exceed T, a set holding both costs at most T, or their cut does."""
    members = members[costs.lower_bounds(v, members) <= T]
    if not len(members):
        return False
    if (costs.upper_bounds(v, members) <= T).any():
        return True
    members = members[costs.inherited(v, members) <= T]
    # the nearest in topological order first: the likeliest to share a block with v
    members = members[np.argsort(np.abs(costs.rank[members] - costs.rank[v]))]
    return any(costs.cut(int(u), v) <= T for u in members.tolist())


def _least_cost(costs: PairCosts, groups: _Groups, T: float) -> float:
    """A lower bound of the least pair cost across groups and of the weight-2 groups' own
    costs (all > T: the groups were taken at T): a pair its hull decided (its lower bounds
    > T) counts them, the others the larger of those and their cut."""
    members, group_of = groups.members(), groups.group_of()
    least = min([c for c, w in zip(groups.cost, groups.weight, strict=True) if w == 2] + [np.inf])
    for i in range(1, len(members)):
        v = int(members[i])
        cross = np.flatnonzero(group_of[:i] != group_of[i])
        if not len(cross):
            continue
        lower = np.maximum(costs.hull_costs(v, members[cross]), costs.inherited(v, members[cross]))
        for j, h in zip(cross.tolist(), lower.tolist(), strict=True):
            least = min(least, h if h > T else max(h, costs.cut(int(members[j]), v)))
    return float(least)
