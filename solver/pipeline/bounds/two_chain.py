"""Encoder-decoders as two chains: a certified bound and a plan from the exact two-chain DP.

The spine relaxation (:mod:`solver.pipeline.bounds.spine`) keeps one heaviest path and removes
what lies beside it; on an encoder-decoder that is the decoder's embedding and first
self-attention (beside the whole encoder) and the cross-attention key and value projections
(beside the decoder layers before them). The first is what its bound misses (docs/bounds.md,
"two chain"). Here the side branch beside the spine's start is kept: the graph is split into
A, the ancestors of the spine node just before the branch joins it (the encoder), and B, the
rest (the decoder with its prefix); only the nodes of B that keep B from being a chain (those
spanning chosen spine positions after the join, the projections) are removed, as the spine
relaxation removes them (order edges kept, wide detours charged). The exact DP of
:mod:`solver.pipeline.dp.two_chain` on that relaxed graph proves its bound: every value
reported is a T at which no plan of G' has k blocks each of work and io at most T, so no plan
of G has (docs/bounds.md). The same DP on the *pinned* graph (the removed nodes merged into the
node they feed, :func:`solver.pipeline.bounds.spine_plan.pinned_labels`) gives a real plan,
priced by the evaluator and never reported as a bound.

It applies when the side branch carries at least MIN_SIDE_SHARE of the work (an
encoder-decoder's decoder prefix); on chains and graphs without such a branch it returns at
once (a heaviest path and its spans).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.graph import Graph, coarse_view, contract
from solver.core.result import meets_target
from solver.pipeline.bounds.spine import (
    MAX_SPINE_NODES,
    SPINE_REL_TOL,
    TARGET_BAND,
    Spine,
    SpineSpans,
    heaviest_path,
    kept_nodes,
    owner_tensor,
    spine_relaxation,
    spine_spans,
)
from solver.pipeline.bounds.spine_plan import pinned_labels
from solver.pipeline.dp.two_chain import (
    CreditGroup,
    TwoChains,
    TwoChainUnsupported,
    assignment_of,
    chain_bottleneck,
    fewest_blocks,
    sorted_partial,
    two_chains,
)

NEAR_STEPS = 2  # probes just below a feasible chain's bottleneck in a row before a midpoint
PLAN_FIRST_GAP = 0.005  # the plan's first probe: this far above the proven bound (a plan found
# there is within it of the optimum; probing down from a loose plan's cost takes a probe per
# small step, and one probe of a 1,200-node encoder-decoder takes seconds)
MIN_SIDE_SHARE = 0.01  # the side branch's least share of the work (else: not two chains)
TWO_CHAIN_BUDGETS = (0.1, 0.2, 0.3)  # the work removed from B (share of the total), tried
# in this order while time is left: the least removed first (the tightest relaxation; when B
# then keeps a gap of too many ideals the DP declines at once and the next one is tried)


@dataclass(frozen=True)
class TwoChainSplit:
    """The coarse graph, the spine's spans, the side branch (``side``: nodes with no spine
    ancestor whose first spine descendant is ``join``), A (``in_a``: the ancestors of the
    spine node before ``join``, itself included) and the kept-node masks of the relaxations
    to try (``keeps``: :func:`relaxed_keeps`). Computed once per solve: the bound and the plan
    both read it."""

    graph: Graph
    spans: SpineSpans
    side: np.ndarray
    join: int
    in_a: np.ndarray
    keeps: tuple[np.ndarray, ...] = ()


def two_chain_case(g: Graph, cluster: Cluster, k: int) -> TwoChainSplit | None:
    """The split of ``g``'s coarse view (:func:`two_chain_split`), or None where the two-chain
    DP does not apply: a cluster whose devices or links differ, fewer than two blocks, or no
    side branch."""
    if not cluster.homogeneous or k < 2:
        return None
    return two_chain_split(coarse_view(g)[0])


def two_chain_split(cg: Graph) -> TwoChainSplit | None:
    """The split of a coarse graph into two chains, with its relaxations' kept-node masks, or
    None when it has no side branch beside the start of its heaviest path carrying
    MIN_SIDE_SHARE of the work."""
    if cg.n < 4 or cg.n > MAX_SPINE_NODES:
        return None
    path = heaviest_path(cg)
    spans = spine_spans(cg, path)
    work = np.asarray(cg.work, dtype=float)
    beside = (spans.pos < 0) & (spans.lo < 0) & (spans.hi < len(path))
    if not beside.any():
        return None
    joins = np.bincount(spans.hi[beside], weights=work[beside], minlength=len(path))
    join = int(np.argmax(joins))
    if join < 1 or joins[join] < MIN_SIDE_SHARE * float(work.sum()):
        return None
    in_a = ((spans.pos >= 0) & (spans.pos < join)) | ((spans.pos < 0) & (spans.hi < join))
    split = TwoChainSplit(cg, spans, beside & (spans.hi == join), join, in_a)
    return dataclasses.replace(split, keeps=tuple(relaxed_keeps(split)))


def relaxed_keep(split: TwoChainSplit, budget: float) -> np.ndarray:
    """The kept nodes when spine positions after the join become separators (those spanned by
    the least work first) while the removed work stays within ``budget`` of the total."""
    spans, work = split.spans, np.asarray(split.graph.work, dtype=float)
    order = np.argsort(spans.span_work, kind="stable")
    order = order[order >= split.join]
    chosen = np.zeros(len(spans.span_work), dtype=bool)
    lo, hi = 0, len(order)
    while lo < hi:  # the removed work grows with every position: bisection on the count
        mid = (lo + hi + 1) // 2
        chosen[:] = False
        chosen[order[:mid]] = True
        removed = float(work[~kept_nodes(spans, chosen)].sum())
        lo, hi = (mid, hi) if removed <= budget * float(work.sum()) * (1 + 1e-12) else (lo, mid - 1)
    chosen[:] = False
    chosen[order[:lo]] = True
    return kept_nodes(spans, chosen)


def relaxed_keeps(split: TwoChainSplit) -> list[np.ndarray]:
    """The distinct kept sets of TWO_CHAIN_BUDGETS, in its order."""
    out: list[np.ndarray] = []
    for budget in TWO_CHAIN_BUDGETS:
        keep = relaxed_keep(split, budget)
        if not any(np.array_equal(keep, x) for x in out):
            out.append(keep)
    return out


@dataclass(frozen=True)
class TwoChainBound:
    """The largest T proven infeasible on a two-chain relaxation (0: none above the floor),
    the relaxation that proved it, and why it did not run (empty when it did)."""

    value: float
    spine: Spine | None
    skipped: str = ""


def two_chain_bound(
    split: TwoChainSplit,
    cluster: Cluster,
    k: int,
    time_limit: float,
    target: float | None = None,
    floor: float = 0.0,
) -> TwoChainBound:
    """The two-chain bound of the graph ``split`` splits (:func:`two_chain_case`) on ``k``
    blocks of ``cluster`` (homogeneous; its work and io, overflow left out): per relaxation
    (TWO_CHAIN_BUDGETS), a probe at ``floor`` (a bound known already: a relaxation that fits
    there proves nothing more), then probes from just below ``target`` (a plan's cost) down,
    to SPINE_REL_TOL (:func:`_descend`)."""
    deadline = time.perf_counter() + time_limit
    cg = split.graph
    best, why = TwoChainBound(0.0, None), ""
    for keep in split.keeps:
        if time.perf_counter() > deadline:
            break
        spine = spine_relaxation(cg, keep)
        in_a = split.in_a[spine.kept]
        credits = private_credits(cg, keep, in_a, cluster.link_bandwidth)
        try:
            tc = two_chains(spine.graph, in_a, cluster.link_bandwidth, deadline, credits)
        except TwoChainUnsupported as e:
            why = str(e)
            continue
        value = _largest_infeasible(tc, k, max(floor, best.value), target, deadline)
        if value > best.value:
            best = TwoChainBound(value, spine)
        if meets_target(target, best.value):
            break
    return best if best.spine is not None or not why else TwoChainBound(0.0, None, why)


def private_credits(
    cg: Graph, keep: np.ndarray, in_a: np.ndarray, bandwidth: float
) -> tuple[CreditGroup, ...]:
    """The credit groups of the relaxation of ``cg`` keeping ``keep`` (``in_a``: A on the
    kept nodes): per tensor t and kept reader c on B, the work of the removed nodes
    *private* to c from t (each reads only t or their own, every tensor it produces is at
    least as large as t and read only by c or by them), at most t's link time; a reader
    with a removed node that feeds only it but breaks one of these rules gets none."""
    new = np.full(cg.n, -1, dtype=np.int64)
    new[keep] = np.arange(int(keep.sum()))
    owner = owner_tensor(cg, keep)
    private = _private_reader(cg, keep)
    work: dict[tuple[int, int], float] = {}
    broken: set[int] = set()
    for r in np.flatnonzero(~keep & (private >= 0)).tolist():
        c, t = int(private[r]), int(owner[r])
        if t < 0 or not _private_link(cg, r, t, private, owner):
            broken.add(c)
            continue
        work[(t, c)] = work.get((t, c), 0.0) + float(cg.work[r])
    t_new = np.full(cg.num_tensors, -1, dtype=np.int64)
    t_new[keep[cg.t_producer]] = np.arange(int(keep[cg.t_producer].sum()))
    groups: dict[int, list[tuple[int, float]]] = {}
    for (t, c), w in sorted(work.items()):
        if c in broken or in_a[new[c]]:
            continue
        groups.setdefault(t, []).append((int(new[c]), min(w, float(cg.t_size[t]) / bandwidth)))
    return tuple(
        CreditGroup(int(t_new[t]), np.array([c for c, _ in v]), np.array([w for _, w in v]))
        for t, v in groups.items()
    )


def _private_reader(cg: Graph, keep: np.ndarray) -> np.ndarray:
    """Per removed node: the one kept node every tensor it produces leads to through removed
    nodes (-1: none or several; kept nodes: -1)."""
    out = np.full(cg.n, -1, dtype=np.int64)
    for v in reversed(cg.topo_order.tolist()):
        if keep[v]:
            continue
        ends = set()
        for t in cg.produced_by[v]:
            for c in cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]].tolist():
                ends.add(c if keep[c] else int(out[c]))
        if len(ends) == 1 and -1 not in ends:
            out[v] = ends.pop()
    return out


def _private_link(cg: Graph, r: int, t: int, private: np.ndarray, owner: np.ndarray) -> bool:
    """Whether removed node r, owned by t and private to a reader, reads only t or tensors of
    nodes private to the same reader and owned by t, and produces only tensors as large as t."""
    for u in cg.produced_by[r]:
        if cg.t_size[u] < cg.t_size[t]:
            return False
    for u in cg.read_by[r]:
        p = int(cg.t_producer[u])
        if u != t and (private[p] != private[r] or owner[p] != t):
            return False
    return True


def _largest_infeasible(
    tc: TwoChains, k: int, floor: float, target: float | None, deadline: float
) -> float:
    """The largest T found at which the DP has no plan (0 when none above ``floor``): a probe
    at the floor, then :func:`_descend` from the target (or from one block's cost)."""
    srt = sorted_partial(tc)
    if floor > 0 and fewest_blocks(tc, srt, floor, k) is not None:
        return 0.0
    hi = target if target is not None and math.isfinite(target) else _top(tc)
    return _descend(tc, srt, k, (floor, hi), deadline, lambda chain: None)


def _descend(tc: TwoChains, srt, k: int, between: tuple[float, float], deadline: float, seen):
    """Probes between a proven-infeasible T and a feasible one (``between``), first just below
    the feasible end: a feasible probe's chain lowers that end to its own bottleneck (and is
    shown to ``seen``) and the next probe is just below it again, unless NEAR_STEPS such
    probes in a row each closed less than a quarter of the interval (then the midpoint); an
    infeasible probe raises the other end. Stops within SPINE_REL_TOL, just below a feasible
    T (within the optimality band), or at the deadline; returns the infeasible end."""
    lo, hi = between
    near, small = True, 0
    while hi - lo > SPINE_REL_TOL * hi and time.perf_counter() < deadline:
        t = hi / (1 + TARGET_BAND) if near else 0.5 * (lo + hi)
        chain = fewest_blocks(tc, srt, t, k)
        if chain is None:
            lo = t
            if near:
                break  # just below a feasible T: within the band of the optimum
            continue
        seen(chain)
        new_hi = min(t, chain_bottleneck(tc, chain))
        small = small + 1 if near and hi - new_hi < 0.25 * (hi - lo) else 0
        near, hi = small < NEAR_STEPS, new_hi
        small %= NEAR_STEPS
    return lo


def _top(tc: TwoChains) -> float:
    """A T at which one block holds everything (no io): always feasible."""
    return float(tc.a_ids.work[-1] + tc.b_ids.work[-1]) * (1 + 1e-6) + 1e-30


@dataclass(frozen=True)
class TwoChainPlan:
    """A valid plan of the graph (``assignment`` on its original nodes) and its objective."""

    value: float
    assignment: np.ndarray


def two_chain_plan(
    g: Graph,
    split: TwoChainSplit,
    cluster: Cluster,
    k: int,
    time_limit: float,
    between: tuple[float, float] = (0.0, math.inf),
) -> TwoChainPlan | None:
    """The best plan of ``g`` (``split``: its :func:`two_chain_case`) below a known plan's
    cost of the DP on the pinned graphs (one per budget of TWO_CHAIN_BUDGETS, the removed
    nodes merged into the node they feed), found within ``time_limit``: probes on T between
    a proven bound and that cost (``between``, :func:`_descend`), each feasible T's plan
    priced by the evaluator."""
    deadline = time.perf_counter() + time_limit
    cg, labels = coarse_view(g)
    lower, upper = between
    best: TwoChainPlan | None = None
    for keep in split.keeps:
        if time.perf_counter() > deadline:
            break
        pin = pinned_labels(cg, keep)
        pinned = contract(cg, pin)
        in_a = np.zeros(pinned.n, dtype=bool)
        in_a[pin[split.in_a]] = True
        try:
            tc = two_chains(pinned, in_a, cluster.link_bandwidth, deadline)
        except TwoChainUnsupported:
            continue
        bar = upper if best is None else min(upper, best.value)
        found = _least_feasible(g, cluster, k, tc, pin[labels], (lower, bar), deadline)
        if found is not None and (best is None or found.value < best.value):
            best = found
    return best


def _least_feasible(
    g: Graph,
    cluster: Cluster,
    k: int,
    tc: TwoChains,
    to_pinned: np.ndarray,
    between: tuple[float, float],
    deadline: float,
) -> TwoChainPlan | None:
    """Probes of the pinned graph (``to_pinned``: each original node's pinned node) between a
    proven bound and a known plan's cost (``between``), each chain found priced on ``g``; the
    best one below that cost. The first just below the cost (a chain found there often has a
    much lower bottleneck), the second PLAN_FIRST_GAP above the bound (when the bound is
    tight, that chain is the answer; both run even past the deadline: the tables cost about
    as much as two probes, and cpsat's search gets what is left of the time limit), then
    :func:`_descend` between what they showed."""
    srt = sorted_partial(tc)
    lower, upper = between
    best: list[TwoChainPlan] = []

    def seen(chain: list[tuple[int, int]]) -> None:
        a = assignment_of(tc, chain, tc.a_nodes.size + tc.b_nodes.size)[to_pinned]
        if validate(g, cluster, a, k):
            return
        value = float(evaluate(g, cluster, a, k).objective)
        if value < (best[-1].value if best else upper):
            best.append(TwoChainPlan(value, a))

    top = upper if math.isfinite(upper) else _top(tc)
    for t in (top / (1 + TARGET_BAND), lower * (1 + PLAN_FIRST_GAP)):
        if not lower < t < top:
            continue
        chain = fewest_blocks(tc, srt, t, k)
        if chain is None:
            lower = t  # no plan of the pinned graph there: the search goes on above it
        else:
            seen(chain)
            top = min(t, chain_bottleneck(tc, chain))
    _descend(tc, srt, k, (lower, top), deadline, seen)
    return best[-1] if best else None
