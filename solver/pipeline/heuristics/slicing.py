"""Optimal slicing of one topological order into at most k contiguous blocks (exact for that order).

SliceGraph's inner step (Archer et al., ICML 2024): any plan with an acyclic quotient is a
slicing of some topological order, and for a fixed order the best slicing is a dynamic program

    best[j][e] = min over s < e of max(best[j-1][s], f(order[s:e])).

f of a segment depends only on its node set, so io is counted exactly, also when a segment
feeds a non-adjacent one. The DP runs row by row (segment end e), vectorised over the starts s:

- io: for a fixed e, a tensor with producer position P and consumer positions Q adds its io time
  to the starts s in at most two intervals: it is *sent* when P is in [s, e) and some consumer
  is not, and *received* when P is outside and some consumer is inside. The intervals only change
  when e passes P or a consumer, so a difference array over s is updated at O(#consumers)
  events per tensor and one cumulative sum gives io(s, e) for every start.
- parameters likewise (a weight counts when some user lies in [s, e)); work from prefix sums;
  peak as a reverse running maximum; the DP step for every j at once is one 2-D minimum.
- Starts whose segment work alone exceeds an upper bound are never needed, so each row only
  looks at a window. The bound doubles until a slicing is found (f >= work keeps it exact).

The DP is quadratic in the node count when k is small (a window spans about n / k starts), so
it checks the clock every few hundred rows and raises :class:`SliceTimeout` past ``deadline``;
k = 1 needs no DP at all (one block holds every node). At most n blocks can be non-empty, so the
tables have min(k, n) + 1 rows: :func:`slice_table_bytes` says how much they need.

With a device sequence d_0..d_{k-1} (``devices``; block b runs on d_b, on a heterogeneous
cluster) each block prices its segment with d_b's compute, fast memory and capacity, and its
received (sent) bytes at the link from d_{b-1} (to d_{b+1}). This is exact for the sequence
when the links between its devices are all alike (one group, or one link class); otherwise a
transfer between non-adjacent blocks, or a multicast over several link classes, is priced
approximately. Either way the returned value is the evaluator's
(:func:`solver.core.cost.evaluate` with ``placement`` = the sequence).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.graph import Graph

CLOCK_EVERY = 256  # DP rows between two looks at the clock


@dataclass(frozen=True)
class _Devices:
    """Per block b of a device sequence: speed (compute / reference), fast memory, capacity
    (inf: none), and the bandwidth of the links it receives from and sends to."""

    speed: np.ndarray
    memory: np.ndarray
    capacity: np.ndarray
    bw_in: np.ndarray
    bw_out: np.ndarray


def _device_terms(cluster: Cluster, devices: np.ndarray) -> _Devices:
    memory, capacity, compute = cluster.device_arrays()
    k = len(devices)
    if k > 1:
        bw, _ = cluster.link_arrays(devices[:-1], devices[1:])
        bw_in = np.concatenate([[bw[0]], bw])
        bw_out = np.concatenate([bw, [bw[-1]]])
    else:
        bw_in = bw_out = np.full(1, cluster.link_bandwidth)
    return _Devices(
        speed=compute[devices] / cluster.compute,
        memory=memory[devices].astype(np.float64),
        capacity=capacity[devices] * (1 + 1e-12),
        bw_in=np.asarray(bw_in, dtype=np.float64),
        bw_out=np.asarray(bw_out, dtype=np.float64),
    )


class SliceTimeout(Exception):
    """The slicing DP passed its deadline before finishing (no partial result exists)."""


def slice_table_bytes(n: int, k: int) -> int:
    """Bytes the DP tables (best value and parent per block count and end) of n nodes take."""
    return 16 * (min(k, n) + 1) * (n + 1)


class _Intervals:
    """A difference array over starts s with a running prefix ``base`` = sum of D[:lo]."""

    def __init__(self, n: int):
        self.D = np.zeros(n + 2)
        self.lo = 0
        self.base = 0.0

    def add(self, a: int, b: int, w: float) -> None:
        """Add w to every start in [a, b] (inclusive)."""
        if a > b:
            return
        self.D[a] += w
        self.D[b + 1] -= w
        if a < self.lo:
            self.base += w
        if b + 1 < self.lo:
            self.base -= w

    def row(self, lo: int, e: int) -> np.ndarray:
        """Values at starts lo..e-1 (``lo`` never decreases between calls)."""
        if lo > self.lo:
            self.base += float(self.D[self.lo : lo].sum())
            self.lo = lo
        return self.base + np.cumsum(self.D[lo:e])


def _tensor_intervals(e: int, P: int, minq: int, maxq: int, mq: int) -> list[tuple[int, int, bool]]:
    """Starts s (inclusive ranges) whose segment [s, e) pays this tensor's io, each with
    True when the segment receives the tensor and False when it sends it."""
    out: list[tuple[int, int, bool]] = []
    if e <= P:  # producer beyond the segment end: received when a consumer is inside
        if mq >= 0:
            out.append((0, mq, True))
        return out
    if maxq >= e:  # a consumer beyond the end: sent whenever the producer is inside
        out.append((0, P, False))
    elif minq + 1 <= P:  # consumers before the producer (data-only edges)
        out.append((minq + 1, P, False))
    if mq >= P + 1:  # producer before the start, a consumer inside
        out.append((P + 1, mq, True))
    return out


def slice_order(
    g: Graph,
    cluster: Cluster,
    order: np.ndarray,
    k: int | None = None,
    upper: float = math.inf,
    deadline: float = math.inf,
    devices: np.ndarray | None = None,
) -> tuple[float, np.ndarray | None]:
    """Best slicing of ``order`` into at most k contiguous blocks.

    With ``devices`` (a sequence of distinct devices of a heterogeneous ``cluster``; k is its
    length) block b is priced on ``devices[b]`` (module docstring) and the value returned is
    the evaluator's with that placement. On a homogeneous cluster ``devices`` is ignored.

    Returns (bottleneck, assignment), or (inf, None) when no slicing fits the capacity. With a
    finite ``upper``, returns (inf, None) as soon as it is clear that no slicing costs at most
    ``upper`` (a cheap rejection for searches that only want improvements). Raises
    :class:`SliceTimeout` when ``time.perf_counter()`` passes ``deadline``.
    """
    if devices is not None and not cluster.homogeneous:
        return _slice_on_devices(g, cluster, order, np.asarray(devices), upper, deadline)
    k = cluster.devices if k is None else k
    k = min(k, g.n)  # at most n blocks can be non-empty
    order = np.asarray(order, dtype=np.int64)
    if k <= 1:  # one block holds everything: no DP
        a = np.zeros(g.n, dtype=np.int64)
        if any(v.kind == "capacity" for v in validate(g, cluster, a, k=1)):
            return math.inf, None
        val = evaluate(g, cluster, a, k=1).objective
        return (val, a) if val <= upper * (1 + 1e-9) else (math.inf, None)
    W = np.concatenate([[0.0], np.cumsum(g.work[order])])
    total = float(W[-1])
    if math.isfinite(upper):
        val, a = _slice(g, cluster, order, k, upper * (1 + 1e-9), W, deadline)
        return (val, a) if a is not None and val <= upper * (1 + 1e-9) else (math.inf, None)
    # the window is exact when the result is within it: every segment of a better slicing has
    # work <= f <= result; otherwise widen it to the result (or double it) and run again
    lim = max(1.5 * total / k, float(g.work.max(initial=0.0)))
    while True:
        val, a = _slice(g, cluster, order, k, lim * (1 + 1e-9), W, deadline)
        if (a is not None and val <= lim * (1 + 1e-9)) or lim >= total:
            return val, a
        lim = min(val if a is not None else 2 * lim, total) if lim > 0 else total


def _slice_on_devices(
    g: Graph,
    cluster: Cluster,
    order: np.ndarray,
    devices: np.ndarray,
    upper: float,
    deadline: float,
) -> tuple[float, np.ndarray | None]:
    """:func:`slice_order` with block b on ``devices[b]`` (see there)."""
    devices = np.asarray(devices, dtype=np.int64)  # all of them: blocks may be empty
    k = len(devices)
    order = np.asarray(order, dtype=np.int64)

    def priced(a: np.ndarray | None) -> tuple[float, np.ndarray | None]:
        if a is None or any(
            v.kind == "capacity" for v in validate(g, cluster, a, k=k, placement=devices)
        ):
            return math.inf, None
        val = evaluate(g, cluster, a, k=k, placement=devices).objective
        return (val, a) if val <= upper * (1 + 1e-9) else (math.inf, None)

    if k <= 1:
        return priced(np.zeros(g.n, dtype=np.int64))
    dv = _device_terms(cluster, devices)
    smax = float(dv.speed.max())
    W = np.concatenate([[0.0], np.cumsum(g.work[order])])
    total = float(W[-1])
    if math.isfinite(upper):
        _, a = _slice(g, cluster, order, k, upper * (1 + 1e-9), W, deadline, dv)
        return priced(a)
    # as in slice_order: a segment with f <= lim has reference work <= lim * (largest speed)
    lim = max(1.5 * total / float(dv.speed.sum()), float(g.work.max(initial=0.0)) / smax)
    while True:
        val, a = _slice(g, cluster, order, k, lim * (1 + 1e-9), W, deadline, dv)
        if (a is not None and val <= lim * (1 + 1e-9)) or lim * smax >= total:
            return priced(a)
        full = total / smax
        lim = min(val if a is not None else 2 * lim, full) if lim > 0 else full


@dataclass
class _Events:
    """What one DP pass over ``order`` reads, computed before the rows.

    io events, sorted by row: at row ``io_row[i]`` tensor ``io_tensor[i]`` changes the starts
    that pay it, because its producer (``io_consumer[i]`` = -1) or its consumer at position
    ``io_consumer[i]`` enters the segment; ``io[t]`` is its time on the reference link (its
    bytes on a device sequence), ``producer[t]``, ``first_consumer[t]`` and ``last_consumer[t]``
    its positions in the order (n and -1 without consumers). Parameter events (only when some
    memory limit can bind, ``use_mem``): at row ``par_row[i]`` parameter ``par[i]`` gains the
    user at position ``par_user[i]``; ``par_bytes[p]`` its size. ``act``: the working set of
    each position; ``memory``, ``slow_bandwidth`` and ``capacity`` (with its float slack) the
    reference device's."""

    io_row: list[int]
    io_tensor: list[int]
    io_consumer: list[int]
    io: list[float]
    producer: list[int]
    first_consumer: list[int]
    last_consumer: list[int]
    use_mem: bool
    par_row: list[int]
    par: list[int]
    par_user: list[int]
    par_bytes: list[float]
    act: np.ndarray
    memory: float
    slow_bandwidth: float
    capacity: float


