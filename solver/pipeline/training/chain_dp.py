"""The exact training plan on graphs that separators cut into small gaps (Llama-shaped decoders).

The DP of :mod:`solver.pipeline.training.exact` (least T = a * sum t_i + b * max t_i, per-stage
memory by the stage's position from the end) over the ideals of
:class:`solver.pipeline.dp.chain_ideals.ChainIdeals` (18,731 for the Llama-2-7B shape: every
ideal, nothing restricted) instead of a square subset table:

1. every block S = J minus I whose work + backward work fits under a known plan's T (a plan
   holding S has T >= a W2 + b w2(S)) is priced exactly from prefix sums and the frontier
   tensors (``ChainIdeals.blocks``): F = work + io / B + overflow, B = backward work + io / B,
   t = F + B, and the last position q from the end at which state * params + peak +
   inflight(q) * stash fits (1F1B's count min(m, q) and GPipe's m grow with q);
2. S(M), the least sum of stage times over chains whose blocks have t <= M and fit, is a DP
   over (ideal, stages to the end q), vectorised over the blocks of the ideals that share a
   gap and a size (none contains another); a chain from J with q stages left needs
   q >= w2(V minus J) / M, so each block is tried only at the few q that can reach both ends;
3. min over M of a S(M) + b M by branch and bound over intervals of M: the plans whose largest
   stage time lies in (lo, hi] have T >= a S(hi) + b lo; the interval of least bound is split
   at its middle (a DP at the middle gives a plan and S there) until the bound meets the best
   plan or the time is up, when the least bound is the proven lower bound.

On a cluster whose devices are alike and whose links differ (two hosts), the DP runs on
:meth:`Cluster.relaxation` (every link the fastest): its bound holds for every plan and every
placement; its plan is placed on the real devices (stages in order, filling the groups one
after the other, every split tried) and priced there. Proofs in docs/training.md.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.core.training import TrainingSpec, training_cost
from solver.pipeline.dp.chain_ideals import ChainIdeals, ChainIdealsDoNotApply
from solver.pipeline.training.exact import (
    NO_CHAIN,
    StageChain,
    TrainingDPDoesNotApply,
    TrainingSolution,
)

MAX_BLOCKS = 40_000_000  # blocks kept (17 bytes each)
EPS = 1e-9  # relative slack on float comparisons; the bound is reported this much low
REACH_SLACK = 1e-6  # relative slack of the test "q stages of t <= M cover w2 of the rest"
STOP_GAP = 1e-7  # the search over M stops when its bound is this close to the best plan
MAX_PLACEMENTS = 512  # group splits tried when a plan is placed on the real devices
SHRINK_BELOW = 0.9  # the table is filtered again when the first DP's largest time is below
# this share of the cap (otherwise the filter removes too little to pay for itself)


@dataclass(frozen=True)
class _Table:
    """Every kept block, sorted by its first ideal I: rows ``start[I]:start[I + 1]``."""

    start: np.ndarray
    first: np.ndarray  # I (int32)
    last: np.ndarray  # J (int32)
    time: np.ndarray  # t = F + B
    fits_upto: np.ndarray  # the largest position from the end q at which it fits (int8)
    w2: np.ndarray  # per ideal: work + backward work of its nodes
    batches: np.ndarray  # ideal indices where a new (gap, size) batch starts, and N


@dataclass(frozen=True)
class _Interval:
    """Plans whose largest stage time lies in (lo, hi]; ``total`` = S(hi)."""

    lo: float
    hi: float
    total: float


def chain_training_plan(
    g: Graph,
    cluster: Cluster,
    k: int,
    spec: TrainingSpec,
    time_limit: float = 60.0,
    upper: float = math.inf,
) -> TrainingSolution:
    """The plan of least T with at most k stages, each fitting its memory, with its proof (on a
    cluster whose links differ: a plan and a bound over every placement); past ``time_limit``
    the best plan found and a proven lower bound. ``upper``: T of a known valid plan (it
    prunes blocks). Raises :class:`TrainingDPDoesNotApply` when the chain DP does not apply."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    flat = _flat_view(cluster, spec)
    cg, labels = coarse_view(g)
    try:
        chain = ChainIdeals(cg, flat, deadline)
        quick = _gap_end_chain(chain, cg, flat, k, spec, upper, deadline)
        known = min(upper, quick.iteration_time(spec))
        table = _price(chain, cg, flat, k, spec, known, deadline)
    except ChainIdealsDoNotApply as e:
        raise TrainingDPDoesNotApply(f"training chain DP: {e}") from None
    sol = TrainingSolution(ideals=chain.count, blocks=len(table.time))
    best = _search(table, k, spec, _cap(spec, float(table.w2[-1]), known), deadline, sol, quick)
    sol.lower = min(sol.lower, upper) * (1 - EPS)
    if best.ideals is not None:
        sol.assignment = chain.assignment(best.ideals)[labels]
        sol.placement, sol.cost = _placed(g, cluster, k, spec, sol.assignment)
    sol.seconds = time.perf_counter() - t0
    return sol


