"""The spine relaxation: drop the nodes that keep a DAG from being a chain, keep what they
carried, and run the chain programs on what is left.

Encoder-decoders, U-Nets and branchy graphs have few separators: the decoder's first
self-attention runs beside the encoder, and every decoder layer's cross-attention key and value
projections read the encoder's output beside the decoder layers before them. The chain bounds
then see one long gap and price none of its io. Here a heaviest path P (by work) is the spine;
some of its positions are chosen to become separators (those spanned by the least work first,
within a budget of removed work), and a node off the spine with a chosen position strictly
between its last spine ancestor and its first spine descendant is removed. In what is left
every chosen spine node is comparable with every node: a separator.

The relaxed graph G' (proof in docs/bounds.md, "spine"):
- the kept nodes with their work, act and the parameters of kept users;
- an order edge u -> v between kept nodes wherever G has an order path from u to v (through
  removed nodes), so every plan of G restricted to the kept nodes is a plan of G';
- every tensor t produced by a kept node keeps its kept consumers and *gains* the kept
  consumers c at the end of a wide detour: a data path t -> r_1 -> ... -> c whose removed nodes
  r_i are owned by t (every tensor they read is t or produced by a node owned by t) and whose
  tensors are all at least as large as t. The encoder output's detours through each decoder
  layer's key and value projections become the cross-attention's own reads of it.

Every block of every plan of G costs at least as much as its kept part costs in G', so no
plan of G' beats the optimum of G; a bound proven for G' holds for G.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view, induced_subgraph
from solver.core.result import meets_target
from solver.pipeline.bounds.chain import chain_bound
from solver.pipeline.bounds.chain_io import Chain, bins_needed_io, largest_infeasible
from solver.pipeline.bounds.items import items


@dataclass(frozen=True)
class Spine:
    """The relaxed graph, the kept coarse nodes (G' node i is coarse node ``kept[i]``), the
    share of the work kept and the wide detours added as consumers."""

    graph: Graph
    kept: np.ndarray
    kept_work: float
    detours: int


def heaviest_path(g: Graph) -> np.ndarray:
    """The nodes of a path of largest total work along order edges, in order."""
    order = g.topo_order.tolist()
    ptr, idx = g.pred
    work = np.asarray(g.work, dtype=float)
    best = work.copy()
    back = np.full(g.n, -1, dtype=np.int64)
    for v in order:
        preds = idx[ptr[v] : ptr[v + 1]]
        if len(preds):
            u = int(preds[np.argmax(best[preds])])
            best[v] = work[v] + best[u]
            back[v] = u
    path = [int(np.argmax(best))] if g.n else []
    while path and back[path[-1]] >= 0:
        path.append(int(back[path[-1]]))
    return np.array(path[::-1], dtype=np.int64)


@dataclass(frozen=True)
class SpineSpans:
    """Per node: the last spine node that is an ancestor or itself (``lo``, -1: none) and the
    first that is a descendant or itself (``hi``, len(path): none); per spine position j: the
    work of the off-spine nodes with lo < j < hi (removed when p_j is made a separator)."""

    pos: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    span_work: np.ndarray


def spine_spans(g: Graph, path: np.ndarray) -> SpineSpans:
    """The spans of every node around the spine ``path``."""
    pos = np.full(g.n, -1, dtype=np.int64)
    pos[path] = np.arange(len(path))
    lo = np.full(g.n, -1, dtype=np.int64)
    hi = np.full(g.n, len(path), dtype=np.int64)
    pptr, pidx = g.pred
    sptr, sidx = g.succ
    order = g.topo_order.tolist()
    for v in order:
        preds = pidx[pptr[v] : pptr[v + 1]]
        lo[v] = pos[v] if pos[v] >= 0 else (int(lo[preds].max()) if len(preds) else -1)
    for v in reversed(order):
        succs = sidx[sptr[v] : sptr[v + 1]]
        hi[v] = pos[v] if pos[v] >= 0 else (int(hi[succs].min()) if len(succs) else len(path))
    off = (pos < 0) & (hi - lo > 1)
    diff = np.zeros(len(path) + 1)
    np.add.at(diff, lo[off] + 1, np.asarray(g.work, dtype=float)[off])
    np.add.at(diff, hi[off], -np.asarray(g.work, dtype=float)[off])
    return SpineSpans(pos, lo, hi, np.cumsum(diff)[: len(path)])


def kept_nodes(spans: SpineSpans, chosen: np.ndarray) -> np.ndarray:
    """Mask of the nodes kept when the spine positions ``chosen`` (a bool mask) are to be
    separators: every spine node, and every node with no chosen position strictly between
    its lo and hi."""
    before = np.concatenate([[0], np.cumsum(chosen)])  # chosen positions < j
    lo, hi = spans.lo, spans.hi
    between = before[np.maximum(hi, lo + 1)] - before[lo + 1]  # chosen in lo+1 .. hi-1
    return (spans.pos >= 0) | (between == 0)


def _kept_reach(g: Graph, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order edges (u, v) between kept nodes joined in G by an order path whose inner nodes
    are all removed (direct edges included)."""
    sptr, sidx = g.succ
    exits: dict[int, set[int]] = {}  # removed node -> kept nodes it reaches through removed
    for v in reversed(g.topo_order.tolist()):
        if keep[v]:
            continue
        out: set[int] = set()
        for w in sidx[sptr[v] : sptr[v + 1]].tolist():
            out.update((w,) if keep[w] else exits[w])
        exits[v] = out
    src, dst = [], []
    for u in np.flatnonzero(keep).tolist():
        reach: set[int] = set()
        for w in sidx[sptr[u] : sptr[u + 1]].tolist():
            reach.update((w,) if keep[w] else exits[w])
        src.extend([u] * len(reach))
        dst.extend(sorted(reach))
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


def owner_tensor(g: Graph, keep: np.ndarray) -> np.ndarray:
    """Per node: the one tensor of a kept producer every removed node's inputs come from
    (through removed nodes owned by it), or -1 (kept nodes, and removed nodes that read two
    such tensors or none)."""
    owner = np.full(g.n, -1, dtype=np.int64)
    reads = g.read_by
    for v in g.topo_order.tolist():
        if keep[v] or not reads[v]:
            continue
        roots = set()
        for t in reads[v]:
            p = int(g.t_producer[t])
            roots.add(t if keep[p] else int(owner[p]))
        if len(roots) == 1 and -1 not in roots:
            owner[v] = roots.pop()
    return owner


def wide_detours(g: Graph, keep: np.ndarray) -> dict[int, set[int]]:
    """Per tensor of a kept producer: the kept nodes it reaches by a wide detour (removed
    nodes owned by it, every tensor on the way at least as large as it), its own consumers
    left out."""
    owner = owner_tensor(g, keep)
    out: dict[int, set[int]] = {}
    for t in range(g.num_tensors):
        if not keep[g.t_producer[t]]:
            continue
        size, seen, found = g.t_size[t], set(), set()
        stack = [c for c in g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]].tolist() if not keep[c]]
        direct = set(g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]].tolist())
        while stack:
            r = stack.pop()
            if r in seen or owner[r] != t:
                continue
            seen.add(r)
            for t2 in g.produced_by[r]:
                if g.t_size[t2] < size:
                    continue
                for c in g.t_cons[g.t_ptr[t2] : g.t_ptr[t2 + 1]].tolist():
                    if keep[c]:
                        found.add(c)
                    else:
                        stack.append(c)
        found -= direct
        if found:
            out[t] = found
    return out


