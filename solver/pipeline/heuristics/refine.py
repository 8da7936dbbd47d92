"""A plan improver: local search on a valid plan, never worse than its input.

The blocks of a plan are numbered in pipeline order, and a plan is valid when every order edge
goes to the same or a later block (``a[u] <= a[v]``; this keeps every block convex and the
quotient acyclic) and every block fits the capacity. So a node v may move to any block in
``[max block of its predecessors, min block of its successors]``, and a set of nodes of block x
closed under successors within x (a *frontier set*) may move to block x + 1 (closed under
predecessors: to x - 1). A move changes f of its two blocks only (the other blocks receive and
send the same tensors: on a homogeneous cluster the sender's block does not change a
transfer's price), so it is evaluated incrementally: per tensor the number of its consumers in
each block, per parameter the number of its users in each block.

A move is taken when it makes the sorted vector of block costs smaller lexicographically: with
only two blocks changed, when ``(max, min)`` of their new costs is below that of their old ones
(by more than a relative 1e-12). Every move strictly decreases that vector, so the search ends.
Rounds: single-node moves over every node, frontier-set moves out of the bottleneck blocks,
then the optimal slicing (:func:`solver.pipeline.heuristics.slicing.slice_order`) of the plan's
own order (blocks in order, each in topological order), which keeps every boundary it can
improve; rounds repeat while one improves and the deadline allows. Everything is deterministic
(no random numbers; the deadline only stops it early). The result is re-priced by the evaluator
and returned only when valid and better than the input; otherwise the input comes back.

Homogeneous clusters only: on a cluster whose devices or links differ a move changes the price
of transfers of other blocks, and the input is returned unchanged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.graph import Graph, coarse_view
from solver.pipeline.heuristics.orders import depth_first_order
from solver.pipeline.heuristics.slicing import SliceTimeout, slice_order

REL_TOL = 1e-12  # a move must lower the pair (max, min) by more than this, relatively
CLOCK_EVERY = 64  # moves tried between two looks at the clock


@dataclass(frozen=True)
class RefinedPlan:
    """The improver's answer: the plan (an assignment of the graph given) and its objective,
    the moves taken, the rounds run and why it stopped ("local optimum", "deadline",
    "target", "not homogeneous", "invalid input")."""

    objective: float
    assignment: np.ndarray
    moves: int
    rounds: int
    stopped: str

    @property
    def improved(self) -> bool:
        return self.moves > 0


class BlockCosts:
    """The blocks of a plan of a (coarse) graph and their costs, updated move by move."""

    def __init__(self, g: Graph, cluster: Cluster, a: np.ndarray, k: int) -> None:
        self.g, self.k = g, k
        self.B = cluster.link_bandwidth
        self.fast, self.slow = cluster.fast_memory, cluster.slow_memory_bandwidth
        self.capacity = math.inf if cluster.capacity is None else cluster.capacity
        self.a = [int(x) for x in a]
        self.work_of = g.work.tolist()
        self.act = g.act.tolist()
        self.t_size = g.t_size.tolist()
        self.t_producer = g.t_producer.tolist()
        self.produces = g.produced_by
        self.reads = [sorted(set(ts)) for ts in g.read_by]
        self.p_size = g.p_size.tolist()
        self.uses: list[list[int]] = [[] for _ in range(g.n)]
        for p, u in zip(g.pair_param.tolist(), g.p_users.tolist(), strict=True):
            if p not in self.uses[u]:
                self.uses[u].append(p)
        self.succ = _lists(g.succ, g.n)
        self.pred = _lists(g.pred, g.n)
        self.ranks = [g.topo_rank, _rank_of(depth_first_order(g))]
        self.topo_rank = g.topo_rank.tolist()
        self.rebuild()

    def rebuild(self) -> None:
        """Every count and per-block sum from the assignment."""
        k, a = self.k, self.a
        self.work = [0.0] * k
        self.members: list[set[int]] = [set() for _ in range(k)]
        for v, b in enumerate(a):
            self.work[b] += self.work_of[v]
            self.members[b].add(v)
        self.cons: list[dict[int, int]] = [{} for _ in self.t_size]
        for t, c in zip(self.g.pair_tensor.tolist(), self.g.t_cons.tolist(), strict=True):
            self.cons[t][a[c]] = self.cons[t].get(a[c], 0) + 1
        self.bytes_io = [0.0] * k
        for t, size in enumerate(self.t_size):
            src = a[self.t_producer[t]]
            blocks = self.cons[t]
            if any(b != src for b in blocks):
                self.bytes_io[src] += size
            for b in blocks:
                if b != src:
                    self.bytes_io[b] += size
        self.users: list[dict[int, int]] = [{} for _ in self.p_size]
        self.params = [0.0] * k
        for v, b in enumerate(a):
            for p in self.uses[v]:
                self._add_user(p, b)
        self.peak = [max((self.act[v] for v in m), default=0.0) for m in self.members]
        self.stale: set[int] = set()  # blocks whose peak lost its node: recomputed when read

    def _add_user(self, p: int, b: int) -> None:
        n = self.users[p].get(b, 0)
        if n == 0:
            self.params[b] += self.p_size[p]
        self.users[p][b] = n + 1

    def _drop_user(self, p: int, b: int) -> None:
        n = self.users[p][b] - 1
        if n == 0:
            del self.users[p][b]
            self.params[b] -= self.p_size[p]
        else:
            self.users[p][b] = n

    def f(self, b: int) -> float:
        over = 0.0
        if not math.isinf(self.fast):
            over = max(0.0, self.params[b] + self._peak(b) - self.fast) / self.slow
        return self.bytes_io[b] / self.B + self.work[b] + over

    def fits(self, b: int) -> bool:
        if math.isinf(self.capacity):
            return True
        return self.params[b] + self._peak(b) <= self.capacity * (1 + 1e-12)

    def _peak(self, b: int) -> float:
        if b in self.stale:
            self.stale.discard(b)
            self.peak[b] = max((self.act[v] for v in self.members[b]), default=0.0)
        return self.peak[b]

    def costs(self) -> list[float]:
        return [self.f(b) for b in range(self.k)]

    def window(self, v: int) -> range:
        """The blocks v may move to with every order edge kept."""
        a = self.a
        lo = max((a[u] for u in self.pred[v]), default=0)
        hi = min((a[w] for w in self.succ[v]), default=self.k - 1)
        return range(lo, hi + 1)

    def move(self, v: int, y: int) -> None:
        """Node v to block y (the caller keeps every order edge)."""
        x = self.a[v]
        for t in self.produces[v]:
            self._move_producer(t, x, y)
        for t in self.reads[v]:
            self._move_consumer(t, x, y)
        for p in self.uses[v]:
            self._drop_user(p, x)
            self._add_user(p, y)
        self.a[v] = y
        self.work[x] -= self.work_of[v]
        self.work[y] += self.work_of[v]
        self.members[x].discard(v)
        self.members[y].add(v)
        if self.act[v] >= self.peak[x]:
            self.stale.add(x)
        self.peak[y] = max(self._peak(y), self.act[v])

    def _move_producer(self, t: int, x: int, y: int) -> None:
        size, blocks = self.t_size[t], self.cons[t]
        if any(b != x for b in blocks):  # x sent t
            self.bytes_io[x] -= size
        if any(b != y for b in blocks):  # y sends t
            self.bytes_io[y] += size
        if x in blocks:  # x now receives t
            self.bytes_io[x] += size
        if y in blocks:  # y received t
            self.bytes_io[y] -= size

    def _move_consumer(self, t: int, x: int, y: int) -> None:
        size, blocks = self.t_size[t], self.cons[t]
        z = self.a[self.t_producer[t]]
        sent_before = any(b != z for b in blocks)
        n = blocks[x] - 1
        if n == 0:
            del blocks[x]
            if x != z:  # x no longer receives t
                self.bytes_io[x] -= size
        else:
            blocks[x] = n
        if y not in blocks and y != z:  # y now receives t
            self.bytes_io[y] += size
        blocks[y] = blocks.get(y, 0) + 1
        sent_after = any(b != z for b in blocks)
        if sent_after != sent_before:
            self.bytes_io[z] += size if sent_after else -size


def _lists(csr: tuple[np.ndarray, np.ndarray], n: int) -> list[list[int]]:
    """A CSR adjacency (pointers, indices) as one Python list per node."""
    ptr, idx = csr[0].tolist(), csr[1].tolist()
    return [idx[ptr[v] : ptr[v + 1]] for v in range(n)]


def _rank_of(order: np.ndarray) -> np.ndarray:
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def _better(new: list[float], old: list[float]) -> bool:
    """The costs of the changed blocks, sorted from the largest, below the old ones
    lexicographically (by more than a relative REL_TOL): the whole plan's sorted vector of
    block costs then decreases too."""
    tol = REL_TOL * max(max(old), 1e-300)
    for n, o in zip(sorted(new, reverse=True), sorted(old, reverse=True), strict=True):
        if n < o - tol:
            return True
        if n > o + tol:
            return False
    return False


def _costs_of(s: BlockCosts, blocks: list[int]) -> list[float]:
    return [s.f(b) for b in blocks]


@dataclass
class _Search:
    """The state of one improvement run: moves taken, the deadline and the target."""

    state: BlockCosts
    deadline: float
    target: float
    moves: int = 0
    tried: int = 0
    out_of_time: bool = False

    def clock(self) -> bool:
        """True while there is time (the clock is read every CLOCK_EVERY tries)."""
        self.tried += 1
        if self.tried % CLOCK_EVERY == 1 and time.perf_counter() > self.deadline:
            self.out_of_time = True
        return not self.out_of_time

    def try_moves(self, nodes: list[int], y: int) -> bool:
        """Move ``nodes`` (in that order, each keeping its order edges) from their block to y;
        kept when the pair's costs improve and both blocks fit, otherwise undone. Skipped
        when y's work alone would reach the pair's larger cost (f is at least the work)."""
        s = self.state
        x = s.a[nodes[0]]
        old = _costs_of(s, [x, y])
        added = sum(s.work_of[v] for v in nodes)
        if s.work[y] + added > max(old) * (1 + REL_TOL):
            return False
        for v in nodes:
            s.move(v, y)
        if s.fits(y) and s.fits(x) and _better(_costs_of(s, [x, y]), old):
            self.moves += 1
            return True
        for v in reversed(nodes):
            s.move(v, x)
        return False

    def try_swap(self, u: int, w: int) -> bool:
        """u to w's block and w to u's (when both keep their order edges); kept when the
        pair's costs improve and both blocks fit, otherwise undone."""
        s = self.state
        x, y = s.a[u], s.a[w]
        old = _costs_of(s, [x, y])
        top = max(old) * (1 + REL_TOL)
        if s.work[y] + s.work_of[u] - s.work_of[w] > top:
            return False
        if s.work[x] - s.work_of[u] + s.work_of[w] > top:
            return False
        s.move(u, y)
        if x not in s.window(w):
            s.move(u, x)
            return False
        s.move(w, x)
        if s.fits(y) and s.fits(x) and _better(_costs_of(s, [x, y]), old):
            self.moves += 1
            return True
        s.move(w, y)
        s.move(u, x)
        return False

    def try_ejection(self, v: int, y: int) -> bool:
        """v to block y, then, unless that alone improves, one node w of y to another block z
        (v's block included): kept when the costs of the blocks changed improve and they fit."""
        s = self.state
        x = s.a[v]
        old_xy = _costs_of(s, [x, y])
        s.move(v, y)
        if s.fits(x) and s.fits(y) and _better(_costs_of(s, [x, y]), old_xy):
            self.moves += 1
            return True
        for w in sorted(s.members[y]):
            if w == v:
                continue
            for z in s.window(w):
                if z in (y, x) or not self.clock():
                    continue
                blocks = [x, y, z]
                old = [old_xy[0], old_xy[1], s.f(z)]
                s.move(w, z)
                if all(s.fits(b) for b in blocks) and _better(_costs_of(s, blocks), old):
                    self.moves += 1
                    return True
                s.move(w, y)
        s.move(v, x)
        return False


