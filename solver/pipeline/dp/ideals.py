"""The exact dynamic program over ideals (down-sets) of the DAG (Tarnawski et al., NeurIPS 2020).

A chain of ideals {} = I0 < I1 < ... < Ik = V gives exactly the plans with an acyclic quotient
(block j = Ij minus Ij-1), so

    dp[j][I] = min over ideals I' <= I of max(dp[j-1][I'], f(I minus I')).

Ideals are closed under *order* edges; f(S) counts every data edge (tensor) that crosses S,
whatever its direction, so data edges that are not order edges (the gradients of a training
graph) are priced exactly.

:func:`ideal_dp` runs over all ideals (``mtpp solve --method idealdp``). Exact when it
finishes; the number of ideals explodes on wide graphs, so it stops with a clear message at
``max_ideals``. Ideals are bitsets (numpy, packed per row for subset tests), block costs are
evaluated for all candidate I' of one I at once, and pairs whose block work alone exceeds an
upper bound (the cost of a known plan) are skipped, which keeps it exact.

:func:`solve_ideals` (the exact solver's first attempt on training graphs) handles the nodes
without any order edge (*free* nodes: a backward node whose co-location class has no forward
node; 17 on ResNet-50 training, 32 on BERT-12 training), which would double the ideals each.
It runs over the ideals of the other (*main*) nodes only and prices a block of main nodes M at

    g(M) = f_main(M) + sum over free components c of
           min(io_c(M), min over A of work(A) + io_c(M + A))

where a component c holds the free nodes that share tensors, io_c counts the tensors that touch
c, f_main the rest of f (work, the other tensors, the memory terms of M), and A ranges over the
non-empty subsets of c. *Proof that it is a lower bound.* Take any plan and a block S of it;
M = S's main nodes, A_c = S's nodes of component c. Each tensor touches at most one component,
so work(S) + io(S) = work(M) + io_main(M) + sum over c of [work(A_c) + io_c(M + A_c)]; each
bracket is >= the component's term of g (A_c empty gives io_c(M)); params and peak of S are at
least those of M, so the overflow and the capacity only grow. Hence f(S) >= g(M). The main
nodes of the blocks form a chain of main ideals (order edges join main nodes only), so the DP's
min over chains of max g is at most the plan's cost: a lower bound for every plan (nothing is
restricted: the free nodes may sit in any block, also one without main nodes). Its optimal
chain with the free nodes placed on its blocks (:func:`place_free`) is a real plan, evaluated by
the one evaluator; when its cost meets the bound it is optimal. With no free nodes g = f and the
DP is exact.

*Block costs of pairs.* A tensor crosses S = J minus I (I <= J ideals) exactly when S holds some
but not all of its members, and #members in S = #in J - #in I (per-ideal count tables). A
crossing tensor has a member in S and one in I or outside J, so it lies on the frontier of I or
of J (some but not all members inside): only frontier tensors are looked at (at most 10 per
ideal on the BERT training graphs). Pairs are priced only up to a work window: the DP first
runs on the pairs whose work is at most total work / k (or a known plan's cost), and the window
widens until the best chain fits it (a chain using a pair outside it costs more).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.graph import Graph


class IdealTimeout(MtppError):
    """The time limit passed before the DP finished (callers may fall back to a heuristic)."""


def too_many_ideals(max_ideals: int) -> MtppError:
    return MtppError(
        f"idealdp: the graph has more than {max_ideals:,} ideals (down-sets); the exact DP "
        "would not finish. Use --method cpsat, or raise the cap with max_ideals"
    )


def enumerate_ideals(
    g: Graph, max_ideals: int, deadline: float = math.inf, among: np.ndarray | None = None
) -> np.ndarray:
    """All ideals as a bool matrix (rows), sorted by size; raises past ``max_ideals`` or
    ``deadline`` (``time.perf_counter()``). ``among`` (a bool mask, closed under order-edge
    predecessors): the ideals of the nodes it holds only (the other columns stay False)."""
    allowed = np.ones(g.n, dtype=bool) if among is None else among
    if int(allowed.sum()) + 1 > max_ideals:  # a DAG of n nodes has >= n + 1 ideals (a chain)
        raise too_many_ideals(max_ideals)
    pred_mask = [0] * g.n
    ptr, idx = g.pred
    for v in range(g.n):
        for u in idx[ptr[v] : ptr[v + 1]].tolist():
            pred_mask[v] |= 1 << u
    sptr, sidx = g.succ
    succs = [[w for w in sidx[sptr[v] : sptr[v + 1]].tolist() if allowed[w]] for v in range(g.n)]
    # each ideal with the nodes that can join it (all predecessors inside): a new ideal's are
    # its parent's, less the node that joined, plus that node's successors that now can
    sources = sum(1 << v for v in np.flatnonzero(allowed).tolist() if pred_mask[v] == 0)
    seen = {0: sources}
    frontier = [0]
    while frontier:
        nxt = []
        if time.perf_counter() > deadline:
            raise IdealTimeout(
                f"idealdp: time limit reached while enumerating ideals ({len(seen):,} so "
                "far); use --method cpsat or raise --time-limit"
            )
        for ideal in frontier:
            addable = rest = seen[ideal]
            while rest:
                low = rest & -rest
                rest ^= low
                new = ideal | low
                if new in seen:
                    continue
                joined = addable & ~low
                for w in succs[low.bit_length() - 1]:
                    if pred_mask[w] & ~new == 0:
                        joined |= 1 << w
                seen[new] = joined
                nxt.append(new)
                if len(seen) > max_ideals:
                    raise too_many_ideals(max_ideals)
        frontier = nxt
    ideals = sorted(seen, key=lambda x: (bin(x).count("1"), x))
    mat = np.zeros((len(ideals), g.n), dtype=bool)
    for r, ideal in enumerate(ideals):
        bits = np.frombuffer(ideal.to_bytes((g.n + 7) // 8 or 1, "little"), dtype=np.uint8)
        mat[r] = np.unpackbits(bits, bitorder="little")[: g.n].astype(bool)
    return mat


def _group_counts(S: np.ndarray, members: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """For every row of ``S`` (bool, rows x nodes) and every group ``members[ptr[i]:ptr[i+1]]``,
    how many of the group's nodes the row holds (a running sum, differenced at the ends)."""
    run = np.zeros((len(S), len(members) + 1), dtype=np.int32)
    np.cumsum(S[:, members], axis=1, dtype=np.int32, out=run[:, 1:])
    return run[:, ptr[1:]] - run[:, ptr[:-1]]


