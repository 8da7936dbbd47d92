"""The node-block bound: the block holding a node v costs at least the cheapest set around v.

For every node v, m(v) = min over node sets S containing v of work(S) + io(S), where io(S)
charges each tensor once, size / B, when its producer and its consumers are not all on one
side of S (io_in + io_out of DESIGN.md). The block of any plan that holds v is such a set and
pays overflow(S) >= overflow({v}) on top, so max over v of m(v) + overflow({v}) is a lower
bound of every plan (docs/bounds.md, "Node block"). m(v) is a minimum v-t cut of a network
with one sink edge per node (its work) and one gadget per tensor hyperedge (its io).

The cuts use networkx's max-flow (a dependency already; scipy's maximum_flow would need scipy
and integer capacities, and a hand-written push-relabel is code to test that networkx has
tested). Nodes are visited by decreasing singleton cost f({v}), an upper bound of their value:
a node whose singleton cannot beat the best bound so far is skipped, and the search stops at
the incumbent or the clock.
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

if TYPE_CHECKING:  # networkx itself is imported where a network is built (heavy: 0.8 s)
    import networkx as nx

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
    """The flow network of one graph: node w is vertex w, ``sink`` is the sink."""

    net: nx.DiGraph  # networkx is imported where the network is built (heavy: 0.8 s)
    sink: int
    work: np.ndarray  # work(w) of every node (its sink edge)
    singleton: np.ndarray  # work + io of the set {w}: an upper bound of m(w)


def cut_network(g: Graph, cluster: Cluster) -> CutNetwork:
    """The network whose minimum v-sink cut is m(v) (on ``g`` as given)."""
    import networkx as nx  # heavy (0.8 s): only when this bound runs

    n, B = g.n, cluster.link_bandwidth
    sink = n
    net = nx.DiGraph()
    net.add_nodes_from(range(n + 1))
    net.add_weighted_edges_from(((w, sink, float(g.work[w])) for w in range(n)), weight="capacity")
    singleton = g.work.astype(float).copy()
    aux = n + 1
    for t in range(g.num_tensors):
        cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
        u = int(g.t_producer[t])
        members = sorted({u, *cons.tolist()})
        c = float(g.t_size[t]) / B
        if len(members) < 2 or c <= 0:
            continue  # no consumer outside the producer: never sent
        singleton[members] += c  # {w} splits every tensor w produces or reads
        _add_hyperedge(net, members, c, aux)
        aux += 2
    return CutNetwork(net, sink, g.work.astype(float), singleton)


def _add_hyperedge(net: nx.DiGraph, members: list[int], c: float, aux: int) -> None:
    """Cost c exactly when the members are split: two members are a pair of opposite edges;
    more use the gadget x -> a -> b -> x (a -> b of capacity c, the rest without a capacity
    attribute, which networkx reads as infinite)."""
    if len(members) == 2:
        x, y = members
        for p, q in ((x, y), (y, x)):
            old = net.edges[p, q]["capacity"] if net.has_edge(p, q) else 0.0
            net.add_edge(p, q, capacity=old + c)
        return
    a, b = aux, aux + 1
    net.add_edge(a, b, capacity=c)
    for x in members:
        net.add_edge(x, a)
        net.add_edge(b, x)


def min_block_cost(cn: CutNetwork, v: int) -> float:
    """m(v): the least work + io of a node set containing v (the minimum v-sink cut)."""
    if cn.singleton[v] <= cn.work[v]:
        return float(cn.work[v])  # v exchanges nothing: {v} itself is the cheapest set
    import networkx as nx  # heavy (0.8 s): only when this bound runs
    from networkx.algorithms.flow import boykov_kolmogorov

    return float(nx.minimum_cut_value(cn.net, v, cn.sink, flow_func=boykov_kolmogorov))


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