def _gap_end_chain(chain: ChainIdeals, cg, cluster, k: int, spec, upper, deadline) -> StageChain:
    """The best chain whose cuts all lie at gap ends (few ideals, quick): a plan whose T
    prunes the blocks of the full search (no bound: the problem is restricted)."""
    table = _price(chain, cg, cluster, k, spec, upper, deadline, allowed=chain.gap_ends)
    if not len(table.time):
        return NO_CHAIN
    scratch = TrainingSolution()
    return _search(table, k, spec, _cap(spec, float(table.w2[-1]), upper), deadline, scratch)


def _flat_view(cluster: Cluster, spec: TrainingSpec) -> Cluster:
    """The homogeneous cluster the DP prices on: the cluster itself, or its relaxation when
    only the links differ (every plan costs at least as much on the real devices)."""
    if spec.schedule == "interleaved" and spec.virtual_stages > 1:
        raise TrainingDPDoesNotApply(
            "training chain DP: interleaved in-flight counts depend on the stage count"
        )
    if cluster.homogeneous:
        return cluster
    memory, capacity, compute = cluster.device_arrays()
    alike = all((x == x[0]).all() for x in (memory, capacity, compute))
    if not alike or compute[0] != cluster.compute:
        raise TrainingDPDoesNotApply("training chain DP: the devices differ")
    return cluster.relaxation()[0]


def _cap(spec: TrainingSpec, total: float, upper: float) -> float:
    """The largest stage time of a plan with T <= upper: (upper - a W2) / b (inf when b = 0)."""
    a, b = spec.time_weights
    if b == 0 or math.isinf(upper):
        return math.inf
    return (upper - a * total) / b * (1 + EPS)


@dataclass(frozen=True)
class _Prefix:
    """Per ideal: sums over its nodes (work + backward work, backward work, stash bytes, the
    bytes of parameters used by one node only)."""

    w2: np.ndarray
    backward: np.ndarray
    stash: np.ndarray
    own_params: np.ndarray


@dataclass(frozen=True)
class _Reach:
    """Stages needed, every stage time at most M: ``rest[J]`` by the nodes outside ideal J,
    ``before[I]`` by the nodes of I (each stage's time is at least its w2)."""

    rest: np.ndarray
    before: np.ndarray

    @staticmethod
    def at(w2: np.ndarray, M: float) -> _Reach:
        reach = M * (1 + REACH_SLACK)
        rest = np.ceil((w2[-1] - w2) / reach).astype(np.int64)
        return _Reach(rest, np.ceil(w2 / reach).astype(np.int64))

    def useful(self, first, last, fits: np.ndarray, k: int) -> np.ndarray:
        """Blocks that some position q from the end can hold: q >= 1 + rest[J] (the rest
        needs q - 1 stages), q <= k - before[I] and q <= fits."""
        return 1 + self.rest[last] <= np.minimum(fits, k - self.before[first])


