"""Optimal slicing of one topological order into at most k contiguous blocks (exact for that order).

SliceGraph's inner step (Archer et al., ICML 2024): any plan with an acyclic quotient is a
slicing of some topological order, and for a fixed order the best slicing is a dynamic program

    best[j][i] = min over t < i of max(best[j-1][t], f(order[t:i])).

f of a segment is computed incrementally while the segment grows (io counted exactly, also when
a segment feeds a non-adjacent one). Segments whose work alone exceeds a known upper bound are
never needed, so each start only sweeps a window; segments over the hard capacity stop the sweep
(params and peak only grow).
"""

from __future__ import annotations

import math

import numpy as np

from solver.cluster import Cluster
from solver.graph import Graph


class SegmentCoster:
    """Incremental f(S) for a growing segment of nodes; :meth:`reset` starts a new segment."""

    def __init__(self, g: Graph, cluster: Cluster):
        self.g = g
        B = cluster.link_bandwidth
        self.M = cluster.fast_memory
        self.Bm = cluster.slow_memory_bandwidth
        self.cap = math.inf if cluster.capacity is None else cluster.capacity * (1 + 1e-12)
        ncons = np.diff(g.t_ptr)
        # per node: tensors produced (tensor, io seconds, consumer count)
        self.out = [[] for _ in range(g.n)]
        for t, (p, s, c) in enumerate(
            zip(g.t_producer.tolist(), (g.t_size / B).tolist(), ncons.tolist(), strict=True)
        ):
            if c:
                self.out[p].append((t, s, c))
        # per node: tensors consumed (tensor, producer, io seconds, consumer count)
        self.inp = [[] for _ in range(g.n)]
        io = (g.t_size / B).tolist()
        prod = g.t_producer.tolist()
        ncl = ncons.tolist()
        for t, c in zip(g.pair_tensor.tolist(), g.t_cons.tolist(), strict=True):
            self.inp[c].append((t, prod[t], io[t], ncl[t]))
        self.par = [[] for _ in range(g.n)]
        for p, u in zip(g.pair_param.tolist(), g.p_users.tolist(), strict=True):
            self.par[u].append((p, float(g.p_size[p])))
        self.work = g.work.tolist()
        self.act = g.act.tolist()
        self.cnt = [0] * g.num_tensors
        self.pcnt = [0] * g.num_params
        self.inside = [False] * g.n
        self.reset()

    def reset(self) -> None:
        for t in getattr(self, "_touched_t", ()):
            self.cnt[t] = 0
        for p in getattr(self, "_touched_p", ()):
            self.pcnt[p] = 0
        for v in getattr(self, "_members", ()):
            self.inside[v] = False
        self._touched_t: list[int] = []
        self._touched_p: list[int] = []
        self._members: list[int] = []
        self.w = 0.0
        self.io_in = 0.0
        self.io_out = 0.0
        self.params = 0.0
        self.peak = 0.0

    def add(self, v: int) -> None:
        """Put node v into the segment."""
        self._members.append(v)
        self.inside[v] = True
        self.w += self.work[v]
        if self.act[v] > self.peak:
            self.peak = self.act[v]
        cnt = self.cnt
        for p, s in self.par[v]:
            if self.pcnt[p] == 0:
                self.params += s
                self._touched_p.append(p)
            self.pcnt[p] += 1
        for t, s, c in self.out[v]:
            k = cnt[t]
            if k:  # was received from outside; now produced inside
                self.io_in -= s
            if k < c:
                self.io_out += s
        for t, u, s, c in self.inp[v]:
            k = cnt[t] + 1
            cnt[t] = k
            if k == 1:
                self._touched_t.append(t)
            if self.inside[u]:
                if k == c:
                    self.io_out -= s
            elif k == 1:
                self.io_in += s

    @property
    def memory(self) -> float:
        return self.params + self.peak

    @property
    def cost(self) -> float:
        over = 0.0
        if math.inf != self.M:
            over = max(0.0, self.params + self.peak - self.M) / self.Bm
        return self.io_in + self.w + over + self.io_out


def slice_order(
    g: Graph,
    cluster: Cluster,
    order: np.ndarray,
    k: int | None = None,
    upper: float = math.inf,
    coster: SegmentCoster | None = None,
) -> tuple[float, np.ndarray | None]:
    """Best slicing of ``order`` into at most k contiguous blocks.

    Returns (bottleneck, assignment) or (inf, None) when no slicing fits the capacity (or none
    beats ``upper``). ``upper`` must be >= the best slicing's cost for the result to be optimal
    for this order; it only prunes.
    """
    k = cluster.devices if k is None else k
    n = g.n
    order = np.asarray(order, dtype=np.int64)
    cs = coster or SegmentCoster(g, cluster)
    W = np.concatenate([[0.0], np.cumsum(g.work[order])])
    lim = upper * (1 + 1e-9) if math.isfinite(upper) else math.inf
    best = np.full((k + 1, n + 1), math.inf)
    parent = np.full((k + 1, n + 1), -1, dtype=np.int64)
    best[0, 0] = 0.0
    order_l = order.tolist()
    for t in range(n):
        prev = best[:k, t]
        if not np.isfinite(prev).any():
            continue
        cs.reset()
        F: list[float] = []
        for i in range(t, n):
            cs.add(order_l[i])
            if cs.memory > cs.cap:
                break
            F.append(cs.cost)
            if W[i + 1] - W[t] > lim:
                break
        if not F:
            continue
        Fa = np.asarray(F)
        ends = np.arange(t + 1, t + 1 + len(F))
        for j in range(1, k + 1):
            pv = best[j - 1, t]
            if not math.isfinite(pv):
                continue
            cand = np.maximum(pv, Fa)
            cur = best[j, ends]
            better = cand < cur
            if better.any():
                best[j, ends[better]] = cand[better]
                parent[j, ends[better]] = t
    j = int(np.argmin(best[:, n]))
    val = float(best[j, n])
    if not math.isfinite(val):
        return math.inf, None
    a = np.empty(n, dtype=np.int64)
    i, blk = n, j - 1
    while i > 0:
        t = int(parent[j, i])
        a[order[t:i]] = blk
        i, j, blk = t, j - 1, blk - 1
    # blocks are numbered from 0; shift so the first used block is 0
    a -= a.min()
    return val, a


def linear_partition(weights: np.ndarray, k: int) -> np.ndarray:
    """Cut points splitting ``weights`` into at most k contiguous parts, minimising the largest sum.

    Exact for non-negative weights: binary search over the candidate maxima (prefix-sum
    differences) with a greedy feasibility check. Returns the part index of every element.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    P = np.concatenate([[0.0], np.cumsum(w)])

    def parts(limit: float) -> np.ndarray | None:
        out = np.empty(n, dtype=np.int64)
        start, part = 0, 0
        while start < n:
            end = int(np.searchsorted(P, P[start] + limit * (1 + 1e-12), side="right")) - 1
            end = max(end, start + 1)
            if P[end] - P[start] > limit * (1 + 1e-12):
                return None
            out[start:end] = part
            part += 1
            start = end
            if part > k:
                return None
        return out if part <= k else None

    lo, hi = float(w.max()), float(P[-1])
    # binary search on the value, then snap to the exact attained maximum
    for _ in range(100):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if parts(mid) is not None:
            hi = mid
        else:
            lo = mid
    res = parts(hi)
    assert res is not None
    return res
