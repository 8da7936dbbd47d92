"""The splits practitioners use: contiguous pieces of one topological order.

- ``uniform``: equal numbers of operators per device (Megatron-LM / DeepSpeed 'uniform').
- ``params``: balanced parameter bytes (DeepSpeed 'parameters').
- ``time``: balanced work (GPipe's balance-by-time).

Each balances its own weight exactly (min-max linear partition) and ignores io and memory,
as those tools do; the evaluator then prices the result honestly.

On a device sequence of a heterogeneous cluster (``scale``, :func:`device_scale`) ``time``
balances work divided by each device's speed and ``params`` parameter bytes divided by each
device's capacity (its fast memory when it has none), so the big devices get proportionally
more; ``uniform`` stays by operator count (it knows nothing of the devices, by definition).
"""

from __future__ import annotations

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.pipeline.heuristics.slicing import linear_partition


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


def device_scale(cluster: Cluster, devices: np.ndarray, what: str) -> np.ndarray | None:
    """Per device of the sequence, the share the ``what`` baseline gives it: speed for
    ``time``, capacity (else fast memory; devices with neither count as the largest) for
    ``params``, None (equal shares) for ``uniform`` or when every device has the same."""
    memory, capacity, compute = cluster.device_arrays()
    devices = np.asarray(devices, dtype=np.int64)
    if what == "time":
        s = compute[devices] / cluster.compute
    elif what == "params":
        s = np.where(np.isfinite(capacity[devices]), capacity[devices], memory[devices])
        finite = s[np.isfinite(s)]
        if not len(finite):
            return None
        s = np.where(np.isfinite(s), s, finite.max())
    else:
        return None
    return None if np.all(s == s[0]) else s.astype(np.float64)


def contiguous_split(
    g: Graph,
    k: int,
    what: str,
    order: np.ndarray | None = None,
    members: np.ndarray | None = None,
    scale: np.ndarray | None = None,
) -> np.ndarray:
    """Block of every node for the ``what`` baseline over ``order`` (default: topological);
    ``scale`` gives block j a share proportional to ``scale[j]`` (see :func:`device_scale`)."""
    order = g.topo_order if order is None else np.asarray(order)
    w = node_weights(g, what, members)[order]
    parts = linear_partition(w, k, scale)
    a = np.empty(g.n, dtype=np.int64)
    a[order] = parts
    return a