def _events(g: Graph, cluster: Cluster, order: np.ndarray, dv: _Devices | None) -> _Events:
    """The io and parameter events of ``order`` (see :class:`_Events`)."""
    n = g.n
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    cap = math.inf if cluster.capacity is None else cluster.capacity * (1 + 1e-12)
    # io events: (row e at which the event applies, tensor)
    ncons = np.diff(g.t_ptr)
    live = np.flatnonzero((ncons > 0) & (g.t_size > 0))
    P = pos[g.t_producer]
    qpos = pos[g.t_cons]
    pt = g.pair_tensor
    minq = np.full(g.num_tensors, n, dtype=np.int64)
    maxq = np.full(g.num_tensors, -1, dtype=np.int64)
    np.minimum.at(minq, pt, qpos)
    np.maximum.at(maxq, pt, qpos)
    keep_pair = np.isin(pt, live)
    ev_e = np.concatenate([P[live] + 1, qpos[keep_pair] + 1])
    ev_t = np.concatenate([live, pt[keep_pair]])
    ev_q = np.concatenate([np.full(len(live), -1), qpos[keep_pair]])
    srt = np.lexsort((ev_t, ev_e))
    # parameter events: a weight counts for starts <= its last user before e
    if dv is None:
        use_mem = math.isfinite(cluster.fast_memory) or math.isfinite(cap)
    else:
        use_mem = bool(np.isfinite(dv.memory).any() or np.isfinite(dv.capacity).any())
    pv_e, pv_p, pv_u = [], [], []
    if use_mem and g.num_params:
        upos = pos[g.p_users]
        s2 = np.lexsort((g.pair_param, upos))
        pv_e = (upos[s2] + 1).tolist()
        pv_p = g.pair_param[s2].tolist()
        pv_u = upos[s2].tolist()
    return _Events(
        io_row=ev_e[srt].tolist(),
        io_tensor=ev_t[srt].tolist(),
        io_consumer=ev_q[srt].tolist(),
        io=(g.t_size / cluster.link_bandwidth if dv is None else g.t_size).tolist(),
        producer=P.tolist(),
        first_consumer=minq.tolist(),
        last_consumer=maxq.tolist(),
        use_mem=use_mem,
        par_row=pv_e,
        par=pv_p,
        par_user=pv_u,
        par_bytes=g.p_size.tolist(),
        act=g.act[order],
        memory=cluster.fast_memory,
        slow_bandwidth=cluster.slow_memory_bandwidth,
        capacity=cap,
    )


