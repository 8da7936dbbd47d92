"""The exact training plan (least iteration time T) by a DP over ideals, and a certified bound.

T = a * sum_i t_i + b * max_i t_i (:attr:`TrainingSpec.time_weights`) is not a bottleneck
objective, and stage i's memory depends on its position (1F1B keeps min(m, p - i)
microbatches in flight). :func:`exact_training_plan`:

1. enumerates every ideal (down-set) of the coarse graph (:func:`enumerate_ideals`; few on
   graphs that separators cut into small gaps, such as decoders); every plan is a chain of
   ideals, so nothing is restricted;
2. prices every block S = J minus I (I a proper subset of J) with the model (F, B through
   core.cost.evaluate; memory = state * params + peak, plus the stash per in-flight
   microbatch);
3. for each candidate M of the largest stage time (the distinct block times, in increasing
   order), a DP over (ideal I, number q of stages from I to the end) gives S(M), the least
   sum of stage times of a chain whose every block has t <= M and fits its memory. Counting
   stages from the end fixes each block's position from the end, p - i = q, which is all
   1F1B's in-flight count needs; interleaved's also needs p, so it runs once per p;
4. T* = min over M of a * S(M) + b * M. The enumeration stops at the first M with
   a * S(inf) + b * M >= the best T found, since S(M) >= S(inf) for every M.

Proofs in docs/training.md. :func:`solver.core.training.training_lower_bound` is a bound for
every plan of at most k blocks, for graphs the DP cannot take.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.core.training import TrainingCost, TrainingSpec, training_cost
from solver.pipeline.dp.ideals import enumerate_ideals

MAX_IDEALS = 3_000  # the subset table is ideals^2 booleans
MAX_PAIRS = 300_000  # blocks priced through the evaluator, one call each
EPS = 1e-9  # relative slack on float comparisons; the bound is reported this much low
ROW_CHUNK = 512  # ideals per subset test
STACKED_NODES = 20_000  # nodes of the stacked copies priced by one evaluator call (larger
# stacks were slower: np.unique over longer arrays)


class TrainingDPDoesNotApply(MtppError):
    """Too many ideals or blocks, or a cluster whose devices differ."""


@dataclass(frozen=True)
class _Blocks:
    """Every priced block J minus I (arrays over blocks, sorted by I)."""

    first: np.ndarray  # I
    last: np.ndarray  # J
    time: np.ndarray  # t = F + B
    static: np.ndarray  # state * params + peak
    stash: np.ndarray


@dataclass(frozen=True)
class StageChain:
    """A DP answer: the least sum of stage times, the largest stage time on that chain and
    its ideals (None when infeasible)."""

    total: float
    longest: float
    ideals: list[int] | None

    def iteration_time(self, spec: TrainingSpec) -> float:
        a, b = spec.time_weights
        return a * self.total + b * self.longest if self.ideals is not None else math.inf


NO_CHAIN = StageChain(math.inf, math.inf, None)


@dataclass
class TrainingSolution:
    """The best plan found (on the graph given), what is proven, and how it went."""

    assignment: np.ndarray | None = None
    cost: TrainingCost | None = None
    lower: float = 0.0
    placement: np.ndarray | None = None  # device of each block (None: block b on device b)
    ideals: int = 0
    blocks: int = 0
    candidates: int = 0
    seconds: float = 0.0
    note: str = ""
    history: list[float] = field(default_factory=list)

    @property
    def value(self) -> float:
        return math.inf if self.cost is None else self.cost.iteration_time

    @property
    def optimal(self) -> bool:
        return (
            self.cost is not None
            and self.cost.valid
            and self.value <= self.lower * (1 + 1e-6) + 1e-300
        )


def exact_training_plan(
    g: Graph,
    cluster: Cluster,
    k: int,
    spec: TrainingSpec,
    time_limit: float = 60.0,
    upper: float = math.inf,
) -> TrainingSolution:
    """The plan of least T with at most k stages, each fitting its memory, with its proof;
    or, past ``time_limit``, the best plan found and a proven lower bound. ``upper``: T of a
    known valid plan (it prunes blocks; the answer is never worse than the DP's own)."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    if not cluster.homogeneous:
        raise TrainingDPDoesNotApply("the training DP needs devices and links that are alike")
    cg, labels = coarse_view(g)
    ideals = _ideals(cg, deadline)
    blocks = _price_blocks(cg, cluster, spec, ideals, upper, deadline)
    sol = TrainingSolution(ideals=len(ideals), blocks=len(blocks.time))
    best = _search(blocks, len(ideals), k, spec, cluster.capacity, deadline, sol)
    # a plan with a block left unpriced has T >= upper; the others T >= what the DP proved
    sol.lower = min(sol.lower, upper) * (1 - EPS)
    if best.ideals is not None:
        coarse = _assignment(ideals, best.ideals, cg.n)
        sol.assignment = coarse[labels]
        sol.cost = training_cost(g, cluster, sol.assignment, spec, k=k)
    sol.seconds = time.perf_counter() - t0
    return sol


def layer_training_plan(
    g: Graph,
    cluster: Cluster,
    k: int,
    spec: TrainingSpec,
    layer_of_node: np.ndarray,
    time_limit: float = 60.0,
    upper: float = math.inf,
) -> TrainingSolution:
    """The plan of least T among those whose stages are runs of whole layers (``layer_of_node``,
    0..L-1 in order, e.g. :func:`solver.pipeline.training.splits.read_layers`), each stage
    fitting its memory: the same DP over the L + 1 layer prefixes in place of every ideal.
    A warm start: its bound is over layer-granular plans only, a restricted problem, so
    ``lower`` is not a bound on T (it stays 0), and its plan is checked by the model (``cost``
    names a violation when a layer prefix is not closed under the graph's order)."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    if not cluster.homogeneous:
        raise TrainingDPDoesNotApply("the training DP needs devices and links that are alike")
    layers = int(layer_of_node.max()) + 1
    prefixes = layer_of_node[None, :] < np.arange(layers + 1)[:, None]
    blocks = _price_blocks(g, cluster, spec, prefixes, upper, deadline)
    sol = TrainingSolution(ideals=len(prefixes), blocks=len(blocks.time))
    best = _search(blocks, len(prefixes), k, spec, cluster.capacity, deadline, sol)
    sol.lower = 0.0
    if best.ideals is not None:
        sol.assignment = _assignment(prefixes, best.ideals, g.n)
        sol.cost = training_cost(g, cluster, sol.assignment, spec, k=k)
    sol.seconds = time.perf_counter() - t0
    return sol


def _ideals(cg: Graph, deadline: float) -> np.ndarray:
    try:
        return enumerate_ideals(cg, MAX_IDEALS, deadline)
    except MtppError as e:
        raise TrainingDPDoesNotApply(f"training DP: {e}") from None


def _subsets(ideals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All pairs (I, J) of ideals with I a proper subset of J, sorted by I."""
    x = ideals.astype(np.float32)
    size = ideals.sum(axis=1)
    firsts, lasts = [], []
    for lo in range(0, len(ideals), ROW_CHUNK):
        common = x[lo : lo + ROW_CHUNK] @ x.T  # |I & J|, exact in float32 below 2^24 nodes
        rows = size[lo : lo + ROW_CHUNK, None]
        sub = (common == rows) & (size[None, :] > rows)
        i, j = np.nonzero(sub)
        firsts.append(i + lo)
        lasts.append(j)
    return np.concatenate(firsts), np.concatenate(lasts)


def _price_blocks(
    cg: Graph, cluster: Cluster, spec: TrainingSpec, ideals, upper: float, deadline: float
) -> _Blocks:
    """Every block J minus I priced by the model, except those no plan better than ``upper``
    can hold: a plan holding S has T >= a * (W2 - w2(S) + t(S)) + b * t(S) with w2 = work
    + backward work (every other stage's time is at least its work)."""
    first, last = _subsets(ideals)
    w2_node = cg.work + cg.backward_work
    w2 = ideals @ w2_node
    total = float(w2_node.sum())
    a, b = spec.time_weights
    keep = a * total + b * (w2[last] - w2[first]) <= upper * (1 + EPS)
    first, last = first[keep], last[keep]
    if len(first) > MAX_PAIRS:
        raise TrainingDPDoesNotApply(
            f"training DP: {len(first):,} blocks to price (at most {MAX_PAIRS:,})"
        )
    chunk = max(1, STACKED_NODES // cg.n)
    stacked = _stacked(cg, min(chunk, max(1, len(first))))
    parts = []
    for lo in range(0, len(first), chunk):
        if time.perf_counter() > deadline:
            raise TrainingDPDoesNotApply("training DP: time limit while pricing blocks")
        inner, outer = ideals[first[lo : lo + chunk]], ideals[last[lo : lo + chunk]]
        parts.append(_block_terms(cg, stacked, cluster, inner, outer))
    terms = np.concatenate(parts, axis=1) if parts else np.zeros((4, 0))
    time_s = terms[0] + terms[1]
    static = spec.optimizer_state * terms[2] + terms[3]
    s_mask = ideals[last] & ~ideals[first]
    stash, w2_s = s_mask @ cg.stash_bytes, s_mask @ w2_node
    ok = a * (total - w2_s + time_s) + b * time_s <= upper * (1 + EPS)
    return _Blocks(first[ok], last[ok], time_s[ok], static[ok], stash[ok])


def _stacked(cg: Graph, copies: int) -> Graph:
    """``copies`` disjoint copies of ``cg`` (no tensor or weight shared between copies): one
    evaluator call on it prices one three-block plan per copy, exactly as on ``cg``."""
    n = cg.n
    node_off = np.arange(copies) * n

    def csr(ptr: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        counts = np.tile(np.diff(ptr), copies)
        new_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return new_ptr, (idx[None, :] + node_off[:, None]).ravel()

    t_ptr, t_cons = csr(cg.t_ptr, cg.t_cons)
    p_ptr, p_users = csr(cg.p_ptr, cg.p_users)
    empty = np.zeros(0, dtype=np.int64)
    return Graph(
        names=cg.names * copies,
        work=np.tile(cg.work, copies),
        act=np.tile(cg.act, copies),
        t_producer=(cg.t_producer[None, :] + node_off[:, None]).ravel(),
        t_size=np.tile(cg.t_size, copies),
        t_ptr=t_ptr,
        t_cons=t_cons,
        e_src=empty,
        e_dst=empty,
        p_names=cg.p_names * copies,
        p_size=np.tile(cg.p_size, copies),
        p_ptr=p_ptr,
        p_users=p_users,
        group=np.full(n * copies, -1, dtype=np.int64),
        name=f"{cg.name} x {copies}",
    )


def _block_terms(cg: Graph, stacked: Graph, cluster: Cluster, inner, outer) -> np.ndarray:
    """Rows F, B, params, peak of the blocks S = outer minus inner (one column per pair of
    rows), from one evaluator call on the stacked copies (plan I | S | rest in each copy)."""
    r = len(inner)
    plan = np.where(outer, np.where(inner, 0, 1), 2) + 3 * np.arange(r)[:, None]
    copies = stacked.n // cg.n
    full = 2 + 3 * np.repeat(np.arange(copies), cg.n)  # copies past r: one block of their own
    full[: plan.size] = plan.ravel()
    ev = evaluate(stacked, cluster, full, k=3 * copies)
    mid = 3 * np.arange(r) + 1
    backward = (outer & ~inner) @ cg.backward_work + ev.io_in[mid] + ev.io_out[mid]
    return np.stack([ev.f[mid], backward, ev.params[mid], ev.peak[mid]])


def _suffix_dp(
    blocks: _Blocks, N: int, k: int, M: float, inflight, capacity, exactly: bool = False
) -> StageChain:
    """Least sum of stage times over chains of ideals from {} to V with at most k (exactly k
    with ``exactly``) non-empty blocks, each with t <= M and memory within ``capacity`` where
    a block that is the q-th stage from the end keeps ``inflight[q]`` stashes (``inflight``:
    length k + 1)."""
    D = np.full((N, k + 1), math.inf)
    choice = np.full((N, k + 1), -1, dtype=np.int64)  # the block (row) that starts there
    D[N - 1, 0] = 0.0
    starts = np.searchsorted(blocks.first, np.arange(N + 1))
    fits_time = blocks.time <= M * (1 + EPS)
    for i in range(N - 2, -1, -1):
        rows = np.arange(starts[i], starts[i + 1])
        rows = rows[fits_time[rows]]
        if not len(rows):
            continue
        cost = blocks.time[rows, None] + D[blocks.last[rows], :k]  # column q - 1, q = 1..k
        if capacity is not None:
            mem = blocks.static[rows, None] + blocks.stash[rows, None] * inflight[None, 1:]
            cost = np.where(mem <= capacity * (1 + 1e-12), cost, math.inf)
        r = cost.argmin(axis=0)
        D[i, 1:] = cost[r, np.arange(k)]
        choice[i, 1:] = np.where(np.isfinite(D[i, 1:]), rows[r], -1)
    q = k if exactly else int(np.argmin(D[0]))
    total = float(D[0, q])
    if not math.isfinite(total):
        return NO_CHAIN
    chain, longest = [0], 0.0
    while q > 0:
        row = int(choice[chain[-1], q])
        longest = max(longest, float(blocks.time[row]))
        chain.append(int(blocks.last[row]))
        q -= 1
    return StageChain(total, longest, chain)


def _least_sum(blocks: _Blocks, N: int, k: int, spec: TrainingSpec, M: float, capacity):
    """S(M) over every number of stages p <= k (interleaved: one DP per p with exactly p
    stages, since its in-flight count depends on p and the position; the others' on the
    position only)."""
    if spec.schedule != "interleaved" or spec.virtual_stages == 1:
        # spec.inflight(k)[k - q] is the count of the stage q-th from the end, for any p >= q
        inflight = np.concatenate([[0.0], spec.inflight(k)[::-1]])
        return _suffix_dp(blocks, N, k, M, inflight, capacity)
    best = NO_CHAIN
    for p in range(1, k + 1):
        inflight = np.concatenate([[0.0], spec.inflight(p)[::-1]])
        chain = _suffix_dp(blocks, N, p, M, inflight, capacity, exactly=True)
        if chain.total < best.total:
            best = chain
    return best


def _search(blocks, N: int, k: int, spec: TrainingSpec, capacity, deadline, sol) -> StageChain:
    """min over M of a * S(M) + b * M (module docstring, step 4); sets ``sol.lower`` for the
    plans made of priced blocks."""
    a, b = spec.time_weights
    Ms = np.unique(blocks.time)
    floor = _least_sum(blocks, N, k, spec, math.inf, capacity) if len(Ms) else NO_CHAIN
    if floor.ideals is None:
        sol.lower, sol.note = math.inf, "no plan fits the memory"
        return floor
    best = floor
    for idx in range(_first_feasible(blocks, N, k, spec, Ms, capacity), len(Ms)):
        M = float(Ms[idx])
        reach = a * floor.total + b * M  # no plan with largest stage time >= M does better
        if reach >= best.iteration_time(spec):
            sol.lower = best.iteration_time(spec)
            return best
        if time.perf_counter() > deadline:
            sol.lower, sol.note = reach, "time limit"
            return best
        chain = _least_sum(blocks, N, k, spec, M, capacity)
        sol.candidates += 1
        if chain.iteration_time(spec) < best.iteration_time(spec):
            best = chain
            sol.history.append(chain.iteration_time(spec))
    sol.lower = best.iteration_time(spec)
    return best


def _first_feasible(blocks, N: int, k: int, spec, Ms: np.ndarray, capacity) -> int:
    """Index of the least M in ``Ms`` with a feasible chain (bisection: feasibility only
    grows with M); the largest is feasible."""
    lo, hi = -1, len(Ms) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _least_sum(blocks, N, k, spec, float(Ms[mid]), capacity).ideals is None:
            lo = mid
        else:
            hi = mid
    return hi


def _assignment(ideals: np.ndarray, chain: list[int], n: int) -> np.ndarray:
    """Block of every coarse node for a chain of ideals (block b = chain[b+1] - chain[b])."""
    a = np.full(n, -1, dtype=np.int64)
    for b, (i, j) in enumerate(zip(chain[:-1], chain[1:], strict=True)):
        a[ideals[j] & ~ideals[i]] = b
    return a