def spine_relaxation(g: Graph, keep: np.ndarray) -> Spine:
    """G' of the module docstring for ``g`` (a coarse graph: co-located nodes merged) with
    the nodes of ``keep`` (a mask from :func:`kept_nodes`)."""
    kept = np.flatnonzero(keep)
    new = np.full(g.n, -1, dtype=np.int64)
    new[kept] = np.arange(len(kept))
    es, ed = _kept_reach(g, keep)
    detours = wide_detours(g, keep)
    sub = induced_subgraph(g, kept)  # tensors of kept producers, in their order
    t_kept = np.flatnonzero(keep[g.t_producer])
    rows, cols = [], []
    for i, t in enumerate(t_kept.tolist()):
        cons = set(g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]].tolist()) | detours.get(t, set())
        members = sorted(new[c] for c in cons if keep[c])
        rows.extend([i] * len(members))
        cols.extend(members)
    t_ptr = np.zeros(len(t_kept) + 1, dtype=np.int64)  # rows come sorted, columns per row
    np.cumsum(np.bincount(np.array(rows, dtype=np.int64), minlength=len(t_kept)), out=t_ptr[1:])
    t_cons = np.array(cols, dtype=np.int64)
    relaxed = dataclasses.replace(
        sub, t_ptr=t_ptr, t_cons=t_cons, e_src=new[es], e_dst=new[ed], name=f"{g.name}[spine]"
    )
    work = float(np.asarray(g.work).sum())
    kept_work = float(np.asarray(g.work)[kept].sum()) / work if work > 0 else 1.0
    return Spine(relaxed, kept, kept_work, sum(len(x) for x in detours.values()))