def _price(
    chain: ChainIdeals, cg: Graph, cluster: Cluster, k: int, spec, upper, deadline, allowed=None
) -> _Table:
    """The blocks a plan better than ``upper`` may use, priced by the model: w2(S) within the
    cap, some position holds them (a floor of their memory first, then the exact one); with
    ``allowed`` only the blocks between those ideals."""
    w2_node = cg.work + cg.backward_work
    pre = _Prefix(
        chain.prefix(w2_node),
        chain.prefix(cg.backward_work),
        chain.prefix(cg.stash_bytes),
        chain.own_params,
    )
    cap = _cap(spec, float(pre.w2[-1]), upper)
    reach = _Reach.at(pre.w2, cap)
    inflight = spec.inflight(k)[::-1]  # position q = 1..k from the end

    def may_fit(first, last):
        own = spec.optimizer_state * (pre.own_params[last] - pre.own_params[first])
        fits = _fits_upto(own, pre.stash[last] - pre.stash[first], inflight, cluster)
        return reach.useful(first, last, fits, k)

    parts, kept = [], 0
    for blk in chain.blocks(w2_node, cap, deadline, keep=may_fit, allowed=allowed):
        part = _priced(blk, pre, cluster, spec, inflight, upper)
        part = [x[reach.useful(part[0], part[1], part[3], k)] for x in part]
        kept += len(part[0])
        if kept > MAX_BLOCKS:
            raise TrainingDPDoesNotApply(f"training chain DP: more than {MAX_BLOCKS:,} blocks")
        parts.append(part)
    if not parts:
        parts = [[np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int8)]]
    first, last, t, fits = (np.concatenate(x) for x in zip(*parts, strict=True))
    order = np.argsort(first, kind="stable")
    key = chain.order
    return _Table(
        start=np.searchsorted(first[order], np.arange(chain.count + 1)),
        first=first[order],
        last=last[order],
        time=t[order],
        fits_upto=fits[order],
        w2=pre.w2,
        batches=np.unique(np.r_[np.flatnonzero(np.diff(key)) + 1, 0, len(key)]),
    )


def _priced(blk, pre: _Prefix, cluster: Cluster, spec: TrainingSpec, inflight, upper) -> list:
    """[first, last, t, fits] of the blocks of one chunk that fit somewhere and that a plan
    better than ``upper`` may hold: T >= a (W2 - w2(S) + t(S)) + b t(S)."""
    a, b = spec.time_weights
    io = blk.io / cluster.link_bandwidth
    over = _overflow(blk.params + blk.peak, cluster)
    t = blk.work + io + over + (pre.backward[blk.last] - pre.backward[blk.first]) + io
    static = spec.optimizer_state * blk.params + blk.peak
    fits = _fits_upto(static, pre.stash[blk.last] - pre.stash[blk.first], inflight, cluster)
    w2_s = pre.w2[blk.last] - pre.w2[blk.first]
    total = float(pre.w2[-1])
    keep = (a * (total - w2_s + t) + b * t <= upper * (1 + EPS)) & (fits > 0)
    first, last = blk.first[keep].astype(np.int32), blk.last[keep].astype(np.int32)
    return [first, last, t[keep], fits[keep]]


def _overflow(used: np.ndarray, cluster: Cluster) -> np.ndarray:
    if math.isinf(cluster.fast_memory):
        return np.zeros_like(used)
    return np.maximum(0.0, used - cluster.fast_memory) / cluster.slow_memory_bandwidth


