"""Bound 2, guess the bottleneck: prove "no plan has every block <= T" for T below the answer.

If every block S of a plan has ``f(S) <= T`` then, since io >= 0,
``work(S) <= T`` and ``work(S) + max(0, params(S) + peak(S) - M) / B_mem <= T``, which is the
same as ``B_mem * work(S) + charged(S) + peak(S) <= B_mem * T + M`` (exactly, given the first).
So the nodes, as items of size ``B_mem * work + charged bytes`` and peak ``act``, pack into k
bins of capacity ``B_mem * T + M``; and their works pack into k bins of capacity T. A proof
that either packing is impossible (:mod:`solver.pipeline.bounds.packing`) proves OPT > T; bisection
finds the largest such T. No order or coarsening is imposed: every acyclic partition is a
partition into k bins, so this is a relaxation of the real problem.
"""

from __future__ import annotations

import math

import numpy as np

from solver.core.cluster import Cluster
from solver.pipeline.bounds.items import Items
from solver.pipeline.bounds.packing import smallest_capacity


def work_packing_bound(
    it: Items, k: int, time_limit: float = 1.0, lo: float = 0.0, hi: float = math.inf
) -> float:
    """Largest T proven: the nodes' works do not fit into k bins of capacity T. The search
    stays in [``lo``, ``hi``]: ``lo`` is returned when nothing above it is proven (the caller
    vouches for it: 0 or a proven bound), and no plan costs less than a proven bound, so
    ``hi`` may be the cost of a known plan."""
    total = float(it.work.sum())
    if total <= 0:
        return lo
    return smallest_capacity(
        it.work, np.zeros_like(it.work), k, lo, min(total, hi), time_limit, probe_lo=lo > 0
    )


def decision_bound(
    it: Items,
    cluster: Cluster,
    k: int,
    time_limit: float = 2.0,
    lo: float = 0.0,
    hi: float = math.inf,
) -> float:
    """Largest T proven: no plan has every block <= T (memory and work together); searched in
    [``lo``, ``hi``] as :func:`work_packing_bound`."""
    M, Bm = cluster.fast_memory, cluster.slow_memory_bandwidth
    if math.isinf(M):
        return work_packing_bound(it, k, time_limit, lo, hi)
    size = Bm * it.work + it.charged
    # everything in one block fits the relaxation at this T: an upper end for the search
    t_hi = float(it.work.sum()) + max(0.0, float(it.charged.sum() + it.act.max()) - M) / Bm
    t_hi = min(t_hi, hi)
    cap = smallest_capacity(
        size, it.act, k, Bm * lo + M, Bm * t_hi + M, time_limit, probe_lo=lo > 0
    )
    return max(lo, (cap - M) / Bm)