def removed_scopes(g: Graph, spine: Spine, top: int = 3) -> list[str]:
    """What the relaxation could not price, for the user: the ``top`` module scopes (node
    names without their last part) whose removed nodes carry the most work, each with its
    share of the total work, heaviest first (ties by name; e.g. "/inner/decoder/embed_tokens
    4.9%")."""
    removed = np.ones(g.n, dtype=bool)
    removed[spine.kept] = False
    work = np.asarray(g.work, dtype=float)
    total = float(work.sum())
    scopes: dict[str, float] = {}
    for v in np.flatnonzero(removed).tolist():
        scope = g.names[v].rsplit("/", 1)[0] or g.names[v]
        scopes[scope] = scopes.get(scope, 0.0) + float(work[v])
    ranked = sorted(scopes.items(), key=lambda x: (-x[1], x[0]))[:top]
    return [f"{name} {100 * w / total:.1f}%" for name, w in ranked if total > 0 and w > 0]


MAX_SPINE_NODES = 3_000  # coarse nodes; one probe of the io chain program is not cut short by
# the clock, and on a 10,000-node layered DAG it takes 7 s (0.1-0.7 s on the 600-1,400-node
# encoder-decoders and U-Nets)
SPINE_REL_TOL = 1e-3  # the bisection's relative precision (a few probes; each is a DP)
FIRST_SHARE = 0.6  # the time of the first relaxation (the one removing most: it sees most
# separators); the others share the rest, and stop after one probe when they cannot help
TARGET_BAND = 5e-7  # the first probe: this much below a known plan's cost (within the
# optimality tolerance of solver.core.result.meets_target)
SPINE_BUDGETS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)  # the removed work allowed per relaxation, as a
# share of the total: each is a relaxation of its own, the bound takes the best


def spine_masks(g: Graph, budgets: tuple[float, ...] = SPINE_BUDGETS) -> list[np.ndarray]:
    """The kept-node masks to try, one per budget (share of the work removed, default
    SPINE_BUDGETS) that changes something: spine positions become separators in increasing
    order of their spanning work, as many as keep the removed work within the budget (it
    grows with every position added: bisection)."""
    path = heaviest_path(g)
    spans = spine_spans(g, path)
    work = np.asarray(g.work, dtype=float)
    total = float(work.sum())
    order = np.argsort(spans.span_work, kind="stable")

    def keep_first(count: int) -> np.ndarray:
        chosen = np.zeros(len(path), dtype=bool)
        chosen[order[:count]] = True
        return kept_nodes(spans, chosen)

    out: list[np.ndarray] = []
    for share in budgets:
        lo, hi = 0, len(path)  # keep_first(lo) fits the budget
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if float(work[~keep_first(mid)].sum()) <= share * total * (1 + 1e-12):
                lo = mid
            else:
                hi = mid - 1
        keep = keep_first(lo)
        if not any(np.array_equal(keep, x) for x in out):
            out.append(keep)
    return out


@dataclass(frozen=True)
class SpineBound:
    """The best chain bounds over the spine relaxations tried (0 where they prove nothing),
    and the relaxation that gave the larger one (None when none was tried)."""

    chain_io: float
    work_io_chain: float
    spine: Spine | None
    relaxations: int = 0


