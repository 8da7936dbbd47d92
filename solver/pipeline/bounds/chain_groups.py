"""Bound 5, the chain with io on a cluster of groups: the chain-io program of
:mod:`solver.pipeline.bounds.chain_io` run on the cluster's relaxation, with every bin labelled by
the
group of its device, at most ``|h|`` bins in group h, and a cut between two consecutive
nonempty blocks of different groups received over the slow ``between`` link.

Proof in docs/bounds.md ("group chain"). In short: every plan on every placement is a path of
the program (its nonempty blocks in order, each on a device of some group, distinct blocks on
distinct devices), every term is at most the evaluator's (relaxed device and fast link), and the
only term charged at the slow rate is one the evaluator charges at that rate: what a block
holding separator s_g receives from the block just before it (holding s_{g-1}) when the two run
in different groups.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.pipeline.bounds.chain_io import Chain, bin_profile, largest_infeasible
from solver.pipeline.bounds.items import items

MAX_GROUPS = 4  # the states are per-group bin counts: a few groups only


def _spread(counts: tuple, sizes: tuple, r: int):
    """Every way to add r bins to the group counts without exceeding a group's size."""
    if r == 0:
        yield counts
        return
    for pick in itertools.combinations_with_replacement(range(len(sizes)), r):
        c = list(counts)
        for h in pick:
            c[h] += 1
        if all(x <= s for x, s in zip(c, sizes, strict=True)):
            yield tuple(c)


def _prune(states: dict) -> dict:
    """Drop states another beats: same last group, no more bins in any group, no less taken."""
    keys = sorted(states, key=lambda kv: (sum(kv[0]), -states[kv]))
    kept: dict = {}
    for key in keys:
        counts, h = key
        x = states[key]
        if any(
            h2 == h and x2 >= x and all(a <= b for a, b in zip(c2, counts, strict=True))
            for (c2, h2), x2 in kept.items()
        ):
            continue
        kept[key] = x
    return kept


def feasible_groups(
    ch: Chain,
    cap: float,
    sizes: tuple,
    Bm: float,
    extra_rate: float,
    deadline: float = math.inf,
) -> bool:
    """True unless it is proven that no labelled path covers the chain with bins of capacity
    ``cap`` and at most ``sizes[h]`` bins in group h (also True, "not proven", past
    ``deadline``, a ``time.perf_counter()`` value)."""
    if cap <= 0:
        return True  # no claim at a zero capacity
    m, fluid, k = ch.m, ch.fluid, sum(sizes)
    start = (tuple(0 for _ in sizes), -1)
    states: list[dict] = [{} for _ in range(m + 1)]
    states[0][start] = 0.0
    profiles: dict = {}
    for g in range(m + 1):
        if time.perf_counter() > deadline:
            return True
        for (counts, h), x in _prune(states[g]).items():
            used = sum(counts)
            rest0 = fluid[g] - x
            r_max = math.ceil(rest0 / cap - 1e-12) if rest0 > 0 else 0
            if g == m:
                if r_max <= k - used:
                    return True  # the last bins take any spare devices
                continue
            for r in range(r_max + 1):
                if used + r >= k:
                    break
                rest = max(0.0, rest0 - r * cap)
                key = (g, rest)
                if key not in profiles:
                    profiles[key] = bin_profile(ch, g, rest, cap, Bm, extra_rate)
                prof = profiles[key]
                if not prof:
                    continue
                for c in set(_spread(counts, sizes, r)):
                    for h2 in range(len(sizes)):
                        if c[h2] >= sizes[h2]:
                            continue
                        cross = r == 0 and h >= 0 and h2 != h
                        c2 = c[:h2] + (c[h2] + 1,) + c[h2 + 1 :]
                        for g2, y, y_cross in prof:
                            val = y_cross if cross else y
                            if val is None:
                                continue
                            tgt = states[g2]
                            if val > tgt.get((c2, h2), -1.0):
                                tgt[(c2, h2)] = val
    return False


def group_chain_bound(
    g: Graph,
    cluster: Cluster,
    lo: float = 0.0,
    time_limit: float = 5.0,
    memory: bool = False,
    rel_tol: float = 1e-6,
) -> float:
    """Largest T proven by the group-labelled chain on ``cluster`` (devices in 2..4 groups);
    0 (or ``lo``) when it does not apply. ``lo`` must be 0 or a T proven infeasible by the
    chain-io bound of the same kind on ``cluster.relaxation()`` (a weaker relaxation)."""
    groups = cluster.groups
    t = cluster.topology
    if t is None or not 2 <= len(groups) <= MAX_GROUPS or t.between is None:
        return lo
    flat, speedup = cluster.relaxation()
    fast_g = g if speedup == 1.0 else replace(g, work=g.work / speedup)
    it = items(fast_g)
    B, Bm, M = flat.link_bandwidth, flat.slow_memory_bandwidth, flat.fast_memory
    extra_rate = B / t.between[0] - 1.0  # >= 0: B is the fastest link, between included
    if memory and math.isinf(M):
        return lo
    if memory:
        ch = Chain(fast_g, Bm * it.work + it.charged, it.act, B, refine=False)
        scale, base = Bm, M
    else:
        ch = Chain(fast_g, it.work, np.zeros_like(it.work), B, refine=False)
        scale, base = 1.0, 0.0
    if not ch.ok or ch.m == 0:
        return lo
    sizes = tuple(len(m) for m in groups)
    t_top = float(it.work.sum()) + (1.0 + extra_rate) * float(
        sum(sec for outs in ch.outs for _, sec in outs) + sum(ch.cut)
    )
    if memory:
        t_top += max(0.0, float(it.charged.sum() + it.act.max()) - M) / Bm
    if t_top <= 0:
        return lo

    t_end = time.perf_counter() + time_limit

    def infeasible(x: float) -> bool:
        return not feasible_groups(ch, scale * x + base, sizes, scale, extra_rate, t_end)

    if lo > 0 and not infeasible(lo):
        return lo
    step = lo / 16 if lo > 0 else t_top / sum(sizes)
    return largest_infeasible(infeasible, lo, step, t_top, rel_tol, t_end)
