"""Bound 4, the forced chain with the io its cuts must pay.

Same chain as :mod:`solver.pipeline.bounds.chain` (separators in forced order, the segments between
them divisible), plus io: a tensor produced by a separator and consumed by a later separator
is received by the block of every consuming separator outside the producer's block and sent
by the producer's block if any of them is elsewhere, exactly as the evaluator counts it. For a
block covering separators g1..g2-1 of the chain this io is a function of (g1, g2) alone;
other tensors are left out (io >= 0), so the bin condition
``B_mem * (work + io) + charged + peak <= B_mem * T + M`` is still implied by f(S) <= T.

Io makes the greedy fill inexact (a shorter bin may cut a fatter tensor), so the decision is a
dynamic program over the gaps between separators: the state "i bins used, the last one ends in
gap g having taken x of that gap's divisible volume" is dominated by fewer bins, then by more
x (a bin taking only divisible volume turns (i, x) into (i + 1, x + cap)); so one state per
gap suffices and the program is exact for the relaxation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline.bounds.gap_io import (
    MAX_GAP_NODES,
    Windows,
    gap_graph,
    interior_cut,
    interior_windows,
    io_density,
)
from solver.pipeline.bounds.items import Items
from solver.pipeline.dp.separators import separators


class Chain:
    """Separators in order, the divisible volume of each gap, and separator-to-separator
    tensors (size in seconds of link time). ``refine``: also each gap's interior cut and io
    density (:mod:`solver.pipeline.bounds.gap_io`; otherwise the interior cut is the gap cut
    and the density 0, which claims nothing more)."""

    def __init__(self, g: Graph, size: np.ndarray, act: np.ndarray, B: float, refine: bool = True):
        cg, _ = coarse_view(g)
        sep = separators(cg)
        self.ok = sep is not None
        if not self.ok:
            return
        rank = cg.topo_rank
        s_nodes = np.flatnonzero(sep)
        s_nodes = s_nodes[np.argsort(rank[s_nodes])]
        m = len(s_nodes)
        gap = np.searchsorted(rank[s_nodes], rank)
        self.m = m
        self.fluid = np.bincount(gap[~sep], weights=size[~sep], minlength=m + 1).tolist()
        self.size = size[s_nodes].tolist()
        self.act = act[s_nodes].tolist()
        pos = np.full(cg.n, -1, dtype=np.int64)
        pos[s_nodes] = np.arange(m)
        # per separator j: its input tensors from earlier separators (tensor id, producer pos,
        # io seconds); per tensor produced by a separator: the last consuming separator
        self.ins: list[list[tuple[int, int, float]]] = [[] for _ in range(m)]
        self.outs: list[list[tuple[int, float]]] = [[] for _ in range(m)]
        self.ends: list[list[tuple[int, float]]] = [[] for _ in range(m)]  # by last consumer
        for t in range(cg.num_tensors):
            p = int(pos[cg.t_producer[t]])
            if p < 0:
                continue
            cons = pos[cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]]]
            cons = cons[cons > p]
            if len(cons) == 0:
                continue
            sec = float(cg.t_size[t]) / B
            for c in cons.tolist():
                self.ins[c].append((t, p, sec))
            last = int(cons.max())
            self.outs[p].append((last, sec))
            self.ends[last].append((p, sec))
        refined = gap_cuts(cg, sep, gap, pos, size if refine else None)
        self.cut = refined.cut / B
        # a boundary strictly inside gap g pays at least cut_in[g] (>= cut[g]); a bin holding
        # only gap-g nodes pays at least density[g] link seconds per unit of its volume
        self.cut_in = np.maximum(refined.interior / B, self.cut)
        self.density = refined.density / B
        self.sums, self.small = gap_subset_sums(size, gap, sep, m)
        # volume windows (add_windows): one class per row; class 0 is the interior cut
        self.win_at, self.win_cut = np.zeros((1, m + 1)), self.cut_in.reshape(1, -1)
        self._source = _ChainSource(cg, sep, gap, pos, size, B) if refine else None
        self._arrays()

    def window_lift(self) -> float:
        """The most a window charges above the interior cut (link seconds)."""
        extra = np.zeros_like(self.win_cut)
        # a gap no boundary can cross has an infinite cut in every class: no window there
        windowed = np.isfinite(self.win_at) & np.isfinite(self.win_cut)
        base = np.broadcast_to(self.cut_in, self.win_cut.shape)
        extra[windowed] = self.win_cut[windowed] - base[windowed]
        return float(extra.max())

    def add_windows(self, deadline: float) -> bool:
        """Each gap's volume windows (:func:`gap_io.interior_windows`), the largest gaps
        first, until ``deadline``; True when some gap got one. Once per chain."""
        src, self._source = self._source, None
        if src is None:
            return False
        found = window_table(src, self.fluid, self.cut_in, deadline)
        if found.at.shape[0] == 1:
            return False
        self.win_at, self.win_cut = found.at, found.cut
        return True

    def _arrays(self) -> None:
        """The chain as arrays for the vectorised bin profiles (:func:`bin_profile_arrays`):
        per separator tensor its producer, last consumer and seconds; per (tensor, later
        separator consumer) pair; every gap's subset sums in one sorted
        array of keys ``gap + sum / sums_scale``; and the reach of each gap, filled lazily."""
        m = self.m
        self.size_a, self.act_a = np.array(self.size), np.array(self.act)
        self.fluid_a, self.small_a = np.array(self.fluid), np.array(self.small)
        self.cut_a, self.cut_in_a, self.density_a = self.cut, self.cut_in, self.density
        self.t_prod = np.array([p for p in range(m) for _ in self.outs[p]], dtype=np.int64)
        self.t_last = np.array([c for p in range(m) for c, _ in self.outs[p]], dtype=np.int64)
        self.t_sec = np.array([x for p in range(m) for _, x in self.outs[p]], dtype=float)
        # (tensor, later separator consumer) pairs, listed by consumer: the first pair of a
        # tensor at or after a gap is its first consumer there
        self.p_cons = np.array([c for c in range(m) for _ in self.ins[c]], dtype=np.int64)
        self.p_tensor = np.array([t for c in range(m) for t, _, _ in self.ins[c]], np.int64)
        self.p_prod = np.array([p for c in range(m) for _, p, _ in self.ins[c]], np.int64)
        self.p_sec = np.array([x for c in range(m) for _, _, x in self.ins[c]], dtype=float)
        self.sums_top = np.array([float(x[-1]) for x in self.sums])
        self.sums_scale = 2.0 * float(self.sums_top.max()) or 1.0  # keys in [gap, gap + 1/2]
        self.sums_flat = np.concatenate(self.sums)
        gaps = np.repeat(np.arange(m + 1), [len(x) for x in self.sums])
        self.sums_keys = gaps + self.sums_flat / self.sums_scale
        self.key_slack = 8.0 * (m + 1) * np.finfo(float).eps  # a few ulps of the largest key
        self.reach: dict[int, Reach] = {}


INF = 1 << 60
EXACT_ITEMS = 12  # the largest nodes of a gap kept whole (2^12 subset sums); the rest divisible


def gap_subset_sums(
    size: np.ndarray, gap: np.ndarray, sep: np.ndarray, m: int
) -> tuple[list[np.ndarray], list[float]]:
    """Per gap: the sorted subset sums of its largest nodes, and the total of the others.

    A bin that ends inside a gap holds a subset of the gap's nodes; its volume is at most
    ``max{s in sums : s <= room} + small`` (the small nodes treated as divisible), which is
    never below what a real plan can put there, so the program stays a relaxation.
    """
    members: list[list[int]] = [[] for _ in range(m + 1)]
    for v in np.flatnonzero(~sep).tolist():
        members[int(gap[v])].append(v)
    sums, small = [], []
    for mem in members:
        vals = np.sort(size[mem])[::-1] if mem else np.zeros(0)
        big, rest = vals[:EXACT_ITEMS], vals[EXACT_ITEMS:]
        s = np.zeros(1)
        for x in big:
            s = np.concatenate([s, s + x])
        sums.append(np.unique(s))
        small.append(float(rest.sum()))
    return sums, small


@dataclass(frozen=True)
class GapCuts:
    """Per gap (m + 1 entries, bytes): the least cut, the least interior cut (inf: no boundary
    can fall strictly inside the gap) and the io density (bytes per unit of size)."""

    cut: np.ndarray
    interior: np.ndarray
    density: np.ndarray


def gap_cuts(
    cg: Graph, sep: np.ndarray, gap: np.ndarray, pos: np.ndarray, size: np.ndarray | None = None
) -> GapCuts:
    """For each gap g between separators s_{g-1} and s_g (0 < g < m), the fewest bytes a
    plan sends across it when s_{g-1} and s_g are in different blocks: a minimum cut of the
    gap's own subgraph with s_{g-1} on the left, s_g on the right, the left side closed under
    predecessors, each tensor counted once. Only tensors produced by s_{g-1} or a gap node,
    consumed inside the gap or by s_g, and not counted by the chain io (produced by a
    separator with a later separator consumer) take part. Bytes are rounded down.
    With ``size`` (the chain's volume per node) also each gap's interior cut and io density
    (:mod:`solver.pipeline.bounds.gap_io`; without, the interior cut is the cut and the
    density 0)."""
    from ortools.graph.python import max_flow

    m = int(sep.sum())
    cuts, density = np.zeros(m + 1), np.zeros(m + 1)
    members: list[list[int]] = [[] for _ in range(m + 1)]
    for v in np.flatnonzero(~sep).tolist():
        members[int(gap[v])].append(v)
    s_nodes = np.empty(m, dtype=np.int64)
    s_nodes[pos[sep]] = np.flatnonzero(sep)
    interior = np.full(m + 1, -1.0)
    for g in range(m + 1):
        if size is not None and 0 < len(members[g]) <= MAX_GAP_NODES:
            density[g] = io_density(cg, members[g], size)
        if not 0 < g < m or not members[g]:
            continue
        gg = gap_graph(cg, members[g], int(s_nodes[g - 1]), int(s_nodes[g]), pos, g)
        f = max_flow.SimpleMaxFlow()
        nxt = len(gg.local)
        for p, cons, bytes_ in gg.tensors:
            f.add_arc_with_capacity(p, nxt, bytes_)
            for c in cons:
                f.add_arc_with_capacity(nxt, c, INF)
            nxt += 1
        for b, a in gg.order:
            f.add_arc_with_capacity(b, a, INF)  # b left => a left
        if f.solve(0, len(gg.local) - 1) == f.OPTIMAL:
            cuts[g] = float(f.optimal_flow())
        if size is not None and len(gg.local) <= MAX_GAP_NODES:
            interior[g] = interior_cut(gg, size)
    return GapCuts(cuts, np.maximum(interior, cuts), density)


@dataclass(frozen=True)
class _ChainSource:
    """What :meth:`Chain.add_windows` needs of the graph the chain was built from."""

    cg: Graph
    sep: np.ndarray
    gap: np.ndarray
    pos: np.ndarray
    size: np.ndarray
    bandwidth: float


@dataclass(frozen=True)
class WindowTable:
    """Per class j (rows) and gap (columns): a boundary strictly inside the gap whose left
    side holds more than ``at[j]`` of volume pays at least ``cut[j]`` link seconds. Row 0 is
    the interior cut (``at`` 0); a gap with fewer windows has ``at`` inf in the rows left."""

    at: np.ndarray
    cut: np.ndarray


def window_table(src: _ChainSource, fluid: list[float], cut_in: np.ndarray, deadline: float):
    """The volume windows of the interior gaps with three or more nodes (largest volume
    first, until ``deadline``) as a :class:`WindowTable`."""
    cg, m = src.cg, len(fluid) - 1
    members: list[list[int]] = [[] for _ in range(m + 1)]
    for v in np.flatnonzero(~src.sep).tolist():
        members[int(src.gap[v])].append(v)
    s_nodes = np.empty(m, dtype=np.int64)
    s_nodes[src.pos[src.sep]] = np.flatnonzero(src.sep)
    found: dict[int, Windows] = {}
    for g in sorted(range(1, m), key=lambda g: -fluid[g]):
        if time.perf_counter() > deadline:
            break
        if not 3 <= len(members[g]) <= MAX_GAP_NODES or not math.isfinite(cut_in[g]):
            continue
        gg = gap_graph(cg, members[g], int(s_nodes[g - 1]), int(s_nodes[g]), src.pos, g)
        win = interior_windows(gg, src.size, float(cut_in[g]) * src.bandwidth)
        if win.at:
            found[g] = win
    rows = 1 + max((len(w.at) for w in found.values()), default=0)
    at, cut = np.full((rows, m + 1), math.inf), np.tile(cut_in, (rows, 1))
    at[0] = 0.0
    for g, win in found.items():
        at[1 : 1 + len(win.at), g] = win.at
        cut[1 : 1 + len(win.at), g] = np.maximum(np.array(win.cut) / src.bandwidth, cut_in[g])
    return WindowTable(at, cut)


@dataclass(frozen=True)
class Reach:
    """The bins starting in one gap g, per gap g2 = g + 1, g + 2, ... they can end in (index
    g2 - g - 1), with nothing of gap g taken yet: ``load_peak`` = the separators' and whole
    gaps' volume plus the largest peak (non-decreasing), ``io`` = io_in + io_out + the cut out
    of gap g2 (link seconds; io_in with the cut into gap g), ``extra`` = what s_{g-1}'s
    block sends them (link seconds), and ``limit``: the arrays stop at the first load_peak
    above it (inf: they run to the end)."""

    load_peak: np.ndarray
    io: np.ndarray
    extra: np.ndarray
    limit: float
    core: np.ndarray  # io without the cut into gap g and the cut out of gap g2


@dataclass(frozen=True)
class Profile:
    """Where a bin can end (the gaps ``ends``) and the volume of each it can still take:
    ``room`` with its inputs over the fast link, ``room_cross`` when what s_{g-1}'s block
    sends it comes over the slow one (NaN: it cannot end there then)."""

    ends: np.ndarray
    room: np.ndarray
    room_cross: np.ndarray


def _reach(ch: Chain, g: int, limit: float) -> Reach:
    """:class:`Reach` of gap g, vectorised: prefix sums for the volume, a running maximum for
    the peak, and per tensor the bin end from which it is received (its first separator
    consumer at or after s_g, when its producer is before s_g) or no longer sent (its last
    separator consumer, when its producer is in the bin)."""
    m = ch.m
    n = m - g  # ends g + 1 .. m
    vol = np.cumsum(ch.size_a[g:m])
    vol[1:] += np.cumsum(ch.fluid_a[g + 1 : m])
    load_peak = vol + np.maximum.accumulate(ch.act_a[g:m])
    stop = int(np.searchsorted(load_peak, limit, side="right")) + 1
    if stop < n:
        n, load_peak = stop, load_peak[:stop]
    own = ch.t_prod >= g  # produced in the bin: sent while a consumer is past its end
    sent = np.bincount(ch.t_prod[own] - g, ch.t_sec[own], minlength=m - g)
    sent -= np.bincount(ch.t_last[own] - g, ch.t_sec[own], minlength=m - g)
    io_out = np.maximum(np.cumsum(sent[:n]), 0.0)
    live = (ch.p_prod < g) & (ch.p_cons >= g)  # pairs sorted by consumer: the first is the least
    _, first = np.unique(ch.p_tensor[live], return_index=True)
    cons, sec, prod = ch.p_cons[live][first], ch.p_sec[live][first], ch.p_prod[live][first]
    head = ch.cut_a[g] if g > 0 else 0.0
    core = np.cumsum(np.bincount(cons - g, sec, minlength=m - g)[:n]) + io_out
    back = prod == g - 1  # produced by s_{g-1}: sent by the block just before
    extra = head + np.cumsum(np.bincount(cons[back] - g, sec[back], minlength=m - g)[:n])
    io = head + core + ch.cut_a[g + 1 : g + 1 + n]
    return Reach(load_peak, io, extra, limit if n < m - g else math.inf, core)


def _reach_of(ch: Chain, g: int, rest: float, cap: float) -> Reach:
    """The reach of gap g, computed once per chain (and again only for a larger capacity)."""
    reach = ch.reach.get(g)
    if reach is None or cap - rest > reach.limit:
        reach = _reach(ch, g, 2.0 * cap)
        ch.reach[g] = reach
    return reach


def bin_profile_arrays(
    ch: Chain, g: int, rest: float, cap: float, Bm: float, extra_rate: float = 0.0
) -> Profile:
    """A bin starting in gap g with ``rest`` of that gap's volume, at capacity ``cap``: the
    gaps it can end in and the volume of each it can still take (:class:`Profile`). The
    reach of gap g is computed once per chain (and again only for a larger capacity)."""
    reach = _reach_of(ch, g, rest, cap)
    stop = int(np.searchsorted(reach.load_peak, cap - rest, side="right"))
    base = cap - rest - reach.load_peak[:stop] - Bm * reach.io[:stop]
    ok = np.flatnonzero(base >= 0)
    ends, base = ok + g + 1, base[ok]
    room = _rooms(ch, ends, base)
    extra = extra_rate * reach.extra[ok]
    if extra_rate == 0:
        return Profile(ends, room, room)
    crossed = base - Bm * extra
    cross = np.where(crossed >= 0, _rooms(ch, ends, np.maximum(crossed, 0.0)), np.nan)
    return Profile(ends, room, np.where(extra == 0, room, cross))


def bin_profile(
    ch: Chain, g: int, rest: float, cap: float, Bm: float, extra_rate: float = 0.0
) -> list:
    """:func:`bin_profile_arrays` as ``(g2, y, y_cross)`` per gap g2 it can end in
    (``y_cross`` None when it cannot end there with its input over the slow link)."""
    p = bin_profile_arrays(ch, g, rest, cap, Bm, extra_rate)
    return [
        (g2, y, None if math.isnan(yc) else yc)
        for g2, y, yc in zip(p.ends.tolist(), p.room.tolist(), p.room_cross.tolist(), strict=True)
    ]


def _rooms(ch: Chain, ends: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The volume of each gap g2 in ``ends`` a bin with ``y`` left can take: whole nodes of
    the gap (the largest subset sum of its items at most y, plus its small part), at most the
    gap's fluid part. One search over every gap's sums at once, keyed ``g2 + sum / scale``
    (each gap's keys in [g2, g2 + 1/2]); the key is searched a few ulps high, so the sum found
    is never below the exact one (at most ~1e-12 of the largest sum above it, which only
    gives the bin more room: the program stays a relaxation)."""
    if len(ends) == 0:
        return y
    top = ch.sums_top[ends]
    q = ends + np.minimum(y, top) / ch.sums_scale
    q += ch.key_slack
    pick = ch.sums_flat[np.searchsorted(ch.sums_keys, q, side="right") - 1]
    return np.minimum(np.minimum(y, pick + ch.small_a[ends]), ch.fluid_a[ends])


@dataclass(frozen=True)
class Ends:
    """Where a bin can end (the gaps ``ends``) and the most volume it can take of each, per
    window class j (``taken[j]``; -1 when it can take none in that class): class 0 with the
    interior cut when that volume is strictly inside the gap (or the whole gap with the gap
    cut), class j > 0 with the j-th window's cut, more than its volume. It can always end
    taking nothing (the gap cut)."""

    ends: np.ndarray
    taken: np.ndarray


WINDOW_GAIN = 1e-3  # windows that cannot meet the target must lift the chain by this fraction
WINDOW_SLACK = 1e-9  # a class's volume cap is raised by this fraction: rounding never tightens


def bin_ends(ch: Chain, g: int, rest: float, cap: float, Bm: float, head: float) -> Ends:
    """A bin starting in gap g with ``rest`` of that gap's volume and ``head`` link seconds
    received across its cut into gap g, at capacity ``cap``: the gaps it can end in and how
    much of each it can take in each window class (:class:`Ends`)."""
    reach = _reach_of(ch, g, rest, cap)
    stop = int(np.searchsorted(reach.load_peak, cap - rest, side="right"))
    free = cap - rest - reach.load_peak[:stop] - Bm * (head + reach.core[:stop])
    ends = np.arange(g + 1, g + 1 + stop)
    base_lo = free - Bm * ch.cut_a[ends]
    ok = np.flatnonzero(base_lo >= 0)
    ends, base_lo, free = ends[ok], base_lo[ok], free[ok]
    fluid = ch.fluid_a[ends]
    whole = np.where(_rooms(ch, ends, base_lo) >= fluid, fluid, -1.0)
    base_in = free - Bm * ch.cut_in_a[ends]
    inner = np.flatnonzero(base_in >= 0)
    rows = ch.win_at.shape[0]
    if rows > 1:  # the interior cut's class ends where the first window starts
        top = ch.win_at[1, ends[inner]] * (1 + WINDOW_SLACK)
        whole[inner] = np.maximum(
            whole[inner], np.minimum(_rooms(ch, ends[inner], base_in[inner]), top)
        )
    else:
        whole[inner] = np.maximum(whole[inner], _rooms(ch, ends[inner], base_in[inner]))
    if rows == 1:
        return Ends(ends, whole[None, :])
    taken = np.full((rows, len(ends)), -1.0)
    taken[0] = whole
    for j in range(1, rows):
        taken[j] = _window_takes(ch, ends, free - Bm * ch.win_cut[j, ends], j)
    return Ends(ends, taken)


def _window_takes(ch: Chain, ends: np.ndarray, base: np.ndarray, j: int) -> np.ndarray:
    """The most volume of each gap in ``ends`` a bin with ``base`` left after its window-j cut
    can take with its left side in window j: more than the window's volume, at most the next
    window's (raised by WINDOW_SLACK: rounding never tightens); -1 where none."""
    at = ch.win_at[j, ends]
    top = ch.win_at[j + 1, ends] * (1 + WINDOW_SLACK) if j + 1 < ch.win_at.shape[0] else None
    out = np.full(len(ends), -1.0)
    inner = np.flatnonzero((base >= 0) & (at < ch.fluid_a[ends]))
    x = _rooms(ch, ends[inner], base[inner])
    if top is not None:
        x = np.minimum(x, top[inner])
    out[inner] = np.where(x > at[inner], x, -1.0)
    return out


def _states(ch: Chain, g: int, cols: np.ndarray, zero: float, per_bin: float) -> list:
    """The states of gap g worth expanding, as (bins, window class, volume of gap g taken):
    the bins that took some of it (``cols[j, i]``: the most with i bins in class j, -1: none)
    that no state with no more bins and no higher class matches after gap-only bins of
    ``per_bin`` each, and the fewest bins ``zero`` that took none of it (their successor pays
    the gap cut, not the interior one) unless a state with no more bins took it all (or is of
    class 0 and the interior cut is no dearer)."""
    fluid = ch.fluid[g]
    kept: list[tuple[int, int, float]] = []
    if cols.shape[0] == 1:
        pairs = [(i, 0) for i in np.flatnonzero(cols[0] >= 0).tolist()]
    else:
        bins, classes = np.nonzero(cols.T >= 0)  # by bins, then class
        pairs = list(zip(bins.tolist(), classes.tolist(), strict=True))
    for i, j in pairs:
        x = float(cols[j, i])
        if zero < i and min(fluid, (i - zero) * per_bin) >= x:
            continue
        if any(j1 <= j and min(fluid, x1 + (i - i1) * per_bin) >= x for i1, j1, x1 in kept):
            continue
        kept.append((i, j, x))
    same = ch.cut_in[g] <= ch.cut[g]
    took_all = any(i1 <= zero and ((same and j1 == 0) or x1 >= fluid) for i1, j1, x1 in kept)
    if math.isfinite(zero) and not took_all:
        kept.append((int(zero), 0, 0.0))
    return kept


def bins_needed_io(ch: Chain, cap: float, k: int, Bm: float) -> int:
    """Fewest bins of capacity ``cap`` (bytes-equivalent) covering the chain, io included;
    k + 1 when more than k are needed. A bin holding only gap-g volume takes at most
    ``cap / (1 + Bm * density[g])`` of it (its io is at least the density times its volume);
    a bin that ends strictly inside gap g pays its interior cut (or the cut of the volume
    window its left side exceeds), and so does the bin after such a boundary (docs/bounds.md,
    "interior cuts and io density", "volume windows")."""
    if cap <= 0:
        return 0  # no claim at a zero capacity (the bound starts above it)
    m = ch.m
    front = np.full((ch.win_at.shape[0], k + 1, m + 1), -1.0)  # [class, bins, gap]: most taken
    zero = np.full(m + 1, math.inf)  # fewest bins ending at a gap, taking none of it
    zero[0] = 0
    finish = math.inf
    for g in range(m + 1):
        per_bin = cap / (1.0 + Bm * float(ch.density_a[g]))
        for i, j, x in _states(ch, g, front[:, :, g], float(zero[g]), per_bin):
            if i >= min(k + 1, finish):
                continue
            rest0 = ch.fluid[g] - x
            # bins holding only gap g's divisible volume may come first: r of them
            r_max = math.ceil(rest0 / per_bin - 1e-12) if rest0 > 0 else 0  # rounded to fit
            if g == m:
                finish = min(finish, i + r_max)
                continue
            for r in range(r_max + 1):
                if i + r >= min(k, finish):
                    break
                rest = max(0.0, rest0 - r * per_bin)
                interior = 0 < rest < ch.fluid[g]
                head = 0.0 if g == 0 else float(ch.win_cut[j, g] if interior else ch.cut[g])
                e = bin_ends(ch, g, rest, cap, Bm, head)
                zero[e.ends] = np.minimum(zero[e.ends], i + r + 1)
                for row, taken in zip(front[:, i + r + 1], e.taken, strict=True):
                    row[e.ends] = np.maximum(row[e.ends], np.where(taken > 0, taken, -1.0))
    return int(finish) if finish <= k else k + 1


def chain_io_bound(
    g: Graph,
    it: Items,
    cluster: Cluster,
    k: int,
    lo: float = 0.0,
    time_limit: float = 5.0,
    memory: bool = True,
    rel_tol: float = 1e-6,
    target: float | None = None,
    floor: float = 0.0,
    windows: bool = True,
    plain_proven: bool = False,
) -> float:
    """Largest T proven by the chain with io. ``memory``: bins hold
    ``B_mem * (work + io) + charged + peak <= B_mem * T + M``; otherwise ``work + io <= T``
    (both follow from f(S) <= T). ``lo`` must be 0 or a T proven infeasible for a weaker
    relaxation (the io-free chain bound of the same kind). ``target``, the cost of a known
    plan: one probe just below it first (within ``rel_tol / 2``), and when that is proven
    the search ends there (the bound meets the plan; nothing above it can be proven).
    While the bound is below the target (or there is none) the gaps' volume windows are
    added and the search goes on from it (each of the two with ``time_limit``), unless they
    cannot lift it above ``floor``, a bound proven by another relaxation (they raise it by
    at most twice the largest window's extra cut: docs/bounds.md, "volume windows"), or
    cannot meet the target and do not lift it by WINDOW_GAIN (one probe). ``windows``
    False: the plain program alone. ``plain_proven``: ``lo`` is what the plain program
    itself proved (an earlier call with ``windows`` False), so only the windows' search runs."""
    M, Bm, B = cluster.fast_memory, cluster.slow_memory_bandwidth, cluster.link_bandwidth
    if memory and math.isinf(M):
        return lo
    if memory:
        ch = Chain(g, Bm * it.work + it.charged, it.act, B)
        scale, base = Bm, M
    else:
        ch = Chain(g, it.work, np.zeros_like(it.work), B)
        scale, base = 1.0, 0.0
    if not ch.ok or ch.m == 0:
        return lo
    t_top = float(it.work.sum()) + float(sum(sec for outs in ch.outs for _, sec in outs))
    if memory:
        t_top += max(0.0, float(it.charged.sum() + it.act.max()) - M) / Bm
    if t_top <= 0:
        return lo

    def infeasible(t: float) -> bool:
        return bins_needed_io(ch, scale * t + base, k, scale) > k

    search = _ChainSearch(infeasible, t_top, k, target, rel_tol, time_limit)
    value = lo if plain_proven else search.largest(lo)
    if not windows or search.meets(value):
        return value
    if not ch.add_windows(time.perf_counter() + time_limit):
        return value
    lift = 2.0 * ch.window_lift()  # the most the windows can add (docs/bounds.md)
    if value + lift <= floor:
        return value  # they cannot lift this chain above a bound known already
    if not search.meets(value + lift):  # do they lift it by WINDOW_GAIN? (one probe)
        if lift < WINDOW_GAIN * value or not infeasible(value * (1 + WINDOW_GAIN)):
            return value
        value *= 1 + WINDOW_GAIN
    # the volume windows only add io: every T proven so far stays proven
    return search.largest(value)


@dataclass(frozen=True)
class _ChainSearch:
    """The search for the largest T a chain program proves infeasible."""

    infeasible: object  # T -> bool
    t_top: float
    k: int
    target: float | None
    rel_tol: float
    seconds: float  # for the steps and the bisection, after the first probes

    def meets(self, value: float) -> bool:
        """Whether ``value`` meets the target (nothing above it can be proven)."""
        return self.target is not None and value * (1 + self.rel_tol) >= self.target

    def largest(self, lo: float) -> float:
        """The largest T proven infeasible, from ``lo`` (0 or proven by a weaker relaxation):
        one probe just below the target first, when there is one."""
        infeasible, target = self.infeasible, self.target
        if lo > 0 and not infeasible(lo):
            return lo  # feasible already at lo: larger T only adds room
        if target is not None and math.isfinite(target) and target > lo:
            near = target / (1 + self.rel_tol / 2)
            if near > lo and infeasible(near):
                return near
        step = lo / 64 if lo > 0 else self.t_top / self.k  # io adds little to a proven lo
        t_end = time.perf_counter() + self.seconds
        return largest_infeasible(infeasible, lo, step, self.t_top, self.rel_tol, t_end)


def largest_infeasible(infeasible, lo: float, step: float, t_top: float, rel_tol, t_end) -> float:
    """The largest T proven infeasible, from ``lo`` (infeasible or 0): steps doubling from
    ``lo + step`` until a feasible T (or 4 * t_top, or the deadline), then bisection to
    ``rel_tol``. Every value returned was proven infeasible, so it is a valid bound."""
    hi = lo + step
    while infeasible(hi):
        lo, step = hi, 2 * step
        hi = lo + step
        if hi > 4 * t_top or time.perf_counter() > t_end:
            return lo
    while hi - lo > rel_tol * hi and hi > 1e-9 * t_top and time.perf_counter() < t_end:
        mid = 0.5 * (lo + hi)
        if infeasible(mid):
            lo = mid
        else:
            hi = mid
    return lo