def spine_bound(
    g: Graph,
    cluster: Cluster,
    k: int,
    time_limit: float,
    target: float | None = None,
    floor: float = 0.0,
) -> SpineBound:
    """The io chains of :mod:`solver.pipeline.bounds.chain_io` on each spine relaxation of
    ``g``'s coarse view (:func:`spine_masks`, the one removing most first; each a bound of its
    G', hence of G). ``floor``, a bound known already: a relaxation that cannot prove more is
    left after one probe. The first relaxation gets FIRST_SHARE of the time, the others share
    the rest; the best of each kind is kept."""
    cg, _ = coarse_view(g)
    if cg.n > MAX_SPINE_NODES or cg.n < 2:
        return SpineBound(0.0, 0.0, None)
    deadline = time.perf_counter() + time_limit
    masks = [keep for keep in spine_masks(cg) if not keep.all()][::-1]
    best = SpineBound(0.0, 0.0, None, len(masks))
    for i, keep in enumerate(masks):
        left = deadline - time.perf_counter()
        if left <= 0:  # building a relaxation's chain is not cut short: start none late
            break
        seconds = left * FIRST_SHARE if i == 0 and len(masks) > 1 else left / (len(masks) - i)
        spine = spine_relaxation(cg, keep)
        known = max(floor, best.chain_io, best.work_io_chain)
        memory, work = _io_chains(spine.graph, cluster, k, seconds, target, known)
        if max(memory, work) > max(best.chain_io, best.work_io_chain):
            best = dataclasses.replace(best, spine=spine)
        best = dataclasses.replace(
            best, chain_io=max(best.chain_io, memory), work_io_chain=max(best.work_io_chain, work)
        )
        if meets_target(target, max(best.chain_io, best.work_io_chain)):
            break
    return best


@dataclass(frozen=True)
class _ChainKind:
    """One io chain's bins: ``scale * (T) + base`` is a bin's capacity at bottleneck T."""

    chain: Chain
    scale: float
    base: float
    top: float  # no bisection above this (every block's largest possible cost)


def _io_chains(
    rg: Graph, cluster: Cluster, k: int, seconds: float, target: float | None, floor: float
) -> tuple[float, float]:
    """The chain io (with memory, when memory binds at all) and work io chain bounds of G'
    ``rg``, half of ``seconds`` each; each 0 when it proves nothing above ``floor``."""
    it = items(rg)
    M, Bm, B = cluster.fast_memory, cluster.slow_memory_bandwidth, cluster.link_bandwidth
    kinds = {"work": _ChainKind(Chain(rg, it.work, np.zeros_like(it.work), B), 1.0, 0.0, 0.0)}
    if not math.isinf(M) and chain_bound(rg, it, cluster, k) > 0:
        memory = Chain(rg, Bm * it.work + it.charged, it.act, B)
        kinds["memory"] = _ChainKind(memory, Bm, M, 0.0)
    out = {"work": 0.0, "memory": 0.0}
    for name, kind in kinds.items():
        if not kind.chain.ok or kind.chain.m == 0:
            continue
        top = float(it.work.sum()) + sum(sec for outs in kind.chain.outs for _, sec in outs)
        if name == "memory":
            top += max(0.0, float(it.charged.sum() + it.act.max()) - M) / Bm
        kind = dataclasses.replace(kind, top=top)
        out[name] = _largest_proven(kind, k, seconds / len(kinds), target, floor)
    return out["memory"], out["work"]


def _largest_proven(
    kind: _ChainKind, k: int, seconds: float, target: float | None, floor: float
) -> float:
    """The largest T at which the chain needs more than k bins (0 when none above ``floor``
    is found): a probe at the floor, bisection between it and the target (and a probe just
    below the target when the bisection got near it; without a target: doubling steps from
    the floor and bisection,
    :func:`solver.pipeline.bounds.chain_io.largest_infeasible`), to SPINE_REL_TOL."""

    def infeasible(t: float) -> bool:
        return bins_needed_io(kind.chain, kind.scale * t + kind.base, k, kind.scale) > k

    if kind.top <= 0 or (floor > 0 and not infeasible(floor)):
        return 0.0
    lo = floor if floor > 0 else 0.0
    t_end = time.perf_counter() + seconds
    if target is not None and math.isfinite(target) and target > lo:
        # no T at or above a plan's cost is infeasible: bisect below it, and probe just
        # below it only when every probe was infeasible (the bound may then meet it)
        found = _bisect(infeasible, lo, target, t_end)
        near = target / (1 + TARGET_BAND)
        if found >= target * (1 - 2 * SPINE_REL_TOL) and near > found and infeasible(near):
            return near
        return found
    step = lo / 64 if lo > 0 else kind.top / k
    return largest_infeasible(infeasible, lo, step, kind.top, SPINE_REL_TOL, t_end)


def _bisect(infeasible, lo: float, hi: float, t_end: float) -> float:
    """The largest T proven infeasible between ``lo`` (proven, or 0) and ``hi`` (feasible
    or a plan's cost): bisection to SPINE_REL_TOL or the deadline."""
    while hi - lo > SPINE_REL_TOL * hi and time.perf_counter() < t_end:
        mid = 0.5 * (lo + hi)
        if infeasible(mid):
            lo = mid
        else:
            hi = mid
    return lo