def _ejection_round(search: _Search) -> bool:
    """Ejection chains out of every bottleneck block: a node out, and a node of the block
    it went to out to a third block; True if one was kept."""
    s, kept = search.state, False
    for x in _bottlenecks(s):
        for v in sorted(s.members[x]):
            if s.a[v] != x:
                continue
            for y in s.window(v):
                if y != x and search.clock() and search.try_ejection(v, y):
                    kept = True
                    break
    return kept


def _bottlenecks(s: BlockCosts) -> list[int]:
    costs = s.costs()
    top = max(costs)
    return [b for b in range(s.k) if costs[b] >= top * (1 - 1e-9)]


def _swap_round(search: _Search) -> bool:
    """Exchanges of one node of a block with one of the next block; True if one was kept."""
    s, kept = search.state, False
    for x in range(s.k - 1):
        y = x + 1
        outs = [u for u in sorted(s.members[x]) if y in s.window(u)]
        ins = [w for w in sorted(s.members[y]) if x in s.window(w)]
        for u in outs:
            for w in ins:
                if s.a[w] == y and s.a[u] == x and search.clock() and search.try_swap(u, w):
                    kept = True
    return kept


def _node_round(search: _Search, order: list[int]) -> bool:
    """Every single-node move, nodes in ``order``, first improvement; True if one was kept."""
    s, kept = search.state, False
    for v in order:
        x = s.a[v]
        for y in s.window(v):
            if y == x or not search.clock():
                continue
            if search.try_moves([v], y):
                kept = True
                break
    return kept


