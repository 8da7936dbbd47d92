"""The io every boundary between blocks pays: a bound on the sum of the blocks' costs.

A plan with every block at most T and ``(k - 1) T < W`` (W the total work) uses all k blocks,
so its k - 1 prefix ideals I_1 < ... < I_{k-1} (the nodes of the first i blocks) exist, each
with ``W - (k - i) T <= work(I_i) <= i T``. A node whose descendants (itself included) weigh
more than ``(k - i) T`` is in I_i, one whose ancestors weigh more than ``i T`` is not. A
tensor t whose producer is in I_i and a consumer is not *crosses* boundary i; crossing r >= 1
boundaries, it is paid at least twice (sent once, received at least once), and the r - 1
blocks strictly between its producer's block and its last consumer's block each hold at least
``m = W - (k - 1) T`` of work, all of it in nodes neither ancestors of the producer nor
descendants of every consumer: ``r <= r_max(t) = 1 + floor(spread(t) / m)``. With the weight
``2 / r_max(t)`` per crossing, the weighted crossings of the k - 1 ideals add up to at most the
io the plan pays, so ``W + sum over i of the least weighted cut of an ideal in window i <= k T``:
a T where the left side is larger is below the optimum. The cuts are minimum cuts (OR-Tools'
max-flow, capacities rounded down: never above the real minimum) of the closure network with
the forced nodes tied to each side. Proof and measurements: docs/bounds.md, "boundary io".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.pipeline.bounds.decision import largest_proven
from solver.pipeline.bounds.forced_io import bits_sums, reach_bits

MAX_NODES = 20_000  # reachability bitsets take n^2 / 4 bytes (as the decision io bound's)
SLACK = 1e-9  # relative: a floating sum never proves by rounding; spreads are rounded up
CAPACITY_BITS = 61  # as the node block's networks: no sum of flows at a vertex reaches 2^63


@dataclass(frozen=True)
class Window:
    """The nodes every plan under T puts in the prefix ideal I_i (``inside``: their
    descendants weigh more than the blocks after it can hold) and out of it (``outside``:
    their ancestors weigh more than the first i blocks can hold)."""

    inside: np.ndarray
    outside: np.ndarray


@dataclass(frozen=True)
class BoundaryIo:
    """What the boundary cuts read, per coarse node: ``up`` (work of the node and its
    ancestors), ``down`` (of the node and its descendants); per tensor sent when split:
    ``producer``, its other consumers (``cons[cons_ptr[j]:cons_ptr[j + 1]]``), ``seconds``
    (size / B) and ``spread`` (the work of the nodes that are neither ancestors of the
    producer nor descendants of every consumer); the order edges; the total work."""

    up: np.ndarray
    down: np.ndarray
    producer: np.ndarray
    cons_ptr: np.ndarray
    cons: np.ndarray
    seconds: np.ndarray
    spread: np.ndarray
    e_src: np.ndarray
    e_dst: np.ndarray
    total_work: float

    @property
    def n(self) -> int:
        return len(self.up)

    def weights(self, k: int, T: float) -> np.ndarray | None:
        """Per tensor, ``2 / r_max`` at T (None when ``(k - 1) T >= W``: no claim). W is
        shrunk by SLACK: a floating sum of the works never makes a block look nonempty (or m
        larger) by rounding."""
        m = self.total_work * (1 - SLACK) - (k - 1) * T
        if m <= 0:
            return None
        return 2.0 / (1.0 + np.floor(self.spread * (1 + SLACK) / m))

    def forced(self, k: int, i: int, T: float) -> Window:
        """The nodes every plan under T puts in I_i and out of it."""
        return Window(
            inside=self.down * (1 - SLACK) > (k - i) * T, outside=self.up * (1 - SLACK) > i * T
        )


def boundary_io(cg: Graph, cluster: Cluster, deadline: float = math.inf) -> BoundaryIo | None:
    """The reachability sums and tensor spreads of the coarse graph ``cg`` (None on a cluster
    whose devices or links differ, above MAX_NODES nodes, when a consumer is not a descendant
    of its producer, or past ``deadline``, a ``time.perf_counter()`` value)."""
    if cg.n > MAX_NODES or not cluster.homogeneous:
        return None
    anc, desc = reach_bits(cg, False), reach_bits(cg, True)
    everything = (1 << cg.n) - 1
    producer, ptr, cons, seconds, rest = [], [0], [], [], []
    for t in range(cg.num_tensors):
        p = int(cg.t_producer[t])
        readers = sorted(set(cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]].tolist()) - {p})
        if not readers or cg.t_size[t] <= 0:
            continue
        after = everything
        for c in readers:
            if not (desc[p] >> c) & 1:
                return None  # a data edge that is not an order edge: the crossings differ
            after &= desc[c]
        producer.append(p)
        cons.extend(readers)
        ptr.append(len(cons))
        seconds.append(float(cg.t_size[t]) / cluster.link_bandwidth)
        rest.append(everything & ~(anc[p] | after))
    work = cg.work.astype(float)[:, None]
    sums = bits_sums(anc + desc + rest, work, deadline)
    if sums is None:
        return None
    n = cg.n
    return BoundaryIo(
        up=sums[:n, 0],
        down=sums[n : 2 * n, 0],
        producer=np.array(producer, dtype=np.int64),
        cons_ptr=np.array(ptr, dtype=np.int64),
        cons=np.array(cons, dtype=np.int64),
        seconds=np.array(seconds),
        spread=sums[2 * n :, 0],
        e_src=cg.e_src.astype(np.int64),
        e_dst=cg.e_dst.astype(np.int64),
        total_work=float(cg.work.sum()),
    )


def boundary_cuts(bio: BoundaryIo, k: int, T: float) -> np.ndarray | None:
    """Per boundary i = 1..k-1, the least weighted crossing of an ideal with the forced nodes
    of window i on their sides (``inf`` where a node is forced to both: no plan under T);
    None when ``(k - 1) T >= W`` (no claim)."""
    w = bio.weights(k, T)
    if w is None:
        return None
    caps = bio.seconds * w
    out = np.zeros(k - 1)
    for i in range(1, k):
        window = bio.forced(k, i, T)
        if (window.inside & window.outside).any():
            out[i - 1] = math.inf
        elif window.inside.any():
            out[i - 1] = _least_cut(bio, caps, window)
    return out


def _least_cut(bio: BoundaryIo, caps: np.ndarray, window: Window) -> float:
    """Min over ideals I holding ``window.inside`` and none of ``window.outside`` of the sum of
    ``caps`` over the tensors I splits: a closure network (an order edge u -> v is an uncuttable arc
    v -> u), a tensor an arc producer -> its vertex of its capacity and uncuttable arcs on to
    its consumers; capacities scaled to integers, rounded down."""
    from ortools.graph.python import max_flow  # heavy (OR-Tools): only when this bound runs

    n = bio.n
    source, sink = n, n + 1
    aux = n + 2 + np.arange(len(caps))
    ins, outs = np.flatnonzero(window.inside), np.flatnonzero(window.outside)
    tensor_of_reader = np.repeat(np.arange(len(caps)), np.diff(bio.cons_ptr))
    fixed_tail = np.concatenate([bio.e_dst, aux[tensor_of_reader], np.full(len(ins), source), outs])
    fixed_head = np.concatenate([bio.e_src, bio.cons, ins, np.full(len(outs), sink)])
    finite = float(caps.sum())
    if finite <= 0:
        return 0.0
    degree = int(np.bincount(np.concatenate([fixed_tail, fixed_head])).max())
    scale = 2.0**CAPACITY_BITS / (degree + 2) / finite
    never = int(finite * scale) + 1
    net = max_flow.SimpleMaxFlow()
    net.add_arcs_with_capacity(fixed_tail, fixed_head, np.full(len(fixed_tail), never))
    net.add_arcs_with_capacity(bio.producer, aux, np.floor(caps * scale).astype(np.int64))
    if net.solve(source, sink) != net.OPTIMAL:
        return 0.0  # no claim
    return float(net.optimal_flow()) / scale


def boundary_io_exceeds(bio: BoundaryIo, k: int, T: float) -> bool:
    """True only with a proof that no plan has every block at most T: the work plus the
    boundaries' least io exceeds k T."""
    cuts = boundary_cuts(bio, k, T)
    if cuts is None:
        return False
    return (bio.total_work + float(cuts.sum())) * (1 - SLACK) > k * T


def boundary_io_bound(
    bio: BoundaryIo, k: int, seconds: float, lo: float, hi: float = math.inf
) -> float:
    """Largest T proven in [``lo``, ``hi``] (``lo``, proven by the caller, when none above it
    is); no claim at or above ``W / (k - 1)``."""
    if k < 2:
        return lo
    hi = min(hi, bio.total_work / (k - 1))
    t_end = time.perf_counter() + seconds
    return largest_proven(lambda T: boundary_io_exceeds(bio, k, T), lo, hi, t_end)
