"""Brute force over every plan of a tiny graph: the oracle the tests trust.

It is written independently of :mod:`solver.core.cost` (batched over all assignments with plain
boolean masks) so that it also cross-checks the evaluator.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.result import ALL_PLACEMENTS, INFEASIBLE, OPTIMAL
from solver.pipeline.plan import Plan, make_plan

MAX_PLANS = 3_000_000


def all_assignments(g: Graph, k: int) -> np.ndarray:
    """Every assignment (rows) that respects order edges and co-location groups."""
    if k**g.n > MAX_PLANS:
        raise MtppError(
            f"brute force would enumerate {k}^{g.n} plans; it is meant for about 10 nodes "
            "and k <= 3 (use --method cpsat)"
        )
    A = np.array(list(itertools.product(range(k), repeat=g.n)), dtype=np.int64).reshape(-1, g.n)
    ok = np.all(A[:, g.e_src] <= A[:, g.e_dst], axis=1)
    for m in g.groups:
        ok &= np.all(A[:, m] == A[:, m[:1]], axis=1)
    return A[ok]


def batch_costs(g: Graph, cluster: Cluster, A: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Block costs f (rows x k) and memory use params + peak (rows x k) for many plans."""
    rows = len(A)
    f = np.zeros((rows, k))
    mem = np.zeros((rows, k))
    B, Bm, M = cluster.link_bandwidth, cluster.slow_memory_bandwidth, cluster.fast_memory
    for b in range(k):
        inb = b == A
        f[:, b] += inb @ g.work
        params = np.zeros(rows)
        for p in range(g.num_params):
            users = g.p_users[g.p_ptr[p] : g.p_ptr[p + 1]]
            params += g.p_size[p] * inb[:, users].any(axis=1)
        peak = (inb * g.act).max(axis=1)
        mem[:, b] = params + peak
        if not math.isinf(M):
            f[:, b] += np.maximum(0.0, params + peak - M) / Bm
    for t in range(g.num_tensors):
        cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
        if len(cons) == 0:
            continue
        p = g.t_producer[t]
        pb = A[:, p]
        sends = (A[:, cons] != pb[:, None]).any(axis=1)
        for b in range(k):
            recv = (A[:, cons] == b).any(axis=1) & (pb != b)
            f[:, b] += g.t_size[t] / B * (recv.astype(float) + (sends & (pb == b)))
    return f, mem


def batch_costs_placed(
    g: Graph, cluster: Cluster, A: np.ndarray, placement: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Block costs f (rows x k) and memory use (rows x k) of many plans with block b on
    device ``placement[b]``, from docs/clusters.md's rules (work scaled by the device's
    compute, overflow by its fast memory, each tensor received once over the link from its
    producer's device and sent once per distinct link class among its readers' links)."""
    rows, k = len(A), len(placement)
    memory, _, compute = cluster.device_arrays()
    f = np.zeros((rows, k))
    mem = np.zeros((rows, k))
    for b, d in enumerate(placement):
        inb = b == A
        f[:, b] += (inb @ g.work) * (cluster.compute / compute[d])
        params = np.zeros(rows)
        for p in range(g.num_params):
            users = g.p_users[g.p_ptr[p] : g.p_ptr[p + 1]]
            params += g.p_size[p] * inb[:, users].any(axis=1)
        peak = (inb * g.act).max(axis=1)
        mem[:, b] = params + peak
        f[:, b] += np.maximum(0.0, params + peak - memory[d]) / cluster.slow_memory_bandwidth
    links = {
        (b1, b2): cluster.link(placement[b1], placement[b2])
        for b1 in range(k)
        for b2 in range(k)
        if b1 != b2
    }
    kinds = sorted(set(links.values()))
    for t in range(g.num_tensors):
        cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
        if len(cons) == 0:
            continue
        pb = A[:, g.t_producer[t]]
        size = g.t_size[t]
        for b in range(k):
            recv = (A[:, cons] == b).any(axis=1) & (pb != b)
            for src in range(k):
                if src != b:
                    f[:, b] += np.where(recv & (pb == src), size / links[src, b][0], 0.0)
        for src in range(k):
            for kind in kinds:
                readers = [b for b in range(k) if b != src and links[src, b] == kind]
                sends = (pb == src) & np.isin(A[:, cons], readers).any(axis=1)
                f[:, src] += np.where(sends, size / kind[0], 0.0)
    return f, mem


def brute_force(g: Graph, cluster: Cluster) -> Plan | None:
    """The true optimum over all valid plans (and, on a cluster whose devices or links
    differ, over every placement of the blocks on distinct devices), or None when no plan
    is valid."""
    t0 = time.perf_counter()
    k = cluster.devices
    A = all_assignments(g, k)
    if not cluster.homogeneous:
        return _brute_placed(g, cluster, A, t0)
    if len(A):
        f, mem = batch_costs(g, cluster, A, k)
        if cluster.capacity is not None:
            fits = np.all(mem <= cluster.capacity * (1 + 1e-12), axis=1)
            A, f = A[fits], f[fits]
    if len(A) == 0:
        return None
    obj = f.max(axis=1)
    best = int(np.argmin(obj))
    return make_plan(
        g,
        cluster,
        A[best],
        "brute",
        lower_bound=float(obj[best]),
        status=OPTIMAL,
        wall_seconds=time.perf_counter() - t0,
        stats={"plans_enumerated": int(len(A))},
    )


def _brute_placed(g: Graph, cluster: Cluster, A: np.ndarray, t0: float) -> Plan | None:
    """:func:`brute_force` over every assignment and every placement (permutation)."""
    k = cluster.devices
    perms = list(itertools.permutations(range(k)))
    if len(A) * len(perms) > MAX_PLANS:
        raise MtppError(
            f"brute force would enumerate {len(A)} plans x {len(perms)} placements; it is "
            "meant for about 8 nodes and 4 devices (use --method cpsat)"
        )
    _, capacity, _ = cluster.device_arrays()
    best, best_a, best_p, count = math.inf, None, None, 0
    for perm in perms:
        placement = np.array(perm, dtype=np.int64)
        f, mem = batch_costs_placed(g, cluster, A, placement)
        fits = np.all(mem <= capacity[placement][None, :] * (1 + 1e-12), axis=1)
        count += int(fits.sum())
        obj = np.where(fits, f.max(axis=1), math.inf)
        i = int(np.argmin(obj)) if len(obj) else 0
        if len(obj) and obj[i] < best:
            best, best_a, best_p = float(obj[i]), A[i], placement
    if best_a is None:
        return None
    return make_plan(
        g,
        cluster,
        best_a,
        "brute",
        lower_bound=best,
        status=OPTIMAL,
        wall_seconds=time.perf_counter() - t0,
        stats={"plans_enumerated": count, "bound_scope": ALL_PLACEMENTS},
        placement=best_p,
    )


__all__ = ["INFEASIBLE", "all_assignments", "batch_costs", "batch_costs_placed", "brute_force"]
