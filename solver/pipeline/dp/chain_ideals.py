"""The exact ideal DP on graphs that separators cut into small gaps (Llama-shaped decoders).

Every plan is a chain of ideals (down-sets) {} = I0 <= I1 <= ... <= Ik = V, block j being
Ij minus Ij-1 (:mod:`solver.pipeline.dp.ideals`). A *separator* is comparable with every other
node (:func:`solver.pipeline.dp.separators.separators`); with separators s_0 < s_1 < ... every ideal
is
"s_0..s_{g-1}, every node of the gaps before g, and a down-closed subset D of gap g" (proof in
docs/bounds.md), so a decoder has few ideals (18,731 for the Llama-2-7B shape) and all of them
are enumerated: nothing is restricted. The cost f(J minus I) of every pair of ideals whose work
fits under a known plan's cost comes from prefix sums and the few tensors that cross each
ideal's frontier; a fewest-blocks DP decides "is there a plan with every block <= T" exactly,
and bisection over the sorted pair costs finds the optimum. A cost proven infeasible is a
certified lower bound; a feasible one comes with its plan.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.core.units import format_bytes, format_time
from solver.pipeline.dp.separators import separators

MAX_IDEALS = 200_000  # all ideals of all gaps
MAX_GAP_IDEALS = 3_000  # ideals of one gap (the subset test of a gap is a square table)
MAX_GAP_NODES = 64  # nodes of one gap (a subset of a gap is a 64-bit mask)
MAX_PAIRS = 20_000_000  # pairs (I, J) kept in the cost table (20 bytes each)
MAX_TIE_BREAK = 10_000_000  # ideals x (k + 1) of the tie-break's table (20 bytes each)
EPS = 1e-9  # relative slack on float comparisons; a bound is reported (1 - EPS) low
PROBE_BAND = 1e-7  # the bisection's first probe: the largest cost this much below a plan's
IDEALS_SMALL_MIN_NODES = 64  # below this many coarse nodes CP-SAT proves in milliseconds: the
# DP runs on graphs smaller than IDEALS_MIN_NODES only from here up (``small``)
IDEALS_MIN_NODES = 300  # ideal_chain runs on graphs of at least this many coarse nodes (smaller
# ones are solved exactly by CP-SAT in seconds, which also reports its own proof)


class _Out(Exception):
    """The deadline passed or a table would be too large: the DP does not apply."""


@dataclass
class ChainResult:
    """What the DP proved and found (on the coarse graph).

    ``lower``: no plan has a bottleneck below it (0 when nothing was proven); ``value`` and
    ``assignment``: the best plan found (inf and None when none); ``optimal``: they meet."""

    lower: float = 0.0
    value: float = math.inf
    assignment: np.ndarray | None = None
    stats: dict = field(default_factory=dict)
    before_tie_break: np.ndarray | None = None  # the first optimal plan found

    @property
    def optimal(self) -> bool:
        return self.assignment is not None and self.value <= self.lower * (1 + 1e-6)


class _Ideals:
    """Every ideal as (gap a, local subset D of gap a: a bool row and a 64-bit mask), sorted
    by gap then size, with its work (prefix sums) and every node's level."""

    def __init__(self, g: Graph, sep: np.ndarray, deadline: float):
        n = g.n
        rank = g.topo_rank
        s_nodes = np.flatnonzero(sep)
        s_nodes = s_nodes[np.argsort(rank[s_nodes])]
        m = len(s_nodes)
        gap = np.searchsorted(rank[s_nodes], rank)  # separators before each node
        self.m, self.n = m, n
        # level: a separator s_j is in ideal (a, D) iff a > j (level 2j + 1); a node of gap g
        # iff a > g or (a == g and its bit is in D) (level 2g)
        level = 2 * gap
        level[s_nodes] = 2 * np.arange(m) + 1
        self.level = level
        members: list[list[int]] = [[] for _ in range(m + 1)]
        for v in np.flatnonzero(~sep)[np.argsort(rank[~sep])].tolist():
            members[int(gap[v])].append(v)
        self.L = max(1, max(len(x) for x in members))
        if self.L > MAX_GAP_NODES:
            raise _Out(f"a gap of more than {MAX_GAP_NODES} nodes")
        local = np.zeros(n, dtype=np.int64)
        for mem in members:
            local[mem] = np.arange(len(mem))
        self.local = local
        ptr, idx = g.pred
        a_list, d_list = [], []
        for gi, mem in enumerate(members):
            masks = _gap_ideals(mem, local, ptr, idx, set(mem), deadline)
            masks = np.pad(masks, ((0, 0), (0, self.L - masks.shape[1])))
            a_list.append(np.full(len(masks), gi, dtype=np.int64))
            d_list.append(masks)
            if sum(len(x) for x in a_list) > MAX_IDEALS:
                raise _Out(f"more than {MAX_IDEALS:,} ideals")
        self.a = np.concatenate(a_list)
        self.dbits = np.concatenate(d_list)  # N x L bool
        weights = np.uint64(1) << np.arange(self.L, dtype=np.uint64)
        self.dmask = np.bitwise_or.reduce(np.where(self.dbits, weights, 0), axis=1).astype(
            np.uint64
        )
        self.N = len(self.a)
        self.gstart = np.searchsorted(self.a, np.arange(m + 2))
        self.members = members
        # work prefix: full gaps and separators before gap a, plus the local subset
        w = np.asarray(g.work, dtype=float)
        gap_work = np.array([w[mem].sum() for mem in members])
        sep_work = w[s_nodes]
        before = np.zeros(m + 1)
        before[1:] = np.cumsum(gap_work[:-1] + sep_work)
        self.before = before
        self.gap_end = before + gap_work  # work of an ideal of gap g is at most this
        self.W = before[self.a] + self._local_sum(w)
        self.s_nodes = s_nodes

    def prefix(self, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per ideal: the sum of the node values ``vals`` over its nodes; and per gap: that
        sum at the gap's end (every node up to the separator after it, exclusive)."""
        vals = np.asarray(vals, dtype=float)
        gap_sum = np.array([vals[mem].sum() for mem in self.members])
        before = np.zeros(self.m + 1)
        before[1:] = np.cumsum(gap_sum[:-1] + vals[self.s_nodes])
        return before[self.a] + self._local_sum(vals), before + gap_sum

    def _local_sum(self, vals: np.ndarray) -> np.ndarray:
        """Per ideal: the sum of ``vals`` over its local subset."""
        loc = np.zeros((self.m + 1, self.L))
        for gi, mem in enumerate(self.members):
            loc[gi, : len(mem)] = vals[mem]
        return (self.dbits * loc[self.a]).sum(axis=1)

    def contains(self, v: int, rows: np.ndarray) -> np.ndarray:
        """Whether node v is in each ideal of ``rows``."""
        lv = int(self.level[v])
        if lv % 2:
            return self.a[rows] > lv // 2
        g = lv // 2
        return (self.a[rows] > g) | ((self.a[rows] == g) & self.dbits[rows, self.local[v]])

    def contains_many(self, nodes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether each of ``nodes`` (columns) is in each ideal of ``rows`` (rows)."""
        lv = self.level[nodes]
        g = (lv // 2)[None, :]
        a = self.a[rows][:, None]
        part = (lv % 2 == 0)[None, :] & (a == g) & self.dbits[rows][:, self.local[nodes]]
        return (a > g) | part

    def row(self, r: int) -> np.ndarray:
        """Membership of every node in ideal r (length n + 1: the last entry is a False pad)."""
        a = int(self.a[r])
        out = np.zeros(self.n + 1, dtype=bool)
        out[: self.n] = self.level < 2 * a
        mem = self.members[a] if a <= self.m else []
        if mem:
            out[mem] = self.dbits[r, : len(mem)]
        return out


def _gap_ideals(mem, local, ptr, idx, memset, deadline) -> np.ndarray:
    """The down-closed subsets of one gap (predecessors outside the gap are always present),
    as a bool matrix sorted by size."""
    L = len(mem)
    pm = [0] * L
    for i, v in enumerate(mem):
        for u in idx[ptr[v] : ptr[v + 1]].tolist():
            if u in memset:
                pm[i] |= 1 << int(local[u])
    seen = {0}
    frontier = [0]
    while frontier:
        if time.perf_counter() > deadline:
            raise _Out("time limit while enumerating ideals")
        nxt = []
        for x in frontier:
            for i in range(L):
                b = 1 << i
                if not x & b and pm[i] & ~x == 0 and (x | b) not in seen:
                    seen.add(x | b)
                    nxt.append(x | b)
            if len(seen) > MAX_GAP_IDEALS:
                raise _Out(f"a gap with more than {MAX_GAP_IDEALS:,} ideals")
        frontier = nxt
    masks = sorted(seen, key=lambda x: (bin(x).count("1"), x))
    out = np.zeros((len(masks), L), dtype=bool)
    for r, x in enumerate(masks):
        for i in range(L):
            if x >> i & 1:
                out[r, i] = True
    return out


def _first_outside(ideals: _Ideals, rows: np.ndarray, nodes: np.ndarray) -> tuple:
    """For each row: whether some of ``nodes`` are outside the ideal, and the (level, local
    bitmask) of the outside ones of the lowest and of the highest level. An ideal holding a
    node of some level holds every node of lower levels, so for an ideal J containing the
    row's ideal, "some outside node is in J" is "some lowest one is in J" and "some outside
    node is not in J" is "some highest one is not in J"."""
    inside = ideals.contains_many(nodes, rows)
    lev = ideals.level[nodes][None, :]
    low = np.where(inside, NO_LOW, lev).min(axis=1)
    high = np.where(inside, -1, lev).max(axis=1)
    bit = np.where(
        ideals.level[nodes] % 2 == 0,
        np.uint64(1) << ideals.local[nodes].astype(np.uint64),
        np.uint64(0),
    )[None, :]
    outside = ~inside
    low_mask = np.bitwise_or.reduce(np.where(outside & (lev == low[:, None]), bit, 0), axis=1)
    high_mask = np.bitwise_or.reduce(np.where(outside & (lev == high[:, None]), bit, 0), axis=1)
    return (
        outside.any(axis=1),
        (low, low_mask.astype(np.uint64)),
        (high, high_mask.astype(np.uint64)),
    )


NO_LOW = np.iinfo(np.int64).max  # the level of "no node" among the lowest (never in J)


class _Frontier:
    """Per ideal, in slots: the tensors it sends to nodes outside (size, level and local
    bitmask of the lowest and of the highest outside consumers) and the multi-user parameters
    with users outside (size, lowest outside users); per ideal, the bytes it sends.
    ``done``: the entries of the gaps built before a deadline stopped an earlier call (kept
    there, so that the next call goes on from the next gap)."""

    def __init__(self, g: Graph, ideals: _Ideals, deadline: float, done: dict | None = None):
        lev = ideals.level
        t_lev_p = lev[g.t_producer]
        t_lev_c = np.full(g.num_tensors, -1, dtype=np.int64)
        if len(g.pair_tensor):
            np.maximum.at(t_lev_c, g.pair_tensor, lev[g.t_cons])
        multi = np.flatnonzero(np.diff(g.p_ptr) > 1)
        p_lev = np.array(
            [lev[g.p_users[g.p_ptr[p] : g.p_ptr[p + 1]]].max() for p in multi], dtype=np.int64
        )
        done = {} if done is None else done
        t_entries: list = done.setdefault("t", [])  # (rows, size, lowest, highest (level, mask))
        p_entries: list = done.setdefault("p", [])
        for gi in range(done.get("gaps", 0), ideals.m + 1):
            if time.perf_counter() > deadline:
                done["gaps"] = gi
                raise _Out("time limit while building frontiers")
            rows = np.arange(ideals.gstart[gi], ideals.gstart[gi + 1])
            for t in np.flatnonzero((t_lev_p <= 2 * gi) & (t_lev_c >= 2 * gi)).tolist():
                cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
                pin = ideals.contains(int(g.t_producer[t]), rows)
                some_out, low, high = _first_outside(ideals, rows, cons)
                k = pin & some_out
                if k.any():
                    t_entries.append(
                        (rows[k], float(g.t_size[t]), low[0][k], low[1][k], high[0][k], high[1][k])
                    )
            for j in np.flatnonzero(p_lev >= 2 * gi).tolist():
                p = int(multi[j])
                users = g.p_users[g.p_ptr[p] : g.p_ptr[p + 1]]
                some_out, low, _ = _first_outside(ideals, rows, users)
                k = some_out
                if k.any():
                    p_entries.append((rows[k], float(g.p_size[p]), low[0][k], low[1][k]))
        N = ideals.N
        self.t_size, (self.t_low, self.t_low_mask, self.t_high, self.t_high_mask) = _slots(
            N, t_entries, [NO_LOW, 0, -1, 0]
        )
        self.p_size, (self.p_low, self.p_low_mask) = _slots(N, p_entries, [NO_LOW, 0])
        self.out = self.t_size.sum(axis=1)
        self.t_reach = self.t_high.max(axis=1)  # the highest level a frontier tensor reaches
        # the highest level at which an outside user of a multi-user parameter first appears
        self.p_reach = np.where(self.p_size > 0, self.p_low, -1).max(axis=1)


def _slots(N: int, entries: list, pads: list) -> tuple[np.ndarray, list[np.ndarray]]:
    """Entries (rows, size, *fields) as arrays per (ideal, slot): the size (0 in an unused
    slot) and each field (its pad value in an unused slot)."""
    cnt = np.zeros(N, dtype=np.int64)
    for rows, *_ in entries:
        cnt[rows] += 1
    F = max(1, int(cnt.max()) if N else 1)
    size = np.zeros((N, F))
    fields = [
        np.full((N, F), pad, dtype=np.uint64 if i % 2 else np.int64) for i, pad in enumerate(pads)
    ]
    slot = np.zeros(N, dtype=np.int64)
    for rows, s, *vals in entries:
        sl = slot[rows]
        size[rows, sl] = s
        for arr, v in zip(fields, vals, strict=True):
            arr[rows, sl] = v
        slot[rows] += 1
    return size, fields


class _Costs:
    """f(J minus I) for ideals I < J, as the evaluator computes it (homogeneous cluster)."""

    def __init__(self, g: Graph, cluster: Cluster, ideals: _Ideals, fr: _Frontier):
        self.g, self.id, self.fr = g, ideals, fr
        self.B = cluster.link_bandwidth
        self.M, self.Bm, self.C = (
            cluster.fast_memory,
            cluster.slow_memory_bandwidth,
            cluster.capacity,
        )
        self.mem = math.isfinite(self.M) or self.C is not None
        # the memory tables are built even when f does not need them (training's memory does)
        m, n = ideals.m, ideals.n
        single = np.zeros(n)
        nu = np.diff(g.p_ptr)
        one = np.flatnonzero(nu == 1)
        np.add.at(single, g.p_users[g.p_ptr[one]], g.p_size[one])
        s_nodes = np.flatnonzero(ideals.level % 2 == 1)
        s_nodes = s_nodes[np.argsort(ideals.level[s_nodes])]
        gap_p = np.array([single[mem].sum() for mem in ideals.members])
        pb = np.zeros(m + 1)
        pb[1:] = np.cumsum(gap_p[:-1] + single[s_nodes])
        self.P1 = pb[ideals.a] + ideals._local_sum(single)
        act = np.asarray(g.act, dtype=float)
        self.multi_total = float(g.p_size[nu > 1].sum())
        self.act_max = float(act.max()) if n else 0.0
        self.sep_act = act[s_nodes]
        self.gap_act = np.array([act[mem].max() if mem else 0.0 for mem in ideals.members])
        loc = np.zeros((m + 1, ideals.L))
        for gi, mem in enumerate(ideals.members):
            loc[gi, : len(mem)] = act[mem]
        self.loc_act = loc
        la = loc[ideals.a]
        self.a_in = np.where(ideals.dbits, la, 0.0).max(axis=1)
        self.a_after = np.where(ideals.dbits, 0.0, la).max(axis=1)

    def pairs(
        self, gi: int, J: np.ndarray, Is: np.ndarray, lim: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """For pairs (J = Js[jl], I = Is) with J in gap gi and I strictly inside J: the mask of
        those with f(J minus I) <= lim (and within the capacity), and their costs."""
        ids = self.id
        io, recv = self._io_bytes(gi, J, Is)
        self.recv = recv  # bytes the block receives (the tie-break's transfer)
        f = ids.W[J] - ids.W[Is]
        f = f + io / self.B
        ok = f <= lim
        if not self.mem or not ok.any():
            return ok, f
        # params + peak is at most the single-user params, every multi-user one and the
        # largest act: when that fits, no block overflows and the capacity holds
        params = self.P1[J] - self.P1[Is]
        most = params + self.multi_total + self.act_max
        if (most <= self.M).all() and (self.C is None or (most <= self.C).all()):
            return ok, f
        params, peak = self._params_peak(gi, J, Is)
        used = params + peak
        if math.isfinite(self.M):
            f = f + np.maximum(0.0, used - self.M) / self.Bm
        ok = f <= lim
        if self.C is not None:
            ok &= used <= self.C * (1 + 1e-12)
        return ok, f

    def _io_bytes(self, gi: int, J: np.ndarray, Is: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bytes in + bytes out of each block J minus I (J in gap gi), and the bytes in."""
        fr = self.fr
        two_a = 2 * gi
        # every frontier tensor of I ends below gap gi: J receives them all and none passes
        recv = fr.out[Is]
        io = recv + fr.out[J]
        near = np.flatnonzero(fr.t_reach[Is] >= two_a)
        if not len(near):
            return io, recv
        In, Jn = Is[near], J[near]
        dj = self.id.dmask[Jn][:, None]
        lo, hi = fr.t_low[In], fr.t_high[In]
        got = (lo < two_a) | ((lo == two_a) & ((fr.t_low_mask[In] & dj) != 0))  # received
        passes = (hi > two_a) | ((hi == two_a) & ((fr.t_high_mask[In] & ~dj) != 0))  # sent on
        recv = recv.copy()
        recv[near] = (fr.t_size[In] * got).sum(axis=1)
        io[near] = recv[near] + fr.out[Jn] - (fr.t_size[In] * passes).sum(axis=1)
        return io, recv

    def _params_peak(self, gi: int, J: np.ndarray, Is: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Parameter bytes and activation peak of each block J minus I (J in gap gi), exactly
        as :func:`solver.core.cost.evaluate` counts them."""
        ids, fr = self.id, self.fr
        two_a = 2 * gi
        dj = ids.dmask[J][:, None]
        params = self.P1[J] - self.P1[Is]
        # below gap gi every multi-user parameter of I's frontier has a user in J
        shared = fr.p_size[Is].sum(axis=1)
        near = np.flatnonzero(fr.p_reach[Is] >= two_a)
        if len(near):
            In = Is[near]
            lo = fr.p_low[In]
            used_p = (lo < two_a) | ((lo == two_a) & ((fr.p_low_mask[In] & dj[near]) != 0))
            shared[near] = (fr.p_size[In] * used_p).sum(axis=1)
        params = params + shared
        ai = ids.a[Is]
        peak = np.empty(len(Is))
        same = ai == gi
        if same.any():
            only = ids.dbits[J[same]] & ~ids.dbits[Is[same]]
            peak[same] = np.where(only, self.loc_act[gi][None, :], 0.0).max(axis=1)
        o = ~same
        if o.any():
            lo = int(ai[o].min())
            # rm[g - lo]: largest act over separators g..gi-1 and whole gaps g+1..gi-1
            seg = np.maximum(self.sep_act[lo:gi], np.r_[self.gap_act[lo + 1 : gi], 0.0])
            rm = np.maximum.accumulate(seg[::-1])[::-1]
            peak[o] = np.maximum(np.maximum(self.a_after[Is[o]], rm[ai[o] - lo]), self.a_in[J[o]])
        return params, peak


CHUNK = 200_000  # pairs priced at once


@dataclass
class _PairTable:
    """The block candidates in CSR form: the blocks that end at ideal J start at the ideals
    ``cand[ptr[J]:ptr[J + 1]]``, with their costs f(J minus I) in ``cost`` and the bytes each
    receives in ``recv``."""

    ptr: np.ndarray
    cand: np.ndarray
    cost: np.ndarray
    recv: np.ndarray


def _table(
    ids: _Ideals, cost: _Costs, allowed: np.ndarray, upper: float, deadline: float, st: dict
) -> _PairTable:
    """The pairs (I, J) with I < J allowed and f(J minus I) <= upper. ``st`` keeps the
    progress: a call stopped by the deadline resumes."""
    if not st:
        st.update(lim=upper * (1 + EPS), gi=0, total=0, cands=[], costs=[], recvs=[])
        st["counts"] = np.zeros(ids.N, dtype=np.int64)
    lim, counts = st["lim"], st["counts"]
    cands, costs, recvs = st["cands"], st["costs"], st["recvs"]
    for gi in range(st["gi"], ids.m + 1):
        if time.perf_counter() > deadline:
            raise _Out("time limit while pricing blocks")
        found = _gap_pairs(ids, gi, allowed, ids.W, ids.gap_end, lim)
        if found is None:
            st["gi"] = gi + 1
            continue
        Js, jl, Is = found.ends, found.end_row, found.starts
        for c0 in range(0, len(jl), CHUNK):
            sl = slice(c0, c0 + CHUNK)
            ok, f = cost.pairs(gi, Js[jl[sl]], Is[sl], lim)
            recvs.append(cost.recv[ok])
            np.add.at(counts, Js[jl[sl][ok]], 1)  # repeated J: add.at, not +=
            cands.append(Is[sl][ok].astype(np.int32))
            costs.append(f[ok])
            st["total"] += int(ok.sum())
        st["gi"] = gi + 1
        if st["total"] > MAX_PAIRS:
            raise _Out(f"more than {MAX_PAIRS:,} block candidates")
    ptr = np.zeros(ids.N + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    cand = np.concatenate(cands) if cands else np.zeros(0, np.int32)
    f = np.concatenate(costs) if costs else np.zeros(0)
    recv = np.concatenate(recvs) if recvs else np.zeros(0)
    return _PairTable(ptr, cand, f, recv)


@dataclass(frozen=True)
class _GapPairs:
    """The pairs (I, J) whose J lies in one gap: J = ``ends[end_row]``, I = ``starts``."""

    ends: np.ndarray
    end_row: np.ndarray
    starts: np.ndarray


def _gap_pairs(
    ids: _Ideals,
    gi: int,
    allowed: np.ndarray,
    weight: np.ndarray,
    gap_end: np.ndarray,
    lim: float,
) -> _GapPairs | None:
    """Every pair of allowed ideals I < J with J in gap gi and weight(J) - weight(I) <= about
    ``lim`` (``weight``: a per-ideal prefix sum of a node weight >= 0, ``gap_end``: its value
    at each gap's end); None when gap gi has no allowed J."""
    g0, g1 = int(ids.gstart[gi]), int(ids.gstart[gi + 1])
    Js = np.arange(max(g0, 1), g1)
    Js = Js[allowed[Js]]
    if not len(Js):
        return None
    glo = int(np.searchsorted(gap_end, weight[Js].min() - lim, side="left"))
    base = np.arange(int(ids.gstart[min(glo, gi)]), g0)
    base = base[allowed[base]]
    same = np.arange(g0, g1)
    same = same[allowed[same]]
    near = weight[base][None, :] >= weight[Js][:, None] - lim
    sub = (ids.dmask[same][None, :] & ~ids.dmask[Js][:, None]) == 0  # subsets of J's D
    sub &= (same[None, :] < Js[:, None]) & (weight[same][None, :] >= weight[Js][:, None] - lim)
    jl, col = np.nonzero(np.concatenate([near, sub], axis=1))
    return _GapPairs(Js, jl, np.concatenate([base, same])[col])


def _fewest_blocks(ptr, cand, f, N: int, T: float, k: int) -> np.ndarray | None:
    """The ideals of a chain with at most k blocks each of cost <= T, or None if none exists."""
    dp = np.full(N, k + 1, dtype=np.int64)
    arg = np.full(N, -1, dtype=np.int64)
    dp[0] = 0
    for J in range(1, N):
        a, b = ptr[J], ptr[J + 1]
        if a == b:
            continue
        c = cand[a:b]
        d = np.where(f[a:b] <= T, dp[c], k + 1)
        i = int(d.argmin())
        if d[i] < k:
            dp[J], arg[J] = d[i] + 1, c[i]
    if dp[N - 1] > k:
        return None
    chain = [N - 1]
    while chain[-1] != 0:
        chain.append(int(arg[chain[-1]]))
    return np.asarray(chain[::-1])


def _assignment(ids: _Ideals, chain: np.ndarray) -> np.ndarray:
    """Block of every node for a chain of ideals (block b = chain[b + 1] minus chain[b])."""
    a = np.full(ids.n, -1, dtype=np.int64)
    prev = ids.row(int(chain[0]))[: ids.n]
    for b, r in enumerate(chain[1:].tolist()):
        cur = ids.row(r)[: ids.n]
        a[cur & ~prev] = b
        prev = cur
    return a


def _least_transfer(table: _PairTable, N: int, T: float, k: int) -> np.ndarray | None:
    """Among chains of at most k blocks each of cost <= T, the one that transfers the fewest
    bytes, then has the lowest latency (sum of block costs); None when there is none.
    A DP over (ideal, blocks used)."""
    ptr, cand, f, recv = table.ptr, table.cand, table.cost, table.recv
    tb = np.full((N, k + 1), math.inf)
    tl = np.full((N, k + 1), math.inf)
    arg = np.full((N, k + 1), -1, dtype=np.int32)
    tb[0, 0] = tl[0, 0] = 0.0
    for J in range(1, N):
        a, b = ptr[J], ptr[J + 1]
        if a == b:
            continue
        ok = f[a:b] <= T
        if not ok.any():
            continue
        c = cand[a:b][ok]
        byt = tb[c, :k] + recv[a:b][ok][:, None]  # (candidates, blocks before)
        lat = tl[c, :k] + f[a:b][ok][:, None]
        low = byt.min(axis=0)
        lat = np.where(byt == low[None, :], lat, math.inf)
        i = lat.argmin(axis=0)
        cols = np.arange(k)
        tb[J, 1:] = low
        tl[J, 1:] = lat[i, cols]
        arg[J, 1:] = np.where(np.isfinite(low), c[i], -1)
    last = N - 1
    low = tb[last].min()
    if not math.isfinite(low):
        return None
    j = int(np.argmin(np.where(tb[last] == low, tl[last], math.inf)))
    chain = [last]
    while j > 0:
        chain.append(int(arg[chain[-1], j]))
        j -= 1
    return np.asarray(chain[::-1])


def _tie_break(
    g: Graph, cluster: Cluster, k: int, ids: _Ideals, table: _PairTable, res: ChainResult
) -> None:
    """At the proven optimum, the plan that sends the fewest bytes, then has the lowest latency
    (issue 11 item 4): exact, over every plan with that bottleneck."""
    first = evaluate(g, cluster, res.assignment, k=k)
    t_before, l_before = float(first.bytes_in.sum()), float(first.latency)
    if ids.N * (k + 1) > MAX_TIE_BREAK:
        res.stats["tie_break"] = {"summary": "tie-break skipped: too many ideals x blocks"}
        return
    chain = _least_transfer(table, ids.N, res.value * (1 + EPS), k)
    note = None
    if chain is not None:
        a = _assignment(ids, chain)
        ev = evaluate(g, cluster, a, k=k)
        t_after, l_after = float(ev.bytes_in.sum()), float(ev.latency)
        if ev.objective <= first.objective and (t_after, l_after) < (t_before, l_before):
            res.assignment = a
            note = (
                f"tie-break at the same bottleneck: transferred {format_bytes(t_before)} -> "
                f"{format_bytes(t_after)}, latency {format_time(l_before)} -> "
                f"{format_time(l_after)} (exact DP)"
            )
        elif ev.objective <= first.objective:
            note = (
                f"tie-break: proven: no plan with the same bottleneck sends less than "
                f"{format_bytes(t_before)} (latency {format_time(l_before)}; exact DP)"
            )
    if note is None:  # float disagreement between the table and the evaluator
        note = "tie-break: kept the first optimal plan"
    res.stats["tie_break"] = {
        "order": "bottleneck, then transferred bytes, then latency",
        "summary": note,
    }


def _bisect(
    table: _PairTable,
    N: int,
    k: int,
    lo_val: float,
    deadline: float,
    res: ChainResult,
    ids: _Ideals,
) -> None:
    """Bisection over the distinct pair costs: the largest proven infeasible one gives
    ``res.lower`` (the next cost up: every plan's bottleneck is a pair cost), a feasible one
    a plan. ``lo_val``: a proven lower bound (every cost below it is infeasible)."""
    ptr, cand, f = table.ptr, table.cand, table.cost
    costs = np.unique(f)
    lo = int(np.searchsorted(costs, lo_val * (1 - EPS), side="left")) - 1  # costs[lo] < lo_val
    hi = len(costs) - 1
    chain = _fewest_blocks(ptr, cand, f, N, costs[hi], k) if hi >= 0 else None
    if chain is None:
        return  # even the known plan's cost is not met: float disagreement, claim nothing
    lo = min(lo, hi - 1)  # costs[hi] is feasible
    best = chain
    res.stats["dp_runs"] = 1
    # the known plan is often optimal: first the largest cost clearly below it (costs within
    # PROBE_BAND of one another are float noise of the same blocks); one run then proves it
    below = int(np.searchsorted(costs, costs[hi] * (1 - PROBE_BAND), side="left")) - 1
    first = below > lo
    while hi - lo > 1 and time.perf_counter() < deadline:
        mid = below if first else (lo + hi) // 2
        first = False
        chain = _fewest_blocks(ptr, cand, f, N, costs[mid], k)
        res.stats["dp_runs"] += 1
        if chain is None:
            lo = mid
        else:
            hi, best = mid, chain
    if hi - lo > 1:
        res.stats["stopped"] = "time limit during the bisection"
    # costs[lo] infeasible (or lo = -1): every plan's bottleneck is a pair cost, so >= costs[lo+1]
    res.lower = max(res.lower, float(costs[lo + 1]) * (1 - EPS))
    res.assignment = _assignment(ids, best)
    res.value = float(costs[hi])


def _window(ids: _Ideals, lim: float) -> int:
    """How many pairs (I, J) have a work at most about ``lim`` (whole gaps: an upper count)."""
    glo = np.searchsorted(ids.gap_end, ids.W - lim, side="left")
    return int((np.arange(ids.N) - ids.gstart[np.minimum(glo, ids.a)]).sum())


def chain_ideal_dp(
    g: Graph,
    cluster: Cluster,
    k: int,
    lower: float = 0.0,
    time_limit: float = 10.0,
    upper: float = math.inf,
    state: dict | None = None,
) -> ChainResult:
    """The exact optimum of ``g`` (a coarse graph) on k homogeneous devices when its separators
    cut it into gaps with few ideals; else what was proven and found by the deadline.

    ``lower`` must be a proven lower bound and ``upper`` the cost of a known plan (they only
    skip costs below the one and prune blocks above the other). The result's plan is a real
    plan; its ``lower`` is proven for every plan (only the full set of ideals is used for it;
    the first pass, on ideals that end at gap ends, gives only a plan). ``state``: a dict kept
    by the caller between calls on the same graph, cluster and k, so that a call stopped by its
    deadline resumes where it stopped."""
    t0 = time.perf_counter()
    st = {} if state is None else state
    res = ChainResult(lower=0.0)
    sep = separators(g)
    why = _chain_unsupported(g, cluster, k, sep)
    if why is not None:
        res.stats["skipped"] = why
        return res
    try:
        _solve_chain(g, cluster, k, sep, lower, upper, t0, t0 + time_limit, st, res)
    except _Out as e:  # "stopped" (by the deadline: a later call resumes) or "skipped"
        res.stats["stopped" if "time limit" in str(e) else "skipped"] = str(e)
    res.stats["seconds"] = round(time.perf_counter() - t0, 3)
    return res


def _chain_unsupported(g: Graph, cluster: Cluster, k: int, sep: np.ndarray | None) -> str | None:
    """Why the DP does not apply (None: it does): no separators computed (a graph too large
    for reachability), devices or links that differ, or a tensor along no order edge."""
    if sep is None or not cluster.homogeneous or k < 1:
        return "graph too large for reachability, or a heterogeneous cluster"
    n = g.n
    order_edges = set((g.e_src * n + g.e_dst).tolist())
    du, dv = g.data_edges
    cross = du != dv  # a tensor a merged node consumes itself never crosses
    if not all(x in order_edges for x in (du[cross] * n + dv[cross]).tolist()):
        return "a data edge is not an order edge"
    return None


def _solve_chain(
    g: Graph,
    cluster: Cluster,
    k: int,
    sep: np.ndarray,
    lower: float,
    upper: float,
    t0: float,
    deadline: float,
    st: dict,
    res: ChainResult,
) -> None:
    """The DP's two passes into ``res``: plans that cut only at gap ends (a quick real plan,
    whose cost prunes the second pass), then every ideal and every block whose cost fits
    under the best plan's; the exact tie-break at a proven optimum. Raises :class:`_Out`
    past the deadline (``st`` keeps the work done) or when a table would be too large."""
    cost = _prepared_costs(g, cluster, sep, lower, deadline, st)
    ids = cost.id
    res.stats["ideals"] = ids.N
    res.stats["prepare_seconds"] = round(time.perf_counter() - t0, 3)
    if "gap_end" not in st:
        st["gap_end"] = _gap_end_plan(g, cluster, k, cost, upper, deadline)
    quick = st["gap_end"]
    if quick.assignment is not None:
        res.stats["gap_end_plan"] = quick.value
        res.value, res.assignment = quick.value, quick.assignment
    window = _window(ids, min(upper, res.value) * (1 + EPS))
    res.stats["window_pairs"] = window
    if window > 4 * MAX_PAIRS:
        raise _Out(f"about {window:,} block candidates")
    everything = np.ones(ids.N, dtype=bool)
    table = _table(
        ids, cost, everything, min(upper, res.value), deadline, st.setdefault("table", {})
    )
    res.stats["pairs"] = len(table.cand)
    res.stats["table_seconds"] = round(time.perf_counter() - t0, 3)
    full = ChainResult(lower=0.0)
    _bisect(table, ids.N, k, lower, deadline, full, ids)
    res.lower = full.lower
    if full.assignment is not None:
        val = float(evaluate(g, cluster, full.assignment, k=k).objective)
        if val < res.value:
            res.value, res.assignment = val, full.assignment
    if res.optimal:  # one more pass over the table, even past the deadline
        full.value = res.value
        full.assignment = res.assignment
        _tie_break(g, cluster, k, ids, table, full)
        res.before_tie_break, res.assignment = res.assignment, full.assignment
        res.stats["tie_break"] = full.stats["tie_break"]
        st.clear()  # done: the tables are no longer needed
    if "stopped" in full.stats:
        res.stats["stopped"] = full.stats["stopped"]


def _prepared_costs(
    g: Graph, cluster: Cluster, sep: np.ndarray, lower: float, deadline: float, st: dict
) -> _Costs:
    """The ideals of the chain and what prices their pairs (computed once, kept in ``st``)."""
    if "cost" not in st:
        # kept across calls that a deadline stops: the ideals and the frontiers built so far
        if "ideals" not in st:
            st["ideals"] = _Ideals(g, sep, deadline)
        ids = st["ideals"]
        # every plan has a block of cost >= lower: the table holds at least the pairs
        # whose work fits under it (a quick refusal before the frontiers are built)
        if _window(ids, lower) > 4 * MAX_PAIRS:
            raise _Out(f"about {_window(ids, lower):,} block candidates or more")
        frontier = _Frontier(g, ids, deadline, st.setdefault("frontier", {}))
        st["cost"] = _Costs(g, cluster, ids, frontier)
        del st["ideals"], st["frontier"]
    return st["cost"]


@dataclass
class _GapEndPlan:
    """The best plan that cuts only at gap ends (``assignment`` None: none) and its cost."""

    value: float
    assignment: np.ndarray | None


def _gap_end_plan(
    g: Graph, cluster: Cluster, k: int, cost: _Costs, upper: float, deadline: float
) -> _GapEndPlan:
    """The first pass: the DP on the ideals that end at gap ends (a plan, no proof)."""
    ids = cost.id
    sizes = np.array([len(x) for x in ids.members])
    ends = ~ids.dbits.any(axis=1) | (ids.dbits.sum(axis=1) == sizes[ids.a])
    coarse = ChainResult()
    table = _table(ids, cost, ends, upper, deadline, {})
    _bisect(table, ids.N, k, 0.0, deadline, coarse, ids)
    val = math.inf
    if coarse.assignment is not None:
        val = float(evaluate(g, cluster, coarse.assignment, k=k).objective)
    return _GapEndPlan(val, coarse.assignment)


def ideal_chain(
    g: Graph,
    cluster: Cluster,
    k: int,
    lower: float,
    time_limit: float,
    small: bool = False,
    upper: float | None = None,
) -> ChainResult | None:
    """The exact DP over the ideals of ``g``'s separator chain (:func:`chain_ideal_dp`) on
    its coarse view, computed once per graph, cluster and k (the warm start of the exact
    solver reads the same result); None on a cluster whose devices or links differ, and on
    graphs of fewer than IDEALS_MIN_NODES coarse nodes (IDEALS_SMALL_MIN_NODES with
    ``small``) unless it was computed already. ``upper``: the cost of a known plan (it prunes
    the blocks priced, and the DP first tries to prove that plan optimal)."""
    cg, _ = coarse_view(g)
    if not cluster.homogeneous:
        return None
    cache = g.__dict__.setdefault("_chain_ideals", {})  # the graph is immutable
    key = (
        k,
        cluster.fast_memory,
        cluster.capacity,
        cluster.link_bandwidth,
        cluster.slow_memory_bandwidth,
    )
    too_small = cg.n < (IDEALS_SMALL_MIN_NODES if small else IDEALS_MIN_NODES)
    if too_small and key not in cache:
        return None
    hit, state = cache.get(key, (None, {}))
    if hit is None or (not hit.optimal and "stopped" in hit.stats):
        hit = chain_ideal_dp(
            cg,
            cluster,
            k,
            max(lower, hit.lower if hit else 0.0),
            time_limit,
            upper=math.inf if upper is None else upper,
            state=state,
        )  # resumes a run its deadline stopped
        cache[key] = (hit, state)
    return hit


class ChainIdealsDoNotApply(MtppError):
    """The separator chain's ideals cannot be enumerated or priced here (the reason)."""


@dataclass(frozen=True)
class BlockTerms:
    """Blocks S = J minus I of the chain's ideals (arrays over blocks): the terms of f(S) of
    :func:`solver.core.cost.evaluate` on a homogeneous cluster, exactly."""

    first: np.ndarray  # I (ideal index)
    last: np.ndarray  # J
    work: np.ndarray  # forward work of S (seconds)
    io: np.ndarray  # bytes in plus bytes out, each tensor once (io_in + io_out = io / B)
    params: np.ndarray  # parameter bytes S stores
    peak: np.ndarray  # the largest act of a node of S


class ChainIdeals:
    """Every ideal of a coarse graph that separators cut into small gaps (sorted by gap, then
    size: I strictly inside J comes before J), and the exact terms of f for their blocks, from
    prefix sums and the frontier tensors, for other DPs over the same ideals (the training DP).
    Raises :class:`ChainIdealsDoNotApply` when the DP's structure does not apply."""

    def __init__(self, g: Graph, cluster: Cluster, deadline: float):
        sep = separators(g)
        why = _chain_unsupported(g, cluster, 1, sep)
        if why is not None:
            raise ChainIdealsDoNotApply(why)
        try:
            ids = _Ideals(g, sep, deadline)
            self._cost = _Costs(g, cluster, ids, _Frontier(g, ids, deadline))
        except _Out as e:
            raise ChainIdealsDoNotApply(str(e)) from None
        self._ids = ids

    @property
    def count(self) -> int:
        """The number of ideals (the first is {}, the last every node)."""
        return self._ids.N

    @property
    def order(self) -> np.ndarray:
        """Per ideal, a key that two ideals share only when neither contains the other
        (gap, then size): the ideals of one key can be handled together."""
        return self._ids.a * (self._ids.L + 1) + self._ids.dbits.sum(axis=1)

    def prefix(self, vals: np.ndarray) -> np.ndarray:
        """Per ideal: the sum of the node values ``vals`` over its nodes."""
        return self._ids.prefix(vals)[0]

    @property
    def own_params(self) -> np.ndarray:
        """Per ideal: the bytes of the parameters that only one node uses, over its nodes (a
        block J minus I stores at least own_params[J] - own_params[I])."""
        return self._cost.P1

    @property
    def gap_ends(self) -> np.ndarray:
        """Per ideal: whether it ends at a gap's end (it holds none or all of its gap)."""
        ids = self._ids
        sizes = np.array([len(x) for x in ids.members])
        return ~ids.dbits.any(axis=1) | (ids.dbits.sum(axis=1) == sizes[ids.a])

    def blocks(self, weight: np.ndarray, lim: float, deadline: float, keep=None, allowed=None):
        """Every block J minus I (I strictly inside J) with w(J minus I) <= about ``lim``, in
        chunks of :class:`BlockTerms` (w: a node weight >= 0, e.g. work; ``weight`` its values
        per node); with ``keep(first, last)`` (a mask over pairs of ideal indices) only those it
        keeps are priced; with ``allowed`` (a mask over ideals) only blocks between allowed
        ideals. Raises :class:`ChainIdealsDoNotApply` past the deadline."""
        ids, cost = self._ids, self._cost
        per_ideal, gap_end = ids.prefix(weight)
        everything = np.ones(ids.N, dtype=bool) if allowed is None else allowed
        for gi in range(ids.m + 1):
            if time.perf_counter() > deadline:
                raise ChainIdealsDoNotApply("time limit while pricing blocks")
            found = _gap_pairs(ids, gi, everything, per_ideal, gap_end, lim)
            if found is None:
                continue
            for c0 in range(0, len(found.end_row), CHUNK):
                J = found.ends[found.end_row[c0 : c0 + CHUNK]]
                Is = found.starts[c0 : c0 + CHUNK]
                if keep is not None:
                    mask = keep(Is, J)
                    J, Is = J[mask], Is[mask]
                io, _ = cost._io_bytes(gi, J, Is)
                params, peak = cost._params_peak(gi, J, Is)
                yield BlockTerms(Is, J, ids.W[J] - ids.W[Is], io, params, peak)

    def assignment(self, chain: list[int]) -> np.ndarray:
        """Block of every node for a chain of ideals (block b = chain[b + 1] minus chain[b])."""
        return _assignment(self._ids, np.asarray(chain))