def _closure(s: BlockCosts, v: int, forward: bool) -> list[int]:
    """v and its descendants (forward) or ancestors within v's block, in the order they can
    move: sinks of the set first going forward (to x + 1), sources first going back."""
    x, nxt = s.a[v], s.succ if forward else s.pred
    seen, stack, out = {v}, [v], []
    while stack:
        u = stack.pop()
        out.append(u)
        for w in nxt[u]:
            if s.a[w] == x and w not in seen:
                seen.add(w)
                stack.append(w)
    rank = s.topo_rank
    return sorted(out, key=lambda u: -rank[u] if forward else rank[u])


def _frontier_round(search: _Search) -> bool:
    """Frontier sets out of every bottleneck block to its neighbour blocks; True if one was
    kept."""
    s = search.state
    costs = s.costs()
    top = max(costs)
    kept = False
    for x in [b for b in range(s.k) if costs[b] >= top * (1 - 1e-9)]:
        for v in sorted(s.members[x], key=lambda u: s.topo_rank[u]):
            if s.a[v] != x:
                continue
            for forward in (True, False):
                y = x + 1 if forward else x - 1
                if not 0 <= y < s.k or not search.clock():
                    continue
                nodes = _closure(s, v, forward)
                if len(nodes) < len(s.members[x]) and search.try_moves(nodes, y):
                    kept = True
                    break
    return kept


