"""Separators: the nodes comparable (by order-edge reachability) with every other node.

A graph fact, cached on the (immutable) graph: the chain bounds of :mod:`solver.pipeline.bounds`
and the exact DP over the separator chain (:mod:`solver.pipeline.dp.chain_ideals`) read it.
"""

from __future__ import annotations

import numpy as np

from solver.core.graph import Graph

MAX_NODES = 12_000  # reachability bitsets take n^2 / 8 bytes


def separators(g: Graph) -> np.ndarray | None:
    """Boolean mask of the nodes comparable with every other node (None when too big)."""
    n = g.n
    if n > MAX_NODES:
        return None
    cached = g.__dict__.get("_separators")  # the graph is immutable: computed once
    if cached is not None:
        return cached
    words = (n + 63) // 64
    order = g.topo_order
    ptr, idx = g.pred
    anc = np.zeros((n, words), dtype=np.uint64)
    one = np.uint64(1)
    for v in order.tolist():
        row = anc[v]
        for p in idx[ptr[v] : ptr[v + 1]].tolist():
            row |= anc[p]
            row[p >> 6] |= one << np.uint64(p & 63)
    n_anc = np.zeros(n, dtype=np.int64)
    n_desc = np.zeros(n, dtype=np.int64)
    for lo in range(0, n, 1024):  # in chunks: the unpacked bits of all rows would take n^2 bytes
        bits = np.unpackbits(anc[lo : lo + 1024].view(np.uint8), axis=1, bitorder="little")
        bits = bits[:, :n]
        n_anc[lo : lo + 1024] = bits.sum(axis=1, dtype=np.int64)
        n_desc += bits.sum(axis=0, dtype=np.int64)
    sep = (n_anc + n_desc) == n - 1
    g.__dict__["_separators"] = sep
    return sep