class _Sweep:
    """The segment costs of row e for every start, kept as difference arrays over the starts
    (io sent, io received on a device sequence, parameter bytes) that the events of
    :class:`_Events` update as e grows."""

    def __init__(self, ev: _Events, n: int, num_tensors: int, num_params: int, devices: bool):
        self.ev = ev
        self.sent = _Intervals(n)
        self.received = _Intervals(n) if devices else self.sent  # one sum on the reference
        self.params = _Intervals(n)
        self.last_consumer = [-1] * num_tensors  # the last consumer position before e
        self.paying: dict[int, list[tuple[int, int, bool]]] = {}  # tensor -> its intervals
        self.last_user = [-1] * num_params  # the last user position before e
        self.next_io = self.next_par = 0

    def advance(self, e: int) -> None:
        """Apply the events of row e."""
        ev, ie, ip = self.ev, self.next_io, self.next_par
        n_ev, n_pv = len(ev.io_row), len(ev.par_row)
        while ie < n_ev and ev.io_row[ie] == e:
            t, q = ev.io_tensor[ie], ev.io_consumer[ie]
            if q >= 0:
                self.last_consumer[t] = q
            new = _tensor_intervals(
                e, ev.producer[t], ev.first_consumer[t], ev.last_consumer[t], self.last_consumer[t]
            )
            old = self.paying.get(t, [])
            if new != old:
                w = ev.io[t]
                for a, b, rec in old:
                    (self.received if rec else self.sent).add(a, b, -w)
                for a, b, rec in new:
                    (self.received if rec else self.sent).add(a, b, w)
                self.paying[t] = new
            ie += 1
        while ip < n_pv and ev.par_row[ip] == e:
            p, u = ev.par[ip], ev.par_user[ip]
            if self.last_user[p] >= 0:
                self.params.add(0, self.last_user[p], -ev.par_bytes[p])
            self.params.add(0, u, ev.par_bytes[p])
            self.last_user[p] = u
            ip += 1
        self.next_io, self.next_par = ie, ip

    def memory(self, lo: int, e: int) -> np.ndarray:
        """Parameter bytes plus peak working set of the segments [s, e), s = lo..e-1."""
        act = self.ev.act
        return self.params.row(lo, e) + np.maximum.accumulate(act[lo:e][::-1])[::-1]

    def costs(self, lo: int, e: int, W: np.ndarray) -> np.ndarray:
        """f of the segments [s, e), s = lo..e-1, on the reference device (inf: over the
        capacity)."""
        ev = self.ev
        f = (W[e] - W[lo:e]) + self.sent.row(lo, e)
        if ev.use_mem:
            mem = self.memory(lo, e)
            if math.isfinite(ev.memory):
                f = f + np.maximum(0.0, mem - ev.memory) / ev.slow_bandwidth
            f[mem > ev.capacity] = math.inf
        return f[None, :]

    def device_costs(self, lo: int, e: int, W: np.ndarray, dv: _Devices) -> np.ndarray:
        """f of the segments [s, e), s = lo..e-1, one row per block of the device sequence."""
        ev = self.ev
        f = _device_row(dv, W[e] - W[lo:e], self.received.row(lo, e), self.sent.row(lo, e))
        if ev.use_mem:
            mem = self.memory(lo, e)
            f = f + np.maximum(0.0, mem[None, :] - dv.memory[:, None]) / ev.slow_bandwidth
            f[mem[None, :] > dv.capacity[:, None]] = math.inf
        return f