def _fits_upto(static, stash, inflight: np.ndarray, cluster: Cluster) -> np.ndarray:
    """Per block: how many positions from the end (1, 2, ...) it fits at (the in-flight count
    never falls towards the front, so they are the first ones); the test is the model's,
    static + inflight * stash <= capacity, after a division that may be off by one."""
    k = len(inflight)
    if cluster.capacity is None:
        return np.full(len(static), k, dtype=np.int8)
    cap = cluster.capacity * (1 + 1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(stash > 0, (cap - static) / stash, np.where(static <= cap, np.inf, -1.0))
    fits = np.searchsorted(inflight, room, side="right")

    def ok(q):  # fits at position q (1-based; q = 0 always "fits")
        count = inflight[np.clip(q - 1, 0, k - 1)]
        return (q == 0) | (static + count * stash <= cap)

    fits = np.where(ok(fits), fits, fits - 1)
    up = (fits < k) & ok(np.minimum(fits + 1, k))
    return np.where(up, fits + 1, fits).astype(np.int8)


def _least_sum(table: _Table, k: int, M: float) -> StageChain:
    """S(M): the least sum of stage times over chains of at most k blocks, each with
    t <= M and fitting at its position from the end (module docstring, step 2)."""
    N = len(table.w2)
    D = np.full((N, k + 1), math.inf)
    D[N - 1, 0] = 0.0
    reach = M * (1 + REACH_SLACK)
    rest = np.ceil((table.w2[-1] - table.w2) / reach).astype(np.int64)  # stages V minus J needs
    before = np.ceil(table.w2 / reach).astype(np.int64)  # stages I needs
    bounds = table.batches
    for lo, hi in zip(bounds[-2::-1], bounds[:0:-1], strict=True):
        _relax_batch(table, D, int(lo), int(hi), k, M, rest, before)
    q = int(np.argmin(D[0]))
    if not math.isfinite(D[0, q]):
        return NO_CHAIN
    return _walk(table, D, q, M)


def _relax_batch(table: _Table, D, lo: int, hi: int, k: int, M: float, rest, before) -> None:
    """D[I, q] for the ideals lo..hi-1 (one batch: none contains another) from the blocks
    that start there."""
    r0, r1 = int(table.start[lo]), int(table.start[hi])
    # a chain through I has at least before[I] stages up to I and rest[I] after it
    if r0 == r1 or (before[lo:hi] + rest[lo:hi] > k).all():
        return
    t = table.time[r0:r1]
    J, I = table.last[r0:r1], table.first[r0:r1]
    q_lo = 1 + rest[J]
    q_hi = np.minimum(table.fits_upto[r0:r1], k - before[I])
    ok = np.flatnonzero((q_lo <= q_hi) & (t <= M * (1 + EPS)))
    if not len(ok):
        return
    t, J, I, q_lo, q_hi = t[ok], J[ok], I[ok], q_lo[ok], q_hi[ok]
    flat = D.reshape(-1)
    width = k + 1
    for j in range(int((q_hi - q_lo).max()) + 1):
        q = q_lo + j
        use = q <= q_hi
        np.minimum.at(flat, I[use] * width + q[use], t[use] + flat[J[use] * width + q[use] - 1])


def _walk(table: _Table, D: np.ndarray, q: int, M: float) -> StageChain:
    """The chain behind D[{}, q]: at each ideal the block whose time plus the rest's equals
    the table's entry (the very sum the DP took)."""
    chain, longest, total = [0], 0.0, float(D[0, q])
    while q > 0:
        i = chain[-1]
        rows = np.arange(table.start[i], table.start[i + 1])
        t, J = table.time[rows], table.last[rows]
        ok = (t <= M * (1 + EPS)) & (table.fits_upto[rows] >= q)
        hit = np.flatnonzero(ok & (t + D[J, q - 1] == D[i, q]))
        r = int(rows[hit[0]])
        longest = max(longest, float(table.time[r]))
        chain.append(int(table.last[r]))
        q -= 1
    return StageChain(total, longest, chain)


def _search(
    table: _Table, k: int, spec: TrainingSpec, cap: float, deadline, sol, seed=NO_CHAIN
) -> StageChain:
    """min over M of a S(M) + b M by branch and bound over intervals of M (module docstring,
    step 3); sets ``sol.lower`` (for the plans made of kept blocks) and counts the DPs.
    ``seed``: a chain known already (its T prunes; it is returned when nothing beats it)."""
    a, b = spec.time_weights
    top = _least_sum(table, k, cap if math.isfinite(cap) else math.inf)
    sol.candidates = 1
    if top.ideals is None:
        if seed.ideals is None:
            sol.lower, sol.note = math.inf, "no plan fits the memory"
        else:  # every plan with T below the seed's uses kept blocks: none exists
            sol.lower = seed.iteration_time(spec)
        return seed
    best = min(top, seed, key=lambda c: c.iteration_time(spec))
    if b == 0:
        sol.lower = best.iteration_time(spec)
        return best
    if top.longest < SHRINK_BELOW * cap:
        table = _shrink(table, k, spec, top.longest, best.iteration_time(spec))
    floor = float(table.w2[-1]) / k  # every plan's largest stage time is at least W2 / k
    heap = [(a * top.total + b * floor, 0, _Interval(floor, top.longest, top.total))]
    tick = itertools.count(1)
    settled = []  # bounds of intervals too narrow to split
    last_dp = 0.0  # seconds the last DP took
    while heap:
        bound, _, box = heap[0]
        if bound >= best.iteration_time(spec) * (1 - STOP_GAP):
            break
        if time.perf_counter() + last_dp > deadline:  # one more DP would end past it
            sol.note = "time limit"
            break
        heapq.heappop(heap)
        if box.hi - box.lo <= EPS * box.hi:
            settled.append(bound)
            continue
        mid = 0.5 * (box.lo + box.hi)
        started = time.perf_counter()
        found = _least_sum(table, k, mid)
        last_dp = time.perf_counter() - started
        sol.candidates += 1
        heapq.heappush(
            heap, (a * box.total + b * mid, next(tick), _Interval(mid, box.hi, box.total))
        )
        if found.ideals is None:
            continue
        if found.iteration_time(spec) < best.iteration_time(spec):
            best = found
            sol.history.append(found.iteration_time(spec))
        # plans with largest stage time in (found.longest, mid] do no better than ``found``
        if found.longest > box.lo:
            low = _Interval(box.lo, found.longest, found.total)
            heapq.heappush(heap, (a * found.total + b * box.lo, next(tick), low))
    open_bounds = [bound for bound, _, _ in heap]
    sol.lower = min([best.iteration_time(spec), *settled, *open_bounds])
    return best


def _shrink(table: _Table, k: int, spec: TrainingSpec, M: float, best: float) -> _Table:
    """The blocks a plan with largest stage time <= M and T below ``best`` may use (the
    tests of :func:`_price` at M and ``best``): the search's later DPs run on fewer."""
    a, b = spec.time_weights
    total = float(table.w2[-1])
    w2_s = table.w2[table.last] - table.w2[table.first]
    keep = table.time <= M * (1 + EPS)
    keep &= a * (total - w2_s + table.time) + b * table.time <= best * (1 + EPS)
    keep &= _Reach.at(table.w2, M).useful(table.first, table.last, table.fits_upto, k)
    first = table.first[keep]
    return replace(
        table,
        start=np.searchsorted(first, np.arange(len(table.start))),
        first=first,
        last=table.last[keep],
        time=table.time[keep],
        fits_upto=table.fits_upto[keep],
    )


def _placed(g: Graph, cluster: Cluster, k: int, spec: TrainingSpec, assignment: np.ndarray):
    """The placement (None: block b on device b) and training cost of a plan: on a cluster
    whose links differ, the stages in order fill the groups one after the other, every split
    of the stage count over every order of the groups tried (the devices left over run the
    empty blocks); the least valid T."""
    if cluster.homogeneous:
        return None, training_cost(g, cluster, assignment, spec, k=k)
    p = int(assignment.max()) + 1
    best = None
    for devices in _group_fillings(cluster, p):
        spare = np.setdiff1d(np.arange(cluster.devices), devices)
        full = np.concatenate([devices, spare])
        cost = training_cost(g, cluster, assignment, spec, placement=full)
        key = (not cost.valid, cost.iteration_time)
        if best is None or key < best[0]:
            best = (key, full, cost)
    return best[1], best[2]


def _group_fillings(cluster: Cluster, p: int):
    """Device sequences for p stages in order: the groups in some order, each holding a run
    of consecutive stages (at most MAX_PLACEMENTS of them)."""
    groups = cluster.groups
    made = 0
    for perm in itertools.permutations(range(len(groups))):
        for counts in _compositions(p, [len(groups[i]) for i in perm]):
            devices = [d for i, c in zip(perm, counts, strict=True) for d in groups[i][:c]]
            yield np.asarray(devices, dtype=np.int64)
            made += 1
            if made >= MAX_PLACEMENTS:
                return


def _compositions(p: int, sizes: list[int]):
    """Counts c_i <= sizes[i] summing to p."""
    if not sizes:
        if p == 0:
            yield []
        return
    for c in range(min(p, sizes[0]), -1, -1):
        for rest in _compositions(p - c, sizes[1:]):
            yield [c, *rest]
