"""Bound 1, indivisible weights: some block must hold many bytes, and the work that uses them.

Every plan splits the charged weights (:mod:`solver.pipeline.bounds.items`) into k groups. If the
weights with their users' working sets cannot be packed into k bins of Y bytes (a proof from
:mod:`solver.pipeline.bounds.packing`), some block S has ``charged(S) + peak(S) > Y``, so
``f(S) >= max(0, Y - M) / B_mem + work(S)``, and ``work(S)`` is at least the least work of any
set of weight-carrying nodes holding ``Y - max act`` bytes (a fractional knapsack, itself a
relaxation). See docs/bounds.md for the proof.
"""

from __future__ import annotations

import math

import numpy as np

from solver.core.cluster import Cluster
from solver.pipeline.bounds.items import Items
from solver.pipeline.bounds.packing import cannot_pack, smallest_capacity


def least_work_for_bytes(work: np.ndarray, nbytes: np.ndarray, need: float) -> float:
    """The least total work of a fractional selection of items with at least ``need`` bytes.

    >>> least_work_for_bytes(np.array([4.0, 1.0]), np.array([2.0, 2.0]), 3.0)
    3.0
    """
    if need <= 0:
        return 0.0
    order = np.argsort(work / np.maximum(nbytes, 1e-300), kind="stable")
    got = 0.0
    total = 0.0
    for i in order:
        take = min(1.0, (need - got) / nbytes[i])
        total += take * work[i]
        got += take * nbytes[i]
        if got >= need * (1 - 1e-12):
            return float(total)
    return float(total)  # cannot reach need: every byte's work counted (still a lower bound)


def held_bytes(it: Items, k: int, time_limit: float) -> float:
    """The largest Y proven: in every plan some block has charged(S) + peak(S) > Y."""
    mask = it.charged > 0
    if not mask.any():
        return 0.0
    size, act = it.charged[mask], it.act[mask]
    hi = float(size.sum() + act.max())
    return smallest_capacity(size, act, k, 0.0, hi, time_limit)


def weights_bound(it: Items, cluster: Cluster, k: int, time_limit: float = 2.0) -> float:
    """Overflow of the bytes some block must hold, plus the work that comes with them."""
    M, Bm = cluster.fast_memory, cluster.slow_memory_bandwidth
    mask = it.charged > 0
    if not mask.any() or math.isinf(M):
        return 0.0
    Y = held_bytes(it, k, time_limit)
    need = Y - float(it.act[mask].max())
    return max(0.0, Y - M) / Bm + least_work_for_bytes(it.work[mask], it.charged[mask], need)


def capacity_infeasible(it: Items, cluster: Cluster, k: int, time_limit: float = 1.0) -> bool:
    """True when it is proven that no plan meets the hard capacity C (weights do not fit)."""
    if cluster.capacity is None:
        return False
    mask = (it.charged > 0) | (it.act > 0)
    return cannot_pack(it.charged[mask], it.act[mask], cluster.capacity, k, time_limit)