def _single_user_params(g: Graph) -> np.ndarray:
    """Per node, the bytes of the parameters it alone uses (stored by its block, always)."""
    own = np.zeros(g.n)
    single = np.flatnonzero(np.diff(g.p_ptr) == 1)
    np.add.at(own, g.p_users[g.p_ptr[single]], g.p_size[single])
    return own


class _BlockCosts:
    """f(S) for many node sets S at once (rows of a bool matrix). A tensor crosses S when S
    holds some but not all of its members (producer and consumers, each once)."""

    def __init__(self, g: Graph, cluster: Cluster, only: np.ndarray | None = None):
        """``only``: a bool mask of the tensors whose io is counted (default: all)."""
        self.g, self.c = g, cluster
        keep = np.diff(g.t_ptr) > 0  # a tensor without consumers never moves
        if only is not None:
            keep &= only
        self.tensors = np.flatnonzero(keep)
        sets = [
            np.unique(np.r_[g.t_producer[t], g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]])
            for t in self.tensors.tolist()
        ]
        self.members = np.concatenate(sets).astype(np.int64) if sets else np.zeros(0, np.int64)
        self.ptr = np.r_[0, np.cumsum([len(x) for x in sets])].astype(np.int64)
        self.size = np.diff(self.ptr)
        self.io = g.t_size[self.tensors] / cluster.link_bandwidth
        self.mem = math.isfinite(cluster.fast_memory) or cluster.capacity is not None
        self.own = _single_user_params(g)
        self.shared = np.flatnonzero(np.diff(g.p_ptr) > 1)

    def io_of(self, S: np.ndarray) -> np.ndarray:
        """io_in(S) + io_out(S) of every row (of the counted tensors)."""
        if not len(self.tensors):
            return np.zeros(len(S))
        cnt = _group_counts(S, self.members, self.ptr)
        return ((cnt > 0) & (cnt < self.size)).astype(np.float64) @ self.io

    def params_of(self, S: np.ndarray) -> np.ndarray:
        """The parameter bytes each row stores."""
        g = self.g
        params = S.astype(np.float64) @ self.own
        for p in self.shared.tolist():
            params += g.p_size[p] * S[:, g.p_users[g.p_ptr[p] : g.p_ptr[p + 1]]].any(axis=1)
        return params

    def __call__(self, S: np.ndarray, work: np.ndarray | None = None) -> np.ndarray:
        """f of every row; ``work``: the rows' work when the caller knows it."""
        g, c = self.g, self.c
        f = (S.astype(np.float64) @ g.work if work is None else work) + self.io_of(S)
        if self.mem:
            params = self.params_of(S)
            peak = (S * g.act).max(axis=1) if S.shape[1] else np.zeros(len(S))
            if math.isfinite(c.fast_memory):
                f = f + np.maximum(0.0, params + peak - c.fast_memory) / c.slow_memory_bandwidth
            if c.capacity is not None:
                f = np.where(params + peak > c.capacity * (1 + 1e-12), np.inf, f)
        return f


