"""Bound 3, the forced chain: nodes every other node must precede or follow split any plan
into an ordered sequence, and the weights between them cannot jump over them.

A *separator* is a node comparable (by order-edge reachability) with every other node; in a
Llama decoder the residual adds, norms, output and down projections are separators. In every
plan the separators' blocks are non-decreasing along the chain, and a node between separators
s and s' lies in a block between theirs (blocks are convex). So a plan with every block <= T
induces a split of the sequence [segment, s_0, segment, s_1, ...] into <= k consecutive bins,
each holding ``B_mem * work + charged bytes + peak <= B_mem * T + M`` (as in
:mod:`solver.pipeline.bounds.decision`), where separators are indivisible (with their working set as
peak) and a segment may be divided anywhere (a relaxation). For such sequences the greedy fill
is an exact decision procedure (any sub-interval of a feasible bin is feasible), so
"greedy needs more than k bins" proves OPT > T. The order is forced, not chosen: this is a
relaxation, not a restriction to one topological order.
"""

from __future__ import annotations

import math

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline.bounds.items import Items
from solver.pipeline.dp.separators import separators


def sequence(g: Graph, it: Items, size: np.ndarray) -> tuple[list, int] | None:
    """The chain as a list of ``(size, act, is_separator)`` (segments merged into one fluid
    entry of their total size, act 0), and the number of separators; None when too big."""
    cg, _ = coarse_view(g)
    sep = separators(cg)
    if sep is None:
        return None
    rank = cg.topo_rank
    s_nodes = np.flatnonzero(sep)
    s_nodes = s_nodes[np.argsort(rank[s_nodes])]
    seg = np.searchsorted(rank[s_nodes], rank)  # separators before each node
    fluid = np.bincount(seg[~sep], weights=size[~sep], minlength=len(s_nodes) + 1)
    out = []
    for j, s in enumerate(s_nodes.tolist()):
        out.append((float(fluid[j]), 0.0, False))
        out.append((float(size[s]), float(it.act[s]), True))
    out.append((float(fluid[len(s_nodes)]), 0.0, False))
    return out, len(s_nodes)


def bins_needed(seq: list, cap: float, k: int) -> int:
    """Bins the greedy fill of the sequence needs (stops counting past k; k + 1 if an
    indivisible entry alone does not fit)."""
    bins, load, peak = 1, 0.0, 0.0
    for size, act, indivisible in seq:
        if indivisible:
            if size + act > cap:
                return k + 1
            if load + size + max(peak, act) <= cap:
                load += size
                peak = max(peak, act)
            else:
                bins, load, peak = bins + 1, size, act
        else:
            room = cap - load - peak
            if size <= room:
                load += size
                continue
            rest = size - room
            if cap <= 0:
                return k + 1
            new = max(1, math.ceil(rest / cap - 1e-12))  # rounded in favour of fitting
            if new > k:
                return k + 1
            bins += new
            load, peak = max(0.0, rest - (new - 1) * cap), 0.0
        if bins > k:
            return k + 1
    return bins


def _largest_infeasible(seq: list, cap, k: int, t_hi: float, rel_tol: float) -> float:
    """Bisection on T: the largest T found at which the greedy fill needs more than k bins."""
    lo, hi = 0.0, t_hi
    if bins_needed(seq, cap(lo), k) <= k:
        return 0.0
    if bins_needed(seq, cap(hi), k) > k:
        return hi
    while hi - lo > rel_tol * max(hi, 1e-300):
        mid = 0.5 * (lo + hi)
        if bins_needed(seq, cap(mid), k) > k:
            lo = mid
        else:
            hi = mid
    return lo


def chain_bound(g: Graph, it: Items, cluster: Cluster, k: int, rel_tol: float = 1e-7) -> float:
    """Largest T proven by the chain with memory: B_mem * work + charged + peak per bin."""
    M, Bm = cluster.fast_memory, cluster.slow_memory_bandwidth
    if math.isinf(M):
        return 0.0
    built = sequence(g, it, Bm * it.work + it.charged)
    if built is None:
        return 0.0
    t_hi = float(it.work.sum()) + max(0.0, float(it.charged.sum() + it.act.max()) - M) / Bm
    return _largest_infeasible(built[0], lambda t: Bm * t + M, k, t_hi, rel_tol)


def work_chain_bound(g: Graph, it: Items, k: int, rel_tol: float = 1e-7) -> float:
    """Largest T proven by the chain with work alone (every block has work <= T)."""
    built = sequence(g, it, it.work)
    if built is None:
        return 0.0
    seq = [(size, 0.0, ind) for size, _, ind in built[0]]
    return _largest_infeasible(seq, lambda t: t, k, float(it.work.sum()), rel_tol)