def _slice(
    g: Graph,
    cluster: Cluster,
    order: np.ndarray,
    k: int,
    lim: float,
    W: np.ndarray,
    deadline: float = math.inf,
    dv: _Devices | None = None,
) -> tuple[float, np.ndarray | None]:
    """One DP pass considering only segments whose cost is at most ``lim`` (on the
    reference device: whose work is at most ``lim``); ``dv`` prices block b on device b."""
    n = g.n
    timed = math.isfinite(deadline)
    sweep = _Sweep(_events(g, cluster, order, dv), n, g.num_tensors, g.num_params, dv is not None)
    best = np.full((k + 1, n + 1), math.inf)
    parent = np.zeros((k + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    if dv is not None:
        best[:, 0] = 0.0  # leading blocks may be empty on a device sequence
    reach = lim if dv is None else lim * float(dv.speed.max())  # largest reference work
    for e in range(1, n + 1):
        if timed and e % CLOCK_EVERY == 0 and time.perf_counter() > deadline:
            raise SliceTimeout(f"slicing stopped at the time limit after {e:,} of {n:,} nodes")
        sweep.advance(e)
        lo = int(np.searchsorted(W, W[e] - reach, side="left"))
        lo = min(lo, e - 1)
        f = sweep.costs(lo, e, W) if dv is None else sweep.device_costs(lo, e, W, dv)
        cand = np.maximum(best[:k, lo:e], f)
        arg = cand.argmin(axis=1)
        best[1:, e] = cand[np.arange(k), arg]
        parent[1:, e] = lo + arg
        if dv is not None:
            # an empty block leaves its device idle: block j may also end where j - 1 did
            acc = np.minimum.accumulate(best[:, e])
            parent[acc < best[:, e], e] = e
            best[:, e] = acc
    return _backtrack(best, parent, order)


def _backtrack(
    best: np.ndarray, parent: np.ndarray, order: np.ndarray
) -> tuple[float, np.ndarray | None]:
    """The best slicing of the DP tables: (bottleneck, block of every node), (inf, None)
    when none fits."""
    n = best.shape[1] - 1
    j = int(np.argmin(best[:, n]))
    val = float(best[j, n])
    if not math.isfinite(val):
        return math.inf, None
    a = np.empty(n, dtype=np.int64)
    e, blk = n, j - 1
    while e > 0:
        s = int(parent[j, e])
        a[order[s:e]] = blk
        e, j, blk = s, j - 1, blk - 1
    return val, a


def _device_row(dv: _Devices, work: np.ndarray, recv: np.ndarray, sent: np.ndarray) -> np.ndarray:
    """Segment costs without memory, one row per block of the device sequence (k x starts)."""
    return (
        work[None, :] / dv.speed[:, None]
        + recv[None, :] / dv.bw_in[:, None]
        + sent[None, :] / dv.bw_out[:, None]
    )


def linear_partition(weights: np.ndarray, k: int, scale: np.ndarray | None = None) -> np.ndarray:
    """Split ``weights`` into at most k contiguous parts minimising the largest sum (exact).

    Binary search over the value with a greedy feasibility check (non-negative weights).
    Returns the part index of every element. With ``scale`` (k positive numbers) part j's sum
    is divided by ``scale[j]`` (parts in proportion to device speed or memory); parts may then
    be empty.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if scale is not None:
        return _scaled_partition(w, np.asarray(scale, dtype=np.float64)[:k])
    P = np.concatenate([[0.0], np.cumsum(w)])

    def parts(limit: float) -> np.ndarray | None:
        out = np.empty(n, dtype=np.int64)
        start, part = 0, 0
        while start < n:
            end = int(np.searchsorted(P, P[start] + limit * (1 + 1e-12), side="right")) - 1
            end = max(end, start + 1)
            if P[end] - P[start] > limit * (1 + 1e-12):
                return None
            out[start:end] = part
            part += 1
            start = end
            if part > k:
                return None
        return out if part <= k else None

    return _least_feasible(parts, float(w.max()), float(P[-1]), 100)


def _scaled_partition(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """:func:`linear_partition` minimising max_j (sum of part j) / scale[j], parts in order.

    For a value T part j greedily takes the longest prefix of what is left with sum at most
    T * scale[j]; that is optimal for T (exchange argument), and T is found by bisection.
    """
    n, k = len(w), len(scale)
    P = np.concatenate([[0.0], np.cumsum(w)])
    tol = 1 + 1e-12

    def parts(limit: float) -> np.ndarray | None:
        out = np.empty(n, dtype=np.int64)
        start = 0
        for j in range(k):
            end = int(np.searchsorted(P, P[start] + limit * scale[j] * tol, side="right")) - 1
            end = max(end, start)
            out[start:end] = j
            start = end
            if start >= n:
                return out
        return None

    lo, hi = float(w.max()) / float(scale.max()), float(P[-1]) / float(scale.min())
    return _least_feasible(parts, lo, hi, 200)


def _least_feasible(parts, lo: float, hi: float, steps: int) -> np.ndarray:
    """Bisection on the limit: ``parts(limit)`` is a partition or None, monotone in the limit,
    and ``parts(hi)`` exists; the partition at the least feasible limit (relative 1e-12)."""
    for _ in range(steps):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if parts(mid) is not None:
            hi = mid
        else:
            lo = mid
    res = parts(hi)
    assert res is not None
    return res
