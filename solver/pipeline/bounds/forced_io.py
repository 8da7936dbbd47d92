"""Tensors every plan under a guessed bottleneck T must send: the io terms of the decision bound.

For a tensor t (producer p) and one of its consumers c, the *hull* of p and c is every node on
an order path between them (p and c included). A block holding both p and c holds the hull
(order edges only go forward, so a node on a path from p to c lies in a block between
theirs), and costs at least its work plus the overflow of the weights charged to its nodes
(each parameter to its first user, as the items do) with the larger act of p and c. So when
that *hull cost* exceeds T, no plan with every block at most T puts p and c in one block:
p's block sends t (a consumer is elsewhere) and c's block receives it. Charging ``s_t / B``
to p and ``s_t / B`` to one such consumer (the one with the costliest hull, whatever T is)
charges each tensor at most once per side, so every block S of such a plan has
``io(S) >= sum over its nodes of their charges``: the charges are io that can be packed with
the works (:func:`solver.pipeline.bounds.decision.decision_io_bound`). The hulls' sums are
computed exactly from reachability bitsets (docs/bounds.md, "decision io").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import overflow
from solver.core.graph import Graph

MAX_NODES = 20_000  # reachability bitsets take n^2 / 4 bytes: larger coarse graphs skip this
ROW_BATCH = 512  # bitset rows unpacked at once
SLACK = 1e-9  # relative: a hull's floating sum never forces a tensor by rounding


@dataclass(frozen=True)
class ForcedIo:
    """Per tensor that has a consumer other than its producer: the costliest hull over its
    consumers (``hull``, a lower bound of the cost of a block holding the pair), the
    producer (``sender``), the consumer of that hull (``receiver``) and the transfer's
    seconds ``s_t / B``; ``n`` coarse nodes."""

    hull: np.ndarray
    sender: np.ndarray
    receiver: np.ndarray
    seconds: np.ndarray
    n: int

    def charges(self, T: float) -> np.ndarray:
        """Per coarse node, the io it must pay in every plan with every block at most T."""
        forced = self.hull * (1 - SLACK) > T
        out = np.bincount(self.sender[forced], self.seconds[forced], minlength=self.n)
        out += np.bincount(self.receiver[forced], self.seconds[forced], minlength=self.n)
        return out


def reach_bits(g: Graph, down: bool) -> list[int]:
    """Per node, a bitset (Python int) of itself and its ancestors (``down`` False) or its
    descendants (``down`` True) along order edges."""
    ptr, idx = g.succ if down else g.pred
    order = g.topo_order.tolist()
    reach = [0] * g.n
    for v in order[::-1] if down else order:
        bits = 1 << v
        for u in idx[ptr[v] : ptr[v + 1]].tolist():
            bits |= reach[u]
        reach[v] = bits
    return reach


def bits_sums(
    sets: list[int], weights: np.ndarray, deadline: float = math.inf
) -> np.ndarray | None:
    """Sums of each weight column (``weights``: nodes x columns) over each bitset's nodes:
    per byte of the bitsets a table of the 256 sums of its 8 nodes, looked up and added
    (None when ``deadline``, a ``time.perf_counter()`` value, passes first)."""
    n, cols = weights.shape
    nbytes = (n + 7) // 8
    padded = np.zeros((nbytes * 8, cols))
    padded[:n] = weights
    bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
    # table[position, byte value, column]
    table = np.einsum("vb,pbc->pvc", bits.astype(float), padded.reshape(nbytes, 8, cols))
    out = np.empty((len(sets), cols))
    pos = np.arange(nbytes)
    for lo in range(0, len(sets), ROW_BATCH):
        if time.perf_counter() > deadline:
            return None
        rows = b"".join(x.to_bytes(nbytes, "little") for x in sets[lo : lo + ROW_BATCH])
        vals = np.frombuffer(rows, np.uint8).reshape(-1, nbytes)
        out[lo : lo + ROW_BATCH] = table[pos, vals].sum(axis=1)
    return out


def first_user_bytes(g: Graph) -> np.ndarray:
    """Each parameter's bytes charged to its first user (a block holding that user stores it)."""
    charged = np.zeros(g.n)
    if g.num_params:
        np.add.at(charged, g.p_users[g.p_ptr[:-1]], g.p_size)
    return charged


def forced_io(cg: Graph, cluster: Cluster, deadline: float = math.inf) -> ForcedIo | None:
    """The hulls of every (tensor, consumer) pair of the coarse graph ``cg`` (None above
    MAX_NODES nodes or past ``deadline``; no tensor when none has a consumer other than its
    producer)."""
    if cg.n > MAX_NODES:
        return None
    tensor = np.repeat(np.arange(cg.num_tensors), np.diff(cg.t_ptr))
    cons = cg.t_cons.astype(np.int64)
    prod = cg.t_producer[tensor].astype(np.int64)
    keep = (cons != prod) & (cg.t_size[tensor] > 0)
    tensor, cons, prod = tensor[keep], cons[keep], prod[keep]
    anc, desc = reach_bits(cg, False), reach_bits(cg, True)
    # nodes on a path p -> c or c -> p (a data edge need not be an order edge), both included
    hulls = [
        (desc[p] & anc[c]) | (desc[c] & anc[p]) | (1 << p) | (1 << c)
        for p, c in zip(prod.tolist(), cons.tolist(), strict=True)
    ]
    weights = np.stack([cg.work.astype(float), first_user_bytes(cg)], axis=1)
    # most hulls are the pair alone (no other path between them): summed directly
    pair = [(1 << p) | (1 << c) for p, c in zip(prod.tolist(), cons.tolist(), strict=True)]
    wide = np.array([h != q for h, q in zip(hulls, pair, strict=True)], dtype=bool)
    sums = weights[prod] + weights[cons]
    if wide.any():
        found = bits_sums(
            [h for h, w in zip(hulls, wide.tolist(), strict=True) if w], weights, deadline
        )
        if found is None:
            return None
        sums[wide] = found
    peak = np.maximum(cg.act[prod], cg.act[cons]).astype(float)
    cost = sums[:, 0] + overflow(sums[:, 1], peak, cluster)
    used = np.unique(tensor)
    # the costliest hull per tensor: sorted by tensor, then by decreasing cost, its first pair
    order = np.lexsort((-cost, tensor))
    best = order[np.searchsorted(tensor[order], used)]
    return ForcedIo(
        hull=cost[best],
        sender=prod[best],
        receiver=cons[best],
        seconds=cg.t_size[used].astype(float) / cluster.link_bandwidth,
        n=cg.n,
    )