def _reslice_round(search: _Search, cg: Graph, cluster: Cluster) -> bool:
    """The optimal slicing of the plan's own order (blocks in order, topological within);
    True when it is better than the plan (the state is rebuilt from it)."""
    s = search.state
    current = max(s.costs())
    best, best_a = current * (1 - 1e-9), None
    for rank in s.ranks:
        order = np.lexsort((rank, np.asarray(s.a)))
        try:
            val, a = slice_order(cg, cluster, order, k=s.k, deadline=search.deadline)
        except SliceTimeout:
            search.out_of_time = True
            break
        if a is not None and val < best:
            best, best_a = val, a
    if best_a is None:
        return False
    a = best_a
    s.a = [int(x) for x in a]
    s.rebuild()
    search.moves += 1
    return True


def refine_plan(
    g: Graph,
    cluster: Cluster,
    assignment: np.ndarray,
    deadline: float,
    target: float = 0.0,
) -> RefinedPlan:
    """A plan at least as good as ``assignment`` (a valid plan of ``g`` on the cluster's
    blocks), improved by local search until a local optimum, ``deadline``
    (``time.perf_counter()``) or an objective at ``target`` (a proven lower bound: nothing
    can beat it). Deterministic up to the deadline (module docstring)."""
    a = np.asarray(assignment, dtype=np.int64)
    k = cluster.devices
    start = evaluate(g, cluster, a).objective
    if not cluster.homogeneous:
        return RefinedPlan(start, a, 0, 0, "not homogeneous")
    if validate(g, cluster, a):
        return RefinedPlan(start, a, 0, 0, "invalid input")
    cg, labels = coarse_view(g)
    ca = np.zeros(cg.n, dtype=np.int64)
    ca[labels] = a
    search = _Search(BlockCosts(cg, cluster, ca, k), deadline, target)
    rounds, stopped = _run_rounds(search, cg, cluster)
    return _checked(g, cluster, a, start, search, labels, rounds, stopped)


def _run_rounds(search: _Search, cg: Graph, cluster: Cluster) -> tuple[int, str]:
    """Rounds of node moves, frontier sets and the re-slicing while one improves."""
    s, rounds = search.state, 0
    order = sorted(range(cg.n), key=lambda v: s.topo_rank[v])
    while True:
        rounds += 1
        kept = _node_round(search, order)
        kept = _frontier_round(search) or kept
        if not kept:
            kept = _swap_round(search)
        if not kept:
            kept = _ejection_round(search)
        if not search.out_of_time and not kept:
            kept = _reslice_round(search, cg, cluster)
        if max(s.costs()) <= search.target * (1 + 1e-9):
            return rounds, "target"
        if search.out_of_time:
            return rounds, "deadline"
        if not kept:
            return rounds, "local optimum"


def _checked(
    g: Graph,
    cluster: Cluster,
    a: np.ndarray,
    start: float,
    search: _Search,
    labels: np.ndarray,
    rounds: int,
    stopped: str,
) -> RefinedPlan:
    """The search's plan on ``g``, re-priced by the evaluator, when valid and better than the
    input's ``start``; the input otherwise."""
    new = np.asarray(search.state.a, dtype=np.int64)[labels]
    if search.moves and not validate(g, cluster, new):
        val = evaluate(g, cluster, new).objective
        if val < start:
            return RefinedPlan(val, new, search.moves, rounds, stopped)
    return RefinedPlan(start, a, 0, rounds, stopped)
