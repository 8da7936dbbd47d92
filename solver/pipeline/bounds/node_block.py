"""The node-block bound: the block holding a node v costs at least the cheapest set around v.

For every node v, m(v) = min over node sets S containing v of work(S) + io(S), where io(S)
charges each tensor once, size / B, when its producer and its consumers are not all on one
side of S (io_in + io_out of DESIGN.md). The block of any plan that holds v is such a set and
pays overflow(S) >= overflow({v}) on top, so max over v of m(v) + overflow({v}) is a lower
bound of every plan (docs/bounds.md, "Node block"). m(v) is a minimum v-t cut of a network
with one sink edge per node (its work) and one gadget per tensor hyperedge (its io).

The cuts use OR-Tools' max-flow (SimpleMaxFlow, a dependency already; as the gap cuts of
:mod:`solver.pipeline.bounds.chain_io`) on integer capacities rounded down, so a cut is never
above the real one; it is about a hundred times faster than networkx's Boykov-Kolmogorov on
these networks (U-Net: 107 cuts in 0.05 s instead of 14 s). Nodes are visited by
decreasing singleton cost f({v}), an upper bound of their value: a node whose singleton
cannot beat the best bound so far is skipped, and the search stops at the incumbent or the
clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import overflow, own_param_bytes
from solver.core.graph import Graph, coarse_view
from solver.core.result import meets_target

if TYPE_CHECKING:  # OR-Tools itself is imported where a network is built (heavy)
    from ortools.graph.python import max_flow

# a max-flow in floating point may overshoot the exact cut by rounding: the value reported is
# shrunk by this relative slack so the bound never exceeds the optimum through rounding
FLOAT_SLACK = 1e-12


@dataclass(frozen=True)
class NodeBlockBound:
    """The bound, the coarse node that gives it (-1: none), the cuts computed, and whether
    every node was either cut or proven unable to raise the bound (False: the clock or the
    incumbent stopped the search; the value is still a valid bound)."""

    value: float
    node: int
    cuts: int
    complete: bool


@dataclass(frozen=True)
class CutNetwork:
    """The flow network of one graph: node w is vertex w, ``sink`` is the sink. Capacities
    are integers, the real ones (seconds) times ``scale`` rounded down, so every cut of the
    network is at most the real cut: the minimum is never above m(v)."""

    net: max_flow.SimpleMaxFlow  # OR-Tools is imported where the network is built (heavy)
    sink: int
    scale: float  # flow units per second
    work: np.ndarray  # work(w) of every node (its sink edge), times the network's work weight
    singleton: np.ndarray  # work + io of the set {w}: an upper bound of m(w)


# the finite capacities add up to at most 2^CAPACITY_BITS / (d + 2) units, d the most arcs
# without a capacity at one vertex (a cut is off by less than one unit per arc from the
# rounding), and an arc without a capacity gets one unit more than all of them together (never
# in a minimum cut): no sum of flows at a vertex reaches 2^63
CAPACITY_BITS = 61


def cut_network(g: Graph, cluster: Cluster, work_weight: float = 1.0) -> CutNetwork:
    """The network whose minimum v-sink cut is m(v) (on ``g`` as given); with
    ``work_weight`` mu the least ``mu * work(S) + io(S)`` over sets S holding v instead."""
    from ortools.graph.python import max_flow  # heavy (OR-Tools): only when this bound runs

    n, B = g.n, cluster.link_bandwidth
    sink = n
    work = work_weight * g.work.astype(float)
    arcs: list[tuple[int, int, float]] = [(w, sink, float(work[w])) for w in range(n)]
    singleton = work.copy()
    pairs: dict[tuple[int, int], float] = {}
    aux = n + 1
    for t in range(g.num_tensors):
        cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
        u = int(g.t_producer[t])
        members = sorted({u, *cons.tolist()})
        c = float(g.t_size[t]) / B
        if len(members) < 2 or c <= 0:
            continue  # no consumer outside the producer: never sent
        singleton[members] += c  # {w} splits every tensor w produces or reads
        aux = _add_hyperedge(arcs, pairs, members, c, aux)
    arcs.extend((x, y, c) for (x, y), c in pairs.items())
    finite = sum(c for _, _, c in arcs if c != INFINITE)
    ends = [x for x, y, c in arcs if c == INFINITE] + [y for x, y, c in arcs if c == INFINITE]
    degree = int(np.bincount(np.array(ends, dtype=np.int64)).max()) if ends else 0
    scale = 2.0**CAPACITY_BITS / (degree + 2) / finite if finite > 0 else 1.0
    never = int(finite * scale) + 1
    net = max_flow.SimpleMaxFlow()
    for x, y, c in arcs:
        net.add_arc_with_capacity(x, y, never if c == INFINITE else int(c * scale))
    return CutNetwork(net, sink, scale, work, singleton)


INFINITE = -1.0  # the capacity of the gadgets' inner arcs (never cut)


def _add_hyperedge(
    arcs: list[tuple[int, int, float]],
    pairs: dict[tuple[int, int], float],
    members: list[int],
    c: float,
    aux: int,
) -> int:
    """Cost c exactly when the members are split: two members are a pair of opposite edges
    (summed in ``pairs``); more use the gadget x -> a -> b -> x (a -> b of capacity c, the rest
    infinite). Returns the next free auxiliary vertex."""
    if len(members) == 2:
        x, y = members
        for p, q in ((x, y), (y, x)):
            pairs[p, q] = pairs.get((p, q), 0.0) + c
        return aux
    a, b = aux, aux + 1
    arcs.append((a, b, c))
    for x in members:
        arcs.append((x, a, INFINITE))
        arcs.append((b, x, INFINITE))
    return aux + 2


def min_block_cost(cn: CutNetwork, v: int) -> float:
    """m(v): the least work + io of a node set containing v (the minimum v-sink cut, on the
    capacities rounded down: never above the real minimum)."""
    if cn.singleton[v] <= cn.work[v]:
        return float(cn.work[v])  # v exchanges nothing: {v} itself is the cheapest set
    if cn.net.solve(v, cn.sink) != cn.net.OPTIMAL:
        return 0.0  # no claim (the flow did not finish)
    return float(cn.net.optimal_flow()) / cn.scale


def own_overflow(g: Graph, cluster: Cluster) -> np.ndarray:
    """overflow({w}) of every node: any block holding w stores w's weights and holds w's
    working set, so it pays at least this."""
    return overflow(own_param_bytes(g), g.act, cluster)


def node_block_bound(
    g: Graph,
    cluster: Cluster,
    seconds: float,
    floor: float = 0.0,
    target: float | None = None,
) -> NodeBlockBound:
    """max over v of m(v) + overflow({v}) on ``g``'s coarse view (co-located nodes merged:
    every plan keeps them together). Only nodes that could raise the bound above ``floor``
    (the best bound known) are cut; the search stops when the bound meets ``target`` (a known
    plan's cost) or after ``seconds``. Homogeneous clusters only (0 otherwise)."""
    if not cluster.homogeneous:
        return NodeBlockBound(0.0, -1, 0, False)
    t0 = time.perf_counter()
    cg, _ = coarse_view(g)
    cn = cut_network(cg, cluster)
    over = own_overflow(cg, cluster)
    upper = np.minimum(cn.singleton, float(cg.work.sum())) + over  # S = all nodes: no io
    best, node, cuts = 0.0, -1, 0
    for v in np.argsort(-upper, kind="stable").tolist():
        if upper[v] <= max(best, floor):
            break  # sorted: no later node can raise the bound either
        if time.perf_counter() - t0 > seconds or meets_target(target, best):
            return NodeBlockBound(float(best), node, cuts, False)
        value = (min_block_cost(cn, v) + over[v]) * (1 - FLOAT_SLACK)
        cuts += 1
        if value > best:
            best, node = value, v
    return NodeBlockBound(float(best), node, cuts, True)