def ideal_dp(
    g: Graph,
    cluster: Cluster,
    upper: float = math.inf,
    max_ideals: int = 50_000,
    time_limit: float = math.inf,
) -> tuple[float, np.ndarray | None, dict]:
    """Optimal (bottleneck, assignment) over all plans, or (inf, None) if none fits.

    ``upper`` must be the cost of some valid plan (or inf); it only prunes. First
    :func:`solve_ideals` (exact without free nodes; with them, when its plan meets its bound),
    else the DP over every ideal, free nodes included."""
    t0 = time.perf_counter()
    res = solve_ideals(g, cluster, cluster.devices, upper, time_limit, max_ideals)
    if math.isinf(res.lower):  # no chain of main blocks fits the capacity: no plan does
        return math.inf, None, res.stats
    # the plan meets the DP's optimum up to float rounding (res.lower is that optimum, 1e-9 low)
    if res.assignment is not None and res.value <= res.lower / (1 - EPS) * (1 + 1e-10):
        return res.value, res.assignment, res.stats
    left = time_limit - (time.perf_counter() - t0)
    return _all_ideals_dp(g, cluster, upper, max_ideals, left)


def _all_ideals_dp(
    g: Graph, cluster: Cluster, upper: float, max_ideals: int, time_limit: float
) -> tuple[float, np.ndarray | None, dict]:
    """The DP over every ideal (free nodes included: their ideals double per node)."""
    t0 = time.perf_counter()
    k = cluster.devices
    ideals = enumerate_ideals(g, max_ideals, deadline=t0 + time_limit)
    N = len(ideals)
    packed = np.packbits(ideals, axis=1)
    work = ideals @ g.work
    cost = _BlockCosts(g, cluster)
    lim = upper * (1 + 1e-9) if math.isfinite(upper) else math.inf
    dp = np.full((k + 1, N), math.inf)
    arg = np.full((k + 1, N), -1, dtype=np.int64)
    dp[0, 0] = 0.0
    for r in range(1, N):
        if time.perf_counter() - t0 > time_limit:
            raise IdealTimeout(f"idealdp: time limit reached after {r:,} of {N:,} ideals")
        cand = np.flatnonzero(
            ~np.any(packed[:r] & ~packed[r], axis=1) & (work[r] - work[:r] <= lim)
        )
        if not len(cand):
            continue
        f = cost(ideals[r] & ~ideals[cand])
        both = np.maximum(dp[:k, cand], f[None, :])
        best = both.argmin(axis=1)
        dp[1:, r] = both[np.arange(k), best]
        arg[1:, r] = cand[best]
    full = N - 1
    j = int(np.argmin(dp[:, full]))
    val = float(dp[j, full])
    stats = {"ideals": N, "seconds": round(time.perf_counter() - t0, 3)}
    if not math.isfinite(val):
        return math.inf, None, stats
    a = np.empty(g.n, dtype=np.int64)
    r, blk = full, j - 1
    while j > 0:
        prev = int(arg[j, r])
        a[ideals[r] & ~ideals[prev]] = blk
        r, j, blk = prev, j - 1, blk - 1
    return val, a, stats


# ---------------------------------------------------------------- nodes without order edges
# Training graphs order only their forward edges: a backward node that no forward node shares a
# co-location class with has no order edge at all (a *free* node; 17 on ResNet-50, 32 on
# BERT-12), and every ideal with or without it is an ideal, so the ideals multiply by 2 per free
# node. Instead the DP runs over the ideals of the other (*main*) nodes and prices each block of
# main nodes M at a relaxed cost (the module docstring has the proof):
#
#     g(M) = f(M) + sum over free components c of min(0, min over A in c of d_c(M, A)),
#     d_c(M, A) = work(A) + io(M + A) - io(M) over the tensors that touch c,
#
# where a component holds the free nodes that share tensors. Each tensor touches one component,
# so for a block S = M + A (A its free nodes) work + io is additive over components, the memory
# terms only grow with S and f(S) >= g(M): the DP's optimum over chains of main ideals is a lower
# bound for every plan. Its chain with the free nodes placed on the blocks is a real plan; when
# that plan's cost meets the bound it is optimal.
MAX_COMPONENT = 8  # free nodes of one component priced by enumeration (2^8 subsets)
PAIR_CHUNK = 20_000  # pairs of ideals priced at once
MAX_PAIRS = 6_000_000  # pairs of ideals listed in one window (about 24 bytes each, and copies)
EPS = 1e-9  # the bound is reported this much (relative) low, for float rounding


