"""A plan from the spine: the nodes the spine relaxation removes are pinned to the node they feed,
and the exact DP over the ideals of the separator chain plans what is left.

The spine relaxation (:mod:`solver.pipeline.bounds.spine`) removes the nodes that keep a graph
from being a chain (a T5's decoder embedding beside the encoder, the cross-attention key and
value projections beside the decoder layers) and proves its bound on what is left. Here the
same nodes are *pinned* instead: each one is merged with the first kept node it feeds (through
removed nodes), and every cycle the merge closes is merged too. Merging is a restriction (every
plan of the pinned graph is a plan of the graph, with the same block costs: a merged node keeps
the work, tensors and parameters of its members), so the pinned graph's optimum is a real plan
and **never a bound**. The pinned graph has the relaxation's separators, so the exact DP of
:mod:`solver.pipeline.dp.chain_ideals` plans it in a second or two; on encoder-decoders its plan
beats the quick heuristics' (T5-small-shaped, k = 16: 6.99 us against 9.45 us), because a
cross-attention's projections then sit with the attention that reads them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.graph import Graph, coarse_view, condensation_order, contract
from solver.pipeline.bounds.spine import MAX_SPINE_NODES, spine_masks
from solver.pipeline.dp.chain_ideals import chain_ideal_dp

PLAN_BUDGETS = (0.1, 0.2, 0.3, 0.5)  # the work pinned, as a share of the total, per pinned
# graph (pinning restricts, it drops nothing: more of it only adds separators); tried from the
# most pinned (most separators, fewest ideals) down while time is left


@dataclass(frozen=True)
class SpinePlan:
    """A valid plan of the graph (``assignment`` on its original nodes), its objective, and
    how many coarse nodes were pinned."""

    value: float
    assignment: np.ndarray
    pinned: int


def pinned_labels(cg: Graph, keep: np.ndarray) -> np.ndarray:
    """Labels (numbered in a topological order) that merge every node not in ``keep`` with the
    first kept node it feeds (its successor first in topological order, followed through
    removed successors; a removed node that feeds nothing stays alone), and every cycle the
    merge closes."""
    sptr, sidx = cg.succ
    rank = cg.topo_rank
    target = np.arange(cg.n, dtype=np.int64)
    for v in reversed(cg.topo_order.tolist()):
        succs = sidx[sptr[v] : sptr[v + 1]]
        if keep[v] or len(succs) == 0:
            continue
        w = int(succs[np.argmin(rank[succs])])
        target[v] = w if keep[w] else target[w]
    es, ed = target[cg.e_src], target[cg.e_dst]
    cross = es != ed
    pos = condensation_order(cg.n, es[cross].tolist(), ed[cross].tolist())[target]
    _, labels = np.unique(pos, return_inverse=True)
    return labels.astype(np.int64)


def spine_plan(
    g: Graph, cluster: Cluster, k: int, time_limit: float, upper: float = math.inf
) -> SpinePlan | None:
    """The best plan of the pinned graphs (one per spine relaxation that removes something,
    the one removing most first) that the DP finds within ``time_limit`` seconds and below
    ``upper`` (a known plan's cost: the DP prunes blocks above it); None when there is none,
    on clusters whose devices or links differ, and on graphs of more than MAX_SPINE_NODES
    coarse nodes."""
    cg, labels = coarse_view(g)
    if not cluster.homogeneous or cg.n > MAX_SPINE_NODES or cg.n < 2 or k < 2:
        return None
    deadline = time.perf_counter() + time_limit
    best: SpinePlan | None = None
    for keep in [m for m in spine_masks(cg, PLAN_BUDGETS) if not m.all()][::-1]:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        pin = pinned_labels(cg, keep)
        bar = upper if best is None else min(upper, best.value)
        res = chain_ideal_dp(contract(cg, pin), cluster, k, 0.0, left, upper=bar)
        if res.assignment is None:
            continue
        a = res.assignment[pin][labels]
        if validate(g, cluster, a, k):
            continue  # never expected (the pinned graph's plans are plans); not used if so
        value = float(evaluate(g, cluster, a, k).objective)
        if value < bar:
            best = SpinePlan(value, a, int((~keep).sum()))
    return best
