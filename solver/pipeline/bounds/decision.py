"""Bound 2, guess the bottleneck: prove "no plan has every block <= T" for T below the answer.

If every block S of a plan has ``f(S) <= T`` then, since io >= 0,
``work(S) <= T`` and ``work(S) + max(0, params(S) + peak(S) - M) / B_mem <= T``, which is the
same as ``B_mem * work(S) + charged(S) + peak(S) <= B_mem * T + M`` (exactly, given the first).
So the nodes, as items of size ``B_mem * work + charged bytes`` and peak ``act``, pack into k
bins of capacity ``B_mem * T + M``; and their works pack into k bins of capacity T. A proof
that either packing is impossible (:mod:`solver.pipeline.bounds.packing`) proves OPT > T; bisection
finds the largest such T. No order or coarsening is imposed: every acyclic partition is a
partition into k bins, so this is a relaxation of the real problem.

:func:`decision_io_bound` adds the io every plan under T must pay
(:mod:`solver.pipeline.bounds.forced_io`) to the items: ``f(S) <= T`` implies
``work(S) + charges(S) <= T`` and ``B_mem * (work(S) + charges(S)) + charged(S) + peak(S) <=
B_mem * T + M``, since the charges of S's nodes are at most ``io(S)``; their volumes then fit
k bins. The charges grow as T falls, so a T proven is proven for every smaller T, and
bisection is sound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from solver.core.cluster import Cluster
from solver.pipeline.bounds.forced_io import ForcedIo
from solver.pipeline.bounds.items import Items
from solver.pipeline.bounds.packing import smallest_capacity


class IoCharges(Protocol):
    """Io every plan with every block at most T pays, charged to its nodes: each block's io
    is at least the sum of its nodes' charges (:class:`ForcedIo`,
    :class:`solver.pipeline.bounds.io_density.IoDensity`)."""

    def charges(self, T: float) -> np.ndarray: ...


IO_REL_TOL = 1e-5  # decision_io_bound's bisection stops at this relative width
VOLUME_SLACK = 1e-9  # relative: a floating sum never proves a T by rounding


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
    floor = Bm * lo + M
    cap = smallest_capacity(size, it.act, k, floor, Bm * t_hi + M, time_limit, probe_lo=lo > 0)
    # nothing proven above lo: lo itself (converting back could round it up by an ulp)
    return lo if cap <= floor else max(lo, (cap - M) / Bm)


def decision_io_bound(
    it: Items,
    fio: ForcedIo,
    cluster: Cluster,
    k: int,
    time_limit: float = 2.0,
    lo: float = 0.0,
    hi: float = math.inf,
) -> float:
    """Largest T proven in [``lo``, ``hi``] (``lo`` when nothing above it is; ``lo`` must be
    proven, 0 or a bound): the works with the io every plan under T must pay
    (``fio.charges(T)``) exceed the volume of k bins, with memory as in
    :func:`decision_bound`. Only volumes (exact, one pass over the nodes per probe): the
    packing engine's proofs without io are :func:`decision_bound`'s."""
    t_end = time.perf_counter() + time_limit
    if not math.isfinite(hi):
        hi = float(it.work.sum() + 2 * fio.seconds.sum())
        if math.isfinite(cluster.fast_memory):
            hi += float(it.charged.sum() + it.act.max()) / cluster.slow_memory_bandwidth
    return largest_proven(lambda T: io_volume_exceeds(it, fio, cluster, k, T), lo, hi, t_end)


def largest_proven(proves: Callable[[float], bool], lo: float, hi: float, t_end: float) -> float:
    """The largest T found in [``lo``, ``hi``] with ``proves(T)`` (a proof that no plan has
    every block at most T; ``lo`` when none above it is), bisected to IO_REL_TOL until
    ``t_end`` (a ``time.perf_counter()`` value). Every value returned was proven (or is
    ``lo``, proven by the caller), and OPT > T' for every T' below a proven T, so the search
    range is only a range: no claim rests on ``hi``."""
    first = lo * (1 + IO_REL_TOL) if lo > 0 else IO_REL_TOL * hi
    if first >= hi or not proves(first):
        return lo
    best = first
    while hi - best > IO_REL_TOL * hi and time.perf_counter() < t_end:
        mid = 0.5 * (best + hi)
        if proves(mid):
            best = mid
        else:
            hi = mid
    return best


def io_volume_exceeds(it: Items, fio: IoCharges, cluster: Cluster, k: int, T: float) -> bool:
    """True only with a proof that no plan has every block at most T: the works plus the io
    forced at T exceed k T, or, with memory, ``B_mem`` times them plus the charged weights and
    the largest act (one block holds it) exceed ``k (B_mem T + M)``."""
    M, Bm = cluster.fast_memory, cluster.slow_memory_bandwidth
    volume = float((it.work + fio.charges(T)).sum())
    if volume * (1 - VOLUME_SLACK) > k * T:
        return True
    if math.isinf(M):
        return False
    held = Bm * volume + float(it.charged.sum() + it.act.max(initial=0.0))
    return held * (1 - VOLUME_SLACK) > k * (Bm * T + M)