@dataclass(frozen=True)
class FreeComponent:
    """Free nodes that share tensors (``nodes``), the tensors that touch them (a bool mask over
    tensors) and the other nodes of those tensors (``touch``, a bool mask over nodes)."""

    nodes: np.ndarray
    tensors: np.ndarray
    touch: np.ndarray


@dataclass(frozen=True)
class FreeSplit:
    """``main``: the nodes the DP's ideals range over; ``components``: the rest."""

    main: np.ndarray
    components: list[FreeComponent]


@dataclass
class IdealsResult:
    """What the DP over main ideals proved and found, on the graph it was given.

    ``lower``: no plan has a bottleneck below it; ``value`` and ``assignment``: the best plan
    found (inf and None when none); ``optimal``: they meet (relative 1e-6)."""

    lower: float = 0.0
    value: float = math.inf
    assignment: np.ndarray | None = None
    stats: dict = field(default_factory=dict)
    before_tie_break: np.ndarray | None = None  # the first optimal plan, when the tie-break won

    @property
    def optimal(self) -> bool:
        return self.assignment is not None and self.value <= self.lower * (1 + 1e-6)


@dataclass
class _Pairs:
    """Pairs of ideals I < J (indices into the sorted ideals, ``hi`` ascending) with the relaxed
    cost of the block J minus I."""

    lo: np.ndarray
    hi: np.ndarray
    cost: np.ndarray


def _tensor_members(g: Graph) -> list[np.ndarray]:
    """The nodes of every tensor: its producer and its consumers."""
    return [
        np.r_[g.t_producer[t], g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]] for t in range(g.num_tensors)
    ]


def split_free(g: Graph) -> FreeSplit:
    """The nodes without an order edge, grouped by shared tensors; a component of more than
    :data:`MAX_COMPONENT` nodes stays with the main nodes (its ideals are enumerated)."""
    free = np.ones(g.n, dtype=bool)
    free[g.e_src] = False
    free[g.e_dst] = False
    members = _tensor_members(g)
    parent = np.arange(g.n)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for m in members:
        fm = [int(v) for v in m if free[v]]
        for v in fm[1:]:
            parent[root(v)] = root(fm[0])
    roots = np.array([root(v) for v in range(g.n)])
    main = ~free
    comps = []
    for r in np.unique(roots[free]).tolist():
        nodes = np.flatnonzero(free & (roots == r))
        if len(nodes) > MAX_COMPONENT:
            main[nodes] = True
            continue
        inc = np.zeros(g.n, dtype=bool)
        inc[nodes] = True
        tensors = np.array([bool(inc[m].any()) for m in members], dtype=bool)
        touch = np.zeros(g.n, dtype=bool)
        for t in np.flatnonzero(tensors).tolist():
            touch[members[t]] = True
        touch[nodes] = False
        comps.append(FreeComponent(nodes, tensors, touch))
    return FreeSplit(main, comps)


def _timeout(what: str) -> IdealTimeout:
    return IdealTimeout(f"idealdp: time limit reached while {what}")


def _pair_list(
    ideals: np.ndarray, work: np.ndarray, above: float, lim: float, deadline: float
) -> _Pairs:
    """Every pair I < J of ideals whose block J minus I has work in (``above``, ``lim``]."""
    packed = np.packbits(ideals, axis=1)
    los, his, count = [], [], 0
    for r in range(1, len(ideals)):
        if r % 256 == 0 and time.perf_counter() > deadline:
            raise _timeout(f"listing the blocks ({r:,} of {len(ideals):,} ideals)")
        w = work[r] - work[:r]
        idx = np.flatnonzero((w <= lim) & (w > above))
        idx = idx[~np.any(packed[idx] & ~packed[r], axis=1)]
        count += len(idx)
        if count > MAX_PAIRS:
            raise MtppError(
                f"idealdp: more than {MAX_PAIRS:,} blocks (pairs of ideals) to price; "
                "use --method cpsat"
            )
        los.append(idx)
        his.append(np.full(len(idx), r, dtype=np.int64))
    lo = np.concatenate(los) if los else np.zeros(0, np.int64)
    hi = np.concatenate(his) if his else np.zeros(0, np.int64)
    return _Pairs(lo, hi, np.zeros(len(lo)))


def _subsets(nodes: np.ndarray) -> list[np.ndarray]:
    """Every non-empty subset of ``nodes``."""
    bits = np.arange(len(nodes))
    return [nodes[(m >> bits) & 1 == 1] for m in range(1, 1 << len(nodes))]


