"""The splits practitioners use: contiguous pieces of one topological order.

- ``uniform``: equal numbers of operators per device (Megatron-LM / DeepSpeed 'uniform').
- ``params``: balanced parameter bytes (DeepSpeed 'parameters').
- ``time``: balanced work (GPipe's balance-by-time).

Each balances its own weight exactly (min-max linear partition) and ignores io and memory,
as those tools do; the evaluator then prices the result honestly.
"""

from __future__ import annotations

import numpy as np

from solver.graph import Graph
from solver.heuristics.slicing import linear_partition


def node_weights(g: Graph, what: str, members: np.ndarray | None = None) -> np.ndarray:
    """Per-node weight for a baseline: operator count, parameter bytes (shared split evenly),
    or work. ``members`` gives the original-node count of each (super-)node."""
    if what == "uniform":
        return np.ones(g.n) if members is None else members.astype(np.float64)
    if what == "params":
        share = np.zeros(g.n)
        if g.num_params:
            users = np.diff(g.p_ptr)
            np.add.at(share, g.p_users, (g.p_size / np.maximum(users, 1))[g.pair_param])
        return share
    if what == "time":
        return g.work.astype(np.float64)
    raise ValueError(what)


def contiguous_split(
    g: Graph, k: int, what: str, order: np.ndarray | None = None, members: np.ndarray | None = None
) -> np.ndarray:
    """Block of every node for the ``what`` baseline over ``order`` (default: topological)."""
    order = g.topo_order if order is None else np.asarray(order)
    w = node_weights(g, what, members)[order]
    parts = linear_partition(w, k)
    a = np.empty(g.n, dtype=np.int64)
    a[order] = parts
    return a
