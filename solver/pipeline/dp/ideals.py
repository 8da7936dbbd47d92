"""The exact dynamic program over ideals (down-sets) of the DAG (Tarnawski et al., NeurIPS 2020).

A chain of ideals {} = I0 < I1 < ... < Ik = V gives exactly the plans with an acyclic quotient
(block j = Ij minus Ij-1), so

    dp[j][I] = min over ideals I' <= I of max(dp[j-1][I'], f(I minus I')).

Exact when it finishes; the number of ideals explodes on wide graphs, so it stops with a clear
message at ``max_ideals``. Ideals are bitsets (numpy, packed per row for subset tests), block
costs are evaluated for all candidate I' of one I at once, and pairs whose block work alone
exceeds an upper bound (the cost of a known plan) are skipped, which keeps it exact.
"""

from __future__ import annotations

import math
import time

import numpy as np

from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph


class IdealTimeout(MtppError):
    """The time limit passed before the DP finished (callers may fall back to a heuristic)."""


def too_many_ideals(max_ideals: int) -> MtppError:
    return MtppError(
        f"idealdp: the graph has more than {max_ideals:,} ideals (down-sets); the exact DP "
        "would not finish. Use --method cpsat, or raise the cap with max_ideals"
    )


def enumerate_ideals(g: Graph, max_ideals: int, deadline: float = math.inf) -> np.ndarray:
    """All ideals as a bool matrix (rows), sorted by size; raises past ``max_ideals`` or
    ``deadline`` (``time.perf_counter()``)."""
    if g.n + 1 > max_ideals:  # every DAG of n nodes has at least n + 1 ideals (a chain)
        raise too_many_ideals(max_ideals)
    pred_mask = [0] * g.n
    ptr, idx = g.pred
    for v in range(g.n):
        for u in idx[ptr[v] : ptr[v + 1]].tolist():
            pred_mask[v] |= 1 << u
    seen = {0}
    frontier = [0]
    while frontier:
        nxt = []
        for ideal in frontier:
            if time.perf_counter() > deadline:
                raise IdealTimeout(
                    f"idealdp: time limit reached while enumerating ideals ({len(seen):,} so "
                    "far); use --method cpsat or raise --time-limit"
                )
            for v in range(g.n):
                bit = 1 << v
                if not ideal & bit and pred_mask[v] & ~ideal == 0:
                    new = ideal | bit
                    if new not in seen:
                        seen.add(new)
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


class _BlockCosts:
    """f(S) for many node sets S at once (rows of a bool matrix)."""

    def __init__(self, g: Graph, cluster: Cluster):
        self.g, self.c = g, cluster
        pt = g.pair_tensor
        order = np.argsort(pt, kind="stable")
        self.cons = g.t_cons[order]
        self.cons_tensor = pt[order]
        starts = np.flatnonzero(np.r_[True, np.diff(self.cons_tensor) != 0]) if len(pt) else []
        self.starts = np.asarray(starts, dtype=np.int64)
        self.tensors = self.cons_tensor[self.starts] if len(pt) else np.zeros(0, np.int64)
        self.io = g.t_size[self.tensors] / cluster.link_bandwidth
        self.prod = g.t_producer[self.tensors]
        self.p_starts = g.p_ptr[:-1]
        self.mem = math.isfinite(cluster.fast_memory) or cluster.capacity is not None

    def __call__(self, S: np.ndarray) -> np.ndarray:
        g, c = self.g, self.c
        f = S @ g.work
        if len(self.tensors):
            inside = S[:, self.cons]
            any_in = np.logical_or.reduceat(inside, self.starts, axis=1)
            all_in = np.logical_and.reduceat(inside, self.starts, axis=1)
            p_in = S[:, self.prod]
            f = f + ((~p_in & any_in) | (p_in & ~all_in)) @ self.io
        if self.mem:
            params = np.zeros(len(S))
            if g.num_params:
                used = np.logical_or.reduceat(S[:, g.p_users], self.p_starts, axis=1)
                params = used @ g.p_size
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

    ``upper`` must be the cost of some valid plan (or inf); it only prunes.
    """
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