def _counts(ideals: np.ndarray, members: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """For every ideal (row) and every group ``members[ptr[i]:ptr[i + 1]]`` (non-empty), how
    many of the group's nodes the ideal holds."""
    return _group_counts(ideals, members, ptr)


@dataclass(frozen=True)
class _MemberSets:
    """The tensors that can cross a block (two members or more: ``ts``) and their members
    (producer and consumers, each once: ``sets``)."""

    ts: np.ndarray
    sets: list[np.ndarray]


def _member_sets(g: Graph) -> _MemberSets:
    sets = [np.unique(m) for m in _tensor_members(g)]
    ts = np.array([t for t, s in enumerate(sets) if len(s) > 1], dtype=np.int64)
    return _MemberSets(ts, [sets[t] for t in ts.tolist()])


@dataclass
class _TensorTable:
    """Tensors (``ts``) with their io time, member count (``size``) and how many members every
    ideal holds (``cnt``: ideals x tensors)."""

    ts: np.ndarray
    io: np.ndarray
    size: np.ndarray
    cnt: np.ndarray


def _tensor_table(
    g: Graph, cluster: Cluster, ideals: np.ndarray, ms: _MemberSets, keep: np.ndarray
) -> _TensorTable:
    """The table of the tensors of ``ms`` that ``keep`` (a mask over all tensors) holds."""
    ts = ms.ts
    sel = np.flatnonzero(keep[ts])
    spans = [ms.sets[i] for i in sel.tolist()]
    sub_ptr = np.r_[0, np.cumsum([len(s) for s in spans])].astype(np.int64)
    flat = np.concatenate(spans) if spans else np.zeros(0, np.int64)
    cnt = _counts(ideals, flat, sub_ptr)
    return _TensorTable(ts[sel], g.t_size[ts[sel]] / cluster.link_bandwidth, np.diff(sub_ptr), cnt)


def _frontiers(tab: _TensorTable) -> np.ndarray:
    """The tensors of every ideal's frontier (some but not all members inside), as columns of
    ``tab`` padded with a last column that never crosses."""
    inside = (tab.cnt > 0) & (tab.cnt < tab.size)
    width = int(inside.sum(axis=1).max()) if inside.size else 0
    out = np.full((len(tab.cnt), max(width, 1)), len(tab.size), dtype=np.int64)
    for r, row in enumerate(inside):
        cols = np.flatnonzero(row)
        out[r, : len(cols)] = cols
    return out


class _PairCosts:
    """f(J minus I) for many pairs of ideals I <= J at once, from per-ideal tables.

    A tensor crosses S = J minus I exactly when S holds some but not all of its members
    (producer and consumers), and #members in S = #in J - #in I. A crossing tensor has a member
    in S and one in I or outside J, so it is on the frontier of I or of J (some but not all
    members inside): io(S) = sum over t on I's frontier of [#in J > #in I] + sum over t on J's
    frontier of [#in I = 0] (a tensor on both frontiers counts in the first sum only: it has a
    member in I). The tensors of free nodes are left to :class:`_ComponentPrices`. Parameters:
    single-user ones by prefix sums, shared ones when #users in J > #users in I."""

    def __init__(
        self, g: Graph, cluster: Cluster, ideals: np.ndarray, ms: _MemberSets, free: np.ndarray
    ):
        self.g, self.c, self.ideals = g, cluster, ideals
        main_only = np.ones(g.num_tensors, dtype=bool)
        for t, s in zip(ms.ts.tolist(), ms.sets, strict=True):
            main_only[t] = not free[s].any()
        tab = _tensor_table(g, cluster, ideals, ms, main_only)
        self.front = _frontiers(tab)
        pad = np.zeros((len(ideals), 1), dtype=tab.cnt.dtype)
        self.cnt = np.hstack([tab.cnt, pad])  # the padding column: never inside, io 0
        self.io = np.r_[tab.io, 0.0]
        self.work = ideals.astype(np.float64) @ g.work
        users = np.diff(g.p_ptr)
        self.own = ideals.astype(np.float64) @ _single_user_params(g)  # prefix sums
        self.shared = np.flatnonzero(users > 1)
        spans = [np.arange(g.p_ptr[p], g.p_ptr[p + 1]) for p in self.shared.tolist()]
        members = g.p_users[np.concatenate(spans)] if spans else np.zeros(0, np.int64)
        self.users = _counts(ideals, members, np.r_[0, np.cumsum(users[self.shared])])
        self.mem = math.isfinite(cluster.fast_memory) or cluster.capacity is not None

    def io_of(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        fi, fj = self.front[lo], self.front[hi]
        lo2, hi2 = lo[:, None], hi[:, None]
        from_i = self.cnt[hi2, fi] > self.cnt[lo2, fi]
        from_j = self.cnt[lo2, fj] == 0
        return (self.io[fi] * from_i).sum(axis=1) + (self.io[fj] * from_j).sum(axis=1)

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        g, c = self.g, self.c
        f = self.work[hi] - self.work[lo] + self.io_of(lo, hi)
        if not self.mem:
            return f
        params = self.own[hi] - self.own[lo]
        if len(self.shared):
            used = (self.users[hi] - self.users[lo]) > 0
            params = params + used.astype(np.float64) @ g.p_size[self.shared]
        peak = np.zeros(len(lo))
        if g.act.any():
            S = self.ideals[hi] & ~self.ideals[lo]
            peak = (S * g.act).max(axis=1)
        if math.isfinite(c.fast_memory):
            f = f + np.maximum(0.0, params + peak - c.fast_memory) / c.slow_memory_bandwidth
        if c.capacity is not None:
            f = np.where(params + peak > c.capacity * (1 + 1e-12), np.inf, f)
        return f


@dataclass
class _ComponentPrices:
    """One free component: how many nodes of its tensors each ideal holds (``touch``), its
    tensors (``tab``), how many members of each every non-empty subset A of the component is
    (``add``), and work(A)."""

    touch: np.ndarray
    tab: _TensorTable
    add: np.ndarray
    work: np.ndarray


def _component_prices(
    g: Graph, cluster: Cluster, ideals: np.ndarray, ms: _MemberSets, comp: FreeComponent
) -> _ComponentPrices:
    tab = _tensor_table(g, cluster, ideals, ms, comp.tensors)
    sets = [ms.sets[i] for i in np.flatnonzero(comp.tensors[ms.ts]).tolist()]
    subsets = _subsets(comp.nodes)
    add = np.zeros((len(subsets), len(tab.ts)), dtype=np.int64)
    for s, A in enumerate(subsets):
        add[s] = [len(np.intersect1d(m, A)) for m in sets]
    touch = ideals[:, comp.touch].sum(axis=1)
    work = np.array([float(g.work[A].sum()) for A in subsets])
    return _ComponentPrices(touch, tab, add, work)


def _free_part(cp: _ComponentPrices, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For pairs whose block J minus I holds a node of the component's tensors: the io of those
    tensors when no free node joins the block, or less when some subset A of the component
    joins it with its work: min(io, min over A of work(A) + io with A). (Other blocks: 0.)"""
    d = cp.tab.cnt[hi] - cp.tab.cnt[lo]
    size, io = cp.tab.size, cp.tab.io
    best = ((d > 0) & (d < size)).astype(np.float64) @ io
    for s in range(len(cp.work)):
        d2 = d + cp.add[s]
        best = np.minimum(best, cp.work[s] + ((d2 > 0) & (d2 < size)).astype(np.float64) @ io)
    return best


class _Pricer:
    """The relaxed cost g(J minus I) of pairs of ideals: f of the main nodes plus, for each
    free component, the cheaper of leaving it out and taking a subset of it in."""

    def __init__(self, g: Graph, cluster: Cluster, split: FreeSplit, ideals: np.ndarray):
        ms = _member_sets(g)
        self.pc = _PairCosts(g, cluster, ideals, ms, ~split.main)
        self.comps = [_component_prices(g, cluster, ideals, ms, c) for c in split.components]
        self.comps = [cp for cp in self.comps if len(cp.tab.ts)]  # no tensor: nothing to price
        # ideals x components: how many nodes of the component's tensors the ideal holds
        touch = [cp.touch for cp in self.comps]
        self.touch = np.stack(touch, axis=1) if touch else np.zeros((len(ideals), 0), np.int64)

    def price(self, pairs: _Pairs, deadline: float) -> None:
        for s in range(0, len(pairs.lo), PAIR_CHUNK):
            if time.perf_counter() > deadline:
                raise _timeout(f"pricing the blocks ({s:,} of {len(pairs.lo):,})")
            lo, hi = pairs.lo[s : s + PAIR_CHUNK], pairs.hi[s : s + PAIR_CHUNK]
            f = self.pc(lo, hi)
            touched = self.touch[hi] > self.touch[lo]  # blocks holding a node of the tensors
            for c, cp in enumerate(self.comps):
                rows = np.flatnonzero(touched[:, c])
                if len(rows):
                    f[rows] += _free_part(cp, lo[rows], hi[rows])
            pairs.cost[s : s + PAIR_CHUNK] = f


def _merge(a: _Pairs, b: _Pairs) -> _Pairs:
    """The pairs of both, ``hi`` ascending."""
    hi = np.r_[a.hi, b.hi]
    order = np.argsort(hi, kind="stable")
    return _Pairs(np.r_[a.lo, b.lo][order], hi[order], np.r_[a.cost, b.cost][order])


@dataclass
class _Chain:
    """A chain's value (its largest step cost, or its summed cost) and its steps: pair indices,
    -1 for an empty block, first block first."""

    value: float
    steps: list[int]


def _chain_dp(pairs: _Pairs, N: int, k: int, cap: float | None = None) -> _Chain:
    """The best chain {} = I0 <= ... <= Ik = V (equal steps: empty blocks): the least largest
    step cost, or with ``cap`` the least summed cost of the chains whose steps all cost at most
    ``cap`` (the least latency at a bottleneck)."""
    dp = np.full(N, math.inf)
    dp[0] = 0.0
    back = np.full((k + 1, N), -1, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, np.diff(pairs.hi) != 0]) if len(pairs.hi) else []
    starts = np.asarray(starts, dtype=np.int64)
    group = np.cumsum(np.r_[False, np.diff(pairs.hi) != 0]) if len(pairs.hi) else starts
    hs = pairs.hi[starts]
    cost = pairs.cost if cap is None else np.where(pairs.cost <= cap, pairs.cost, math.inf)
    for j in range(1, k + 1):
        val = np.maximum(dp[pairs.lo], cost) if cap is None else dp[pairs.lo] + cost
        new = dp.copy()
        if len(val):
            m = np.minimum.reduceat(val, starts)
            first = np.flatnonzero(val <= m[group])
            _, at = np.unique(group[first], return_index=True)
            better = m < new[hs]
            new[hs[better]] = m[better]
            back[j, hs[better]] = first[at][better]
        dp = new
    chain, r = [], N - 1
    for j in range(k, 0, -1):
        p = int(back[j, r])
        chain.append(p)
        if p >= 0:
            r = int(pairs.lo[p])
    return _Chain(float(dp[N - 1]), chain[::-1])


@dataclass(frozen=True)
class _Move:
    """Where a move puts free nodes, and the plan's (largest, summed) block cost after it."""

    block: int
    worst: float
    total: float


def _block_rows(a: np.ndarray, k: int) -> np.ndarray:
    return np.arange(k)[:, None] == a[None, :]


def _best_move(cost: _BlockCosts, a: np.ndarray, nodes: np.ndarray, k: int) -> _Move:
    """The block that ``nodes`` (free, moved together) make the plan cheapest on, by (largest
    block cost, sum of block costs); nodes with a = -1 are left out of every block. Option b
    changes block b only (and the block the nodes leave): 2k block costs price all k options."""
    moved = a.copy()
    moved[nodes] = -1
    without = _block_rows(moved, k)
    joined = without.copy()
    joined[:, nodes] = True
    f = cost(np.vstack([without, joined]))
    base, grown = f[:k], f[k:]
    rest = [np.delete(base, b) for b in range(k)]  # the other blocks (inf - inf is avoided)
    worst = np.array([max(grown[b], r.max(initial=0.0)) for b, r in enumerate(rest)])
    total = np.array([grown[b] + r.sum() for b, r in enumerate(rest)])
    b = int(np.lexsort((total, worst))[0])
    return _Move(b, float(worst[b]), float(total[b]))


def place_free(
    g: Graph, cluster: Cluster, split: FreeSplit, a_main: np.ndarray, k: int
) -> np.ndarray:
    """A plan from a chain of main blocks (``a_main``, -1 on free nodes): each free component on
    the block that makes the plan cheapest (heaviest components first), then single free nodes
    moved while that lowers (largest, summed) block cost."""
    cost = _BlockCosts(g, cluster)
    a = a_main.copy()
    comps = sorted(split.components, key=lambda c: -float(g.work[c.nodes].sum()))
    for comp in comps:
        a[comp.nodes] = _best_move(cost, a, comp.nodes, k).block
    singles = [np.array([v]) for c in comps for v in c.nodes.tolist()]
    for _ in range(4):
        moved = False
        for v in singles:
            f = cost(_block_rows(a, k))
            mv = _best_move(cost, a, v, k)
            if (mv.worst, mv.total) < (float(f.max()), float(f.sum())) and mv.block != a[v[0]]:
                a[v] = mv.block
                moved = True
        if not moved:
            break
    return a


def _main_assignment(ideals: np.ndarray, pairs: _Pairs, chain: list[int], n: int) -> np.ndarray:
    """Block j of the chain's main nodes (-1 elsewhere)."""
    a = np.full(n, -1, dtype=np.int64)
    for j, p in enumerate(chain):
        if p >= 0:
            a[ideals[pairs.hi[p]] & ~ideals[pairs.lo[p]]] = j
    return a


@dataclass
class _Window:
    """The DP's result over the pairs whose work is at most ``lim``: exact for the relaxed
    problem when ``best <= lim`` or when no pair was left out."""

    pairs: _Pairs
    lim: float
    best: float
    chain: list[int]


def _relaxed_optimum(
    g: Graph, ideals: np.ndarray, pricer: _Pricer, k: int, upper: float, deadline: float
) -> _Window:
    """The relaxed optimum (or proof that it is at least ``upper``): the DP over the pairs
    whose work fits a window, widened (1.5 times, or to the best chain found) until the best
    chain fits it. A chain with a block outside the window costs more than the window."""
    work = ideals.astype(np.float64) @ g.work
    total = float(work[-1] - work[0])
    lim = upper * (1 + EPS) if math.isfinite(upper) else total / k * 1.05
    win = _Window(_Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)), -1.0, 0, [])
    while True:
        new = _pair_list(ideals, work, win.lim, lim, deadline)
        pricer.price(new, deadline)
        pairs = _merge(win.pairs, new)
        chain = _chain_dp(pairs, len(ideals), k)
        best = chain.value
        win = _Window(pairs, lim, best, chain.steps)
        if best <= lim or lim >= total or math.isfinite(upper):
            return win
        lim = min(best, lim * 1.5)


def solve_ideals(
    g: Graph,
    cluster: Cluster,
    k: int,
    upper: float = math.inf,
    time_limit: float = math.inf,
    max_ideals: int = 50_000,
) -> IdealsResult:
    """The DP over the ideals of the main nodes with the free nodes' relaxed prices: a proven
    lower bound for every plan of ``g`` (a coarse graph) on k blocks, and a plan; optimal when
    they meet (always when there are no free nodes). ``upper``: the cost of a known plan (it
    only prunes blocks). Raises :class:`IdealTimeout` at the time limit and ``MtppError`` past
    ``max_ideals`` main ideals."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    split = split_free(g)
    ideals = enumerate_ideals(g, max_ideals, deadline, among=split.main)
    pricer = _Pricer(g, cluster, split, ideals)
    win = _relaxed_optimum(g, ideals, pricer, k, upper, deadline)
    res = IdealsResult(lower=min(win.best, upper) * (1 - EPS))
    res.stats = {
        "ideals": len(ideals),
        "free_nodes": int(sum(len(c.nodes) for c in split.components)),
        "pairs": len(win.pairs.lo),
        "dp_seconds": round(time.perf_counter() - t0, 3),
    }
    if math.isfinite(win.best):
        a_main = _main_assignment(ideals, win.pairs, win.chain, g.n)
        a = place_free(g, cluster, split, a_main, k)
        res.value = float(evaluate(g, cluster, a, k=k).objective)
        res.assignment = a
    if res.optimal:
        _tie_break(g, cluster, split, ideals, win, k, res)
    res.stats["seconds"] = round(time.perf_counter() - t0, 3)
    return res


def _tie_break(
    g: Graph,
    cluster: Cluster,
    split: FreeSplit,
    ideals: np.ndarray,
    win: _Window,
    k: int,
    res: IdealsResult,
) -> None:
    """Among the chains whose blocks all cost at most the optimum (relaxed prices), the one of
    least summed cost (the same work: the least io), its free nodes placed; kept when the
    evaluator finds it no worse and it receives fewer bytes, or as many at a lower latency.
    Not a proof of the lexicographic optimum (the free nodes are placed, not searched)."""
    t = time.perf_counter()
    chain = _chain_dp(win.pairs, len(ideals), k, cap=win.best)
    summary = "least latency among the DP's chains at the optimum, free nodes placed on it"
    kept = False
    if math.isfinite(chain.value) and res.assignment is not None:
        a_main = _main_assignment(ideals, win.pairs, chain.steps, g.n)
        a = place_free(g, cluster, split, a_main, k)
        new, old = evaluate(g, cluster, a, k=k), evaluate(g, cluster, res.assignment, k=k)
        key_new = (float(new.bytes_in.sum()), new.latency)
        kept = new.objective <= res.value and key_new < (float(old.bytes_in.sum()), old.latency)
        if kept:
            res.before_tie_break, res.assignment = res.assignment, a
            res.value = float(new.objective)
    res.stats["tie_break"] = {
        "summary": summary + ("" if kept else " (the first optimal plan was no worse: kept)"),
        "seconds": round(time.perf_counter() - t, 3),
    }
