"""The exact DP over the ideals of two chains joined by cross edges (encoder-decoders).

A graph whose nodes split into a down-set A (the encoder side: every edge between A and the rest
B goes from A to B) where A and B are each cut by their own separators into small gaps has as
ideals exactly the pairs (I_A, I_B) of an ideal of A and an ideal of B whose A-predecessors
(``need``) I_A holds (proof in docs/bounds.md, "two chain"). B-ideals that need only part of A
(the decoder's embedding and first self-attention beside the encoder) pair with many A-ideals;
the others need all of A (they read its last node) and pair with it alone: about
n_A x n_B0 + n_B ideals, not millions.

The cost of a block J minus I is its work plus every tensor it receives and sends (no overflow:
a work-and-io relaxation of f when memory would bind, exact when it does not). It splits into an
A part, a B part and the tensors A sends to B (``cross``); when no B-ideal that needs only part
of A holds a reader of a cross tensor (checked, else the DP does not apply), the cross part
depends only on (I_A, J_A) and, in the row J_A = A, on J_B. "Is there a plan of at most k blocks
each <= T?" is then a fewest-blocks DP row by row over the A-ideals: each finished row pushes
its best counts to the rows above it through a prefix minimum over its B-ideals sorted by their
B cost (a search per pushed entry), and each row closes with a chain DP over its B-ideals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph, induced_subgraph
from solver.pipeline.dp.chain_ideals import ChainIdeals, ChainIdealsDoNotApply

MAX_CHAIN_IDEALS = 2_500  # ideals of one chain (the pair tables are squares of it)
MAX_PAIR_STATES = 3_000_000  # (A-ideal, B-ideal) pairs held by the DP's tables
EPS = 1e-9  # relative slack on float comparisons of block costs with T


class TwoChainUnsupported(Exception):
    """The graph is not two chains the DP can enumerate (the message says why)."""


@dataclass(frozen=True)
class IdealRows:
    """Every ideal of one chain as rows, in the order of
    :class:`solver.pipeline.dp.chain_ideals.ChainIdeals` (a subset comes before its
    supersets): row r's members (``member[r]``, a bool row over the chain's nodes), its work;
    row 0 is empty and the last row holds every node."""

    member: np.ndarray
    work: np.ndarray

    @property
    def count(self) -> int:
        return len(self.work)


def ideal_rows(g: Graph, bandwidth: float, deadline: float) -> IdealRows:
    """The ideals of ``g`` (a graph its separators cut into gaps of few down-closed subsets),
    enumerated by :class:`solver.pipeline.dp.chain_ideals.ChainIdeals` (the DP over one
    chain's ideals), as rows."""
    try:
        ids = ChainIdeals(g, Cluster("two chain", 1, link_bandwidth=bandwidth), deadline)
    except ChainIdealsDoNotApply as e:
        raise TwoChainUnsupported(str(e)) from None
    if ids.count > MAX_CHAIN_IDEALS:
        raise TwoChainUnsupported(f"a chain with more than {MAX_CHAIN_IDEALS:,} ideals")
    member = np.array([ids.assignment([0, r]) == 0 for r in range(ids.count)], dtype=bool)
    return IdealRows(member.reshape(ids.count, g.n), ids.prefix(np.asarray(g.work, float)))


@dataclass(frozen=True)
class TensorSide:
    """Per ideal of one chain and per tensor: whether the ideal holds the producer (``inside``)
    and how many of its consumers on this chain it holds (``held``); per tensor its seconds on
    the link (``seconds``) and its consumers on this chain (``total``)."""

    inside: np.ndarray
    held: np.ndarray
    seconds: np.ndarray
    total: np.ndarray


def _tensor_side(
    g: Graph, ids: IdealRows, nodes: np.ndarray, tensors: np.ndarray, bandwidth: float
) -> TensorSide:
    """The :class:`TensorSide` of ``tensors`` on the chain whose graph nodes are ``nodes``
    (ideal columns are positions in ``nodes``)."""
    pos = np.full(g.n, -1, dtype=np.int64)
    pos[nodes] = np.arange(len(nodes))
    count = ids.count
    inside = np.zeros((count, len(tensors)), dtype=bool)
    held = np.zeros((count, len(tensors)), dtype=np.int64)
    total = np.zeros(len(tensors), dtype=np.int64)
    for i, t in enumerate(tensors.tolist()):
        p = pos[g.t_producer[t]]
        if p >= 0:
            inside[:, i] = ids.member[:, p]
        cons = pos[g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]]
        cons = cons[cons >= 0]
        total[i] = len(cons)
        if len(cons):
            held[:, i] = ids.member[:, cons].sum(axis=1)
    return TensorSide(inside, held, np.asarray(g.t_size, dtype=float)[tensors] / bandwidth, total)


def _subsets(member: np.ndarray) -> np.ndarray:
    """sub[i, j]: ideal i is a subset of ideal j."""
    packed = np.packbits(member, axis=1)
    out = np.ones((len(member), len(member)), dtype=bool)
    for w in range(packed.shape[1]):
        col = packed[:, w]
        out &= (col[:, None] & ~col[None, :]) == 0
    return out


def _chain_costs(ids: IdealRows, own: TensorSide, sub: np.ndarray, deadline: float) -> np.ndarray:
    """f(J minus I) for every pair I subset of J of one chain (inf elsewhere), over the
    tensors produced and consumed on it: work, a tensor received when its producer is in I and
    a consumer in J minus I, sent when its producer is in J minus I and a consumer outside J."""
    count = ids.count
    out = np.full((count, count), np.inf)
    for j in range(count):
        if j % 64 == 0 and time.perf_counter() > deadline:
            raise TwoChainUnsupported("time limit while pricing blocks")
        rows = np.flatnonzero(sub[:, j])
        recv = own.inside[rows] & (own.held[j][None, :] > own.held[rows])
        send = own.inside[j][None, :] & ~own.inside[rows] & (own.held[j] < own.total)[None, :]
        io = (recv | send).astype(float) @ own.seconds
        out[rows, j] = ids.work[j] - ids.work[rows] + io
    return out


@dataclass(frozen=True)
class TwoChains:
    """What the DP reads, on the graph's nodes ``a_nodes`` (the down-set A) and ``b_nodes``:
    each chain's ideals; ``f_a[i, j]`` the A part of a block A-ideal j minus i with the cross
    tensors it receives and sends while B holds none of their readers (rows below the whole
    of A); ``f_b[i, j]`` the B part; ``enter[i, j]``: the A part and the cross tensors of a
    block from A-ideal i to the whole of A and to B-ideal j (from a B-ideal that needs part of
    A); ``after[i, j]``: a block of B alone in the row of the whole of A (cross tensors
    received); ``valid[i, j]``: A-ideal i holds what B-ideal j needs; ``partial``: the
    B-ideals that pair with an A-ideal other than A."""

    a_nodes: np.ndarray
    b_nodes: np.ndarray
    a_ids: IdealRows
    b_ids: IdealRows
    f_a: np.ndarray
    f_b: np.ndarray
    enter: np.ndarray
    after: np.ndarray
    valid: np.ndarray
    partial: np.ndarray
    sub_a: np.ndarray


@dataclass(frozen=True)
class CreditGroup:
    """Readers on B of one tensor (``tensor``), each credited ``credit`` seconds: the work of
    the nodes a relaxation removed that feed only it from that tensor, at most the tensor's
    link time (docs/bounds.md, "two chain": a block holding a reader pays that work or
    receives a tensor as large instead)."""

    tensor: int
    readers: np.ndarray
    credit: np.ndarray


def two_chains(
    g: Graph,
    in_a: np.ndarray,
    bandwidth: float,
    deadline: float,
    credits: tuple[CreditGroup, ...] = (),
) -> TwoChains:
    """The tables of the DP for ``g`` split into A (``in_a``, a down-set) and the rest B, with
    the ``credits`` of a relaxation added to the blocks holding their readers. Raises
    :class:`TwoChainUnsupported` when A is not a down-set, a tensor is read by a node that is
    not after it in order, a chain has too many ideals, or a B-ideal that needs only part of
    A holds a reader of a tensor of A."""
    _check_split(g, in_a)
    a_nodes, b_nodes = np.flatnonzero(in_a), np.flatnonzero(~in_a)
    a_ids = ideal_rows(induced_subgraph(g, a_nodes), bandwidth, deadline)
    b_ids = ideal_rows(induced_subgraph(g, b_nodes), bandwidth, deadline)
    if a_ids.count * b_ids.count > MAX_PAIR_STATES:
        raise TwoChainUnsupported(f"more than {MAX_PAIR_STATES:,} pairs of ideals")
    kinds = _tensor_kinds(g, in_a)
    sub_a, sub_b = _subsets(a_ids.member), _subsets(b_ids.member)
    need = _needs(g, in_a, a_nodes, b_nodes, b_ids)
    valid = ((need.astype(np.float32) @ (~a_ids.member).T.astype(np.float32)) == 0).T
    partial = valid[:-1].any(axis=0)
    xa = _tensor_side(g, a_ids, a_nodes, kinds.cross, bandwidth)
    xb = _tensor_side(g, b_ids, b_nodes, kinds.cross, bandwidth)
    if (xb.held[partial] > 0).any():
        raise TwoChainUnsupported("a B-ideal beside A holds a reader of a tensor of A")
    f_a = _chain_costs(
        a_ids, _tensor_side(g, a_ids, a_nodes, kinds.own_a, bandwidth), sub_a, deadline
    )
    f_b = _chain_costs(
        b_ids, _tensor_side(g, b_ids, b_nodes, kinds.own_b, bandwidth), sub_b, deadline
    )
    for group in credits:
        if not in_a[g.t_producer[group.tensor]]:
            f_b += _credited_within_b(g, group, b_nodes, b_ids, bandwidth)
    enter = _cross_enter(xa, xb, f_a[:, -1])
    after = f_b + _cross_after(xb, sub_b)
    for group in credits:
        if in_a[g.t_producer[group.tensor]]:
            credited = _credited(g, group, (a_nodes, a_ids), (b_nodes, b_ids), bandwidth)
            enter += credited.enter
            after += credited.after
    return TwoChains(
        a_nodes, b_nodes, a_ids, b_ids, f_a + _cross_below(xa, sub_a), f_b, enter, after,
        valid, partial, sub_a,
    )  # fmt: skip


@dataclass(frozen=True)
class _TensorKinds:
    """The tensors with readers, by side: produced and read on A alone, produced on B, and
    produced on A and read on B (``cross``)."""

    own_a: np.ndarray
    own_b: np.ndarray
    cross: np.ndarray


def _tensor_kinds(g: Graph, in_a: np.ndarray) -> _TensorKinds:
    has_cons = np.diff(g.t_ptr) > 0
    prod_a = in_a[g.t_producer]
    read_b = np.zeros(g.num_tensors, dtype=bool)
    tensor_of = np.repeat(np.arange(g.num_tensors), np.diff(g.t_ptr))
    np.logical_or.at(read_b, tensor_of, ~in_a[g.t_cons])
    return _TensorKinds(
        np.flatnonzero(has_cons & prod_a & ~read_b),
        np.flatnonzero(has_cons & ~prod_a),
        np.flatnonzero(prod_a & read_b),
    )


@dataclass(frozen=True)
class _Credited:
    """A credit group's seconds added to ``enter`` and ``after``."""

    enter: np.ndarray
    after: np.ndarray


def _credited(g: Graph, group: CreditGroup, a_side: tuple, b_side: tuple, bandwidth: float):
    """The credit of ``group`` per block: the readers' credits when the tensor's producer is
    in the block or another reader of it is (the block pays the tensor or a receive of its own
    besides them); else their sum, at most the tensor's link time per reader beyond the
    first (the block may receive, per reader, a tensor as large as it instead)."""
    (a_nodes, a_ids), (b_nodes, b_ids) = a_side, b_side
    t = group.tensor
    seconds = float(g.t_size[t]) / bandwidth
    cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
    others = np.setdiff1d(cons, group.readers)
    b_pos = np.searchsorted(b_nodes, group.readers)
    if not np.array_equal(b_nodes[b_pos], group.readers):
        raise TwoChainUnsupported("a credited reader is not on B")
    held = b_ids.member[:, b_pos].sum(axis=1)  # per B-ideal
    credit = b_ids.member[:, b_pos].astype(float) @ group.credit
    other_b = np.isin(b_nodes, others)
    other_a = np.isin(a_nodes, others)
    seen_b = b_ids.member[:, other_b].sum(axis=1)
    seen_a = a_ids.member[:, other_a].sum(axis=1)
    producer = a_ids.member[:, int(np.searchsorted(a_nodes, g.t_producer[t]))]
    d_held = held[None, :] - held[:, None]
    d_credit = credit[None, :] - credit[:, None]
    capped = np.minimum(d_credit, np.maximum(d_held - 1, 0) * seconds)
    after = np.where(seen_b[None, :] > seen_b[:, None], d_credit, capped)
    capped_enter = np.minimum(credit, np.maximum(held - 1, 0) * seconds)[None, :]
    other_in = (seen_a[-1] > seen_a)[:, None] | (seen_b > 0)[None, :]
    enter = np.where(~producer[:, None] | other_in, credit[None, :], capped_enter)
    return _Credited(enter, np.maximum(after, 0.0))


def _check_split(g: Graph, in_a: np.ndarray) -> None:
    """A must be a down-set and every tensor's readers after its producer in order."""
    if in_a.all() or not in_a.any():
        raise TwoChainUnsupported("one side is empty")
    if (~in_a[g.e_src] & in_a[g.e_dst]).any():
        raise TwoChainUnsupported("an edge goes from B into A")
    order_edges = set((g.e_src * g.n + g.e_dst).tolist())
    du, dv = g.data_edges
    cross = du != dv
    if not all(x in order_edges for x in (du[cross] * g.n + dv[cross]).tolist()):
        raise TwoChainUnsupported("a data edge is not an order edge")


def _needs(
    g: Graph, in_a: np.ndarray, a_nodes: np.ndarray, b_nodes: np.ndarray, b_ids: IdealRows
) -> np.ndarray:
    """Per B-ideal, the A nodes (columns: positions in ``a_nodes``) its members are joined to
    by an edge (their ancestors follow: A-ideals are down-closed)."""
    pos_a = np.full(g.n, -1, dtype=np.int64)
    pos_a[a_nodes] = np.arange(len(a_nodes))
    pos_b = np.full(g.n, -1, dtype=np.int64)
    pos_b[b_nodes] = np.arange(len(b_nodes))
    edge = np.zeros((len(b_nodes), len(a_nodes)), dtype=bool)
    cut = in_a[g.e_src] & ~in_a[g.e_dst]
    edge[pos_b[g.e_dst[cut]], pos_a[g.e_src[cut]]] = True
    return (b_ids.member.astype(np.float32) @ edge.astype(np.float32)) > 0


def _credited_within_b(
    g: Graph, group: CreditGroup, b_nodes: np.ndarray, b_ids: IdealRows, bandwidth: float
) -> np.ndarray:
    """The credit of ``group`` (a tensor produced on B) per pair of B-ideals, by the rule of
    :func:`_credited`: the readers' credits when the producer or another reader is in the
    block, else capped at the tensor's link time per reader beyond the first."""
    t = group.tensor
    seconds = float(g.t_size[t]) / bandwidth
    others = np.setdiff1d(g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]], group.readers)
    b_pos = np.searchsorted(b_nodes, group.readers)
    if not np.array_equal(b_nodes[b_pos], group.readers):
        raise TwoChainUnsupported("a credited reader is not on B")
    held = b_ids.member[:, b_pos].sum(axis=1)
    credit = b_ids.member[:, b_pos].astype(float) @ group.credit
    seen = b_ids.member[:, np.isin(b_nodes, others)].sum(axis=1)
    producer = b_ids.member[:, int(np.searchsorted(b_nodes, g.t_producer[t]))]
    d_held = held[None, :] - held[:, None]
    d_credit = credit[None, :] - credit[:, None]
    capped = np.minimum(d_credit, np.maximum(d_held - 1, 0) * seconds)
    full = (producer[None, :] & ~producer[:, None]) | (seen[None, :] > seen[:, None])
    return np.maximum(np.where(full, d_credit, capped), 0.0)


def _cross_below(xa: TensorSide, sub_a: np.ndarray) -> np.ndarray:
    """The cross tensors of a block A-ideal i -> j below the whole of A (B holds none of their
    readers): received when produced in i and read in j minus i, sent when produced in j
    minus i (its readers on B are outside)."""
    count = len(sub_a)
    out = np.zeros((count, count))
    for j in range(count):
        rows = np.flatnonzero(sub_a[:, j])
        recv = xa.inside[rows] & (xa.held[j][None, :] > xa.held[rows])
        send = xa.inside[j][None, :] & ~xa.inside[rows]
        out[rows, j] = (recv | send).astype(float) @ xa.seconds
    return out


def _cross_enter(xa: TensorSide, xb: TensorSide, to_full: np.ndarray) -> np.ndarray:
    """enter[i, j]: the A part (``to_full``, A-ideal i -> A) and the cross tensors of a block
    from (i, a B-ideal holding no reader) to (A, B-ideal j)."""
    read_b = xb.held > 0  # (B-ideals, tensors)
    unread_b = xb.held < xb.total
    out = np.empty((len(to_full), len(read_b)))
    for i in range(len(to_full)):
        recv = xa.inside[i] & ((xa.held[-1] > xa.held[i]) | read_b)  # read in the block
        send = ~xa.inside[i] & unread_b  # produced in the block, read after it
        out[i] = to_full[i] + (recv | send).astype(float) @ xa.seconds
    return out


def _cross_after(xb: TensorSide, sub_b: np.ndarray) -> np.ndarray:
    """The cross tensors a block of B alone (B-ideal i -> j, all of A before it) receives."""
    count = len(sub_b)
    out = np.zeros((count, count))
    for j in range(count):
        rows = np.flatnonzero(sub_b[:, j])
        recv = xb.held[j][None, :] > xb.held[rows]
        out[rows, j] = recv.astype(float) @ xb.seconds
    return out


@dataclass(frozen=True)
class SortedPartial:
    """The B-ideals beside A (``part``) and, per one of them j (row), those that are subsets
    of it sorted by f_b[i, j] (``idx``: positions in ``part``, -1 pads; ``cost``, inf pads),
    with ``keys`` for one search over all rows at once (row + cost / scale)."""

    part: np.ndarray
    idx: np.ndarray
    cost: np.ndarray
    keys: np.ndarray
    scale: float


def sorted_partial(tc: TwoChains) -> SortedPartial:
    part = np.flatnonzero(tc.partial)
    costs = tc.f_b[np.ix_(part, part)]  # inf where not a subset
    order = np.argsort(costs, axis=0, kind="stable").T  # (row j, rank)
    cost = np.take_along_axis(costs.T, order, axis=1)
    idx = np.where(np.isfinite(cost), order, -1)
    scale = 2.0 * float(cost[np.isfinite(cost)].max(initial=0.0)) + 1.0
    keys = np.arange(len(part))[:, None] + np.where(np.isfinite(cost), cost / scale, 0.75)
    return SortedPartial(part, idx, cost, keys.ravel(), scale)


@dataclass
class _Table:
    """Fewest blocks to reach each pair (A-ideal, B-ideal) and the pair it came from."""

    best: np.ndarray
    from_a: np.ndarray
    from_b: np.ndarray


def fewest_blocks(
    tc: TwoChains, srt: SortedPartial, t: float, k: int
) -> list[tuple[int, int]] | None:
    """The pairs of ideals of a plan with at most k blocks each of cost <= t (from the empty
    pair to the whole graph), or None when there is none. Rows below the whole of A hold the
    B-ideals beside A; each is closed by blocks of B alone, then pushes its counts to the
    later rows; the last row pulls from all of them, then is closed."""
    na, nb = tc.a_ids.count, tc.b_ids.count
    lim = t * (1 + EPS)
    tab = _Table(
        np.full((na, nb), k + 1, dtype=np.int64),
        np.full((na, nb), -1, dtype=np.int64),
        np.full((na, nb), -1, dtype=np.int64),
    )
    tab.best[0, 0] = 0
    part = srt.part
    beside = tc.f_b[np.ix_(part, part)] <= lim
    for a in range(na - 1):
        tab.best[a, part[~tc.valid[a, part]]] = k + 1
        if (tab.best[a, part] > k).all():
            continue
        _close_row(tab, a, part, beside, k)
        _push_row(tc, srt, tab, a, lim, k)
    _pull_last(tc, srt, tab, lim, k)
    _close_row(tab, na - 1, np.arange(nb), tc.after <= lim, k)
    if tab.best[na - 1, nb - 1] > k:
        return None
    chain = [(na - 1, nb - 1)]
    while chain[-1] != (0, 0):
        i, j = chain[-1]
        chain.append((int(tab.from_a[i, j]), int(tab.from_b[i, j])))
    return chain[::-1]


def _close_row(tab: _Table, a: int, cols: np.ndarray, fits: np.ndarray, k: int) -> None:
    """Blocks of B alone within row a (``fits[i, j]``: B-ideal cols[i] -> cols[j] fits):
    rounds of relaxation until nothing changes (at most k)."""
    row = tab.best[a, cols]
    edge = np.triu(fits, 1)
    for _ in range(k):
        via = np.where(edge, row[:, None] + 1, k + 1)
        arg = via.argmin(axis=0)
        new = via[arg, np.arange(len(cols))]
        better = new < row
        if not better.any():
            break
        row = np.where(better, new, row)
        tab.from_a[a, cols[better]] = a
        tab.from_b[a, cols[better]] = cols[arg[better]]
    tab.best[a, cols] = row


def _push_row(tc: TwoChains, srt: SortedPartial, tab: _Table, a: int, lim: float, k: int):
    """Row a is final: its counts reach the later rows below the whole of A through blocks
    A-ideal a -> a2 plus B-ideal i -> j beside A, the cheapest B parts first (a prefix minimum
    over the B-ideals sorted by their B cost, one search per entry)."""
    na = tc.a_ids.count
    later = np.flatnonzero(tc.sub_a[a] & (tc.f_a[a] <= lim))
    later = later[(later > a) & (later < na - 1)]
    if len(later) == 0:
        return
    width, part = srt.idx.shape[1], srt.part
    vals = np.where(srt.idx >= 0, tab.best[a, part][np.maximum(srt.idx, 0)], k + 1)
    code = np.minimum.accumulate(vals * width + np.arange(width)[None, :], axis=1).ravel()
    cols = np.arange(len(part))
    room = lim - tc.f_a[a, later][:, None]
    q = cols[None, :] + np.clip(room / srt.scale, -0.5, 0.6)
    pos = np.searchsorted(srt.keys, q.ravel(), side="right").reshape(q.shape) - 1
    pos -= cols[None, :] * width
    c = code[cols[None, :] * width + np.maximum(pos, 0)]
    count = np.where(pos >= 0, c // width + 1, k + 2)
    came = srt.idx[cols[None, :], c % width]
    cur = tab.best[np.ix_(later, part)]
    r, j = np.nonzero((count < cur) & (count <= k))
    tab.best[later[r], part[j]] = count[r, j]
    tab.from_a[later[r], part[j]] = a
    tab.from_b[later[r], part[j]] = part[came[r, j]]


def _pull_last(tc: TwoChains, srt: SortedPartial, tab: _Table, lim: float, k: int) -> None:
    """The row of the whole of A from every row below it: a block A-ideal a -> A plus B-ideal
    i beside A -> any j (``enter``)."""
    last = tc.a_ids.count - 1
    part = srt.part
    src = tab.best[:last][:, part]  # (A-ideals, B-ideals beside A)
    for j in range(tc.b_ids.count):
        fb = tc.f_b[part, j]
        ok = (fb[None, :] <= (lim - tc.enter[:last, j])[:, None]) & (src <= k - 1)
        if not ok.any():
            continue
        flat = int(np.argmin(np.where(ok, src, k + 1)))
        a, i = divmod(flat, len(part))
        if src[a, i] + 1 < tab.best[last, j]:
            tab.best[last, j] = src[a, i] + 1
            tab.from_a[last, j], tab.from_b[last, j] = a, part[i]


def assignment_of(tc: TwoChains, chain: list[tuple[int, int]], n: int) -> np.ndarray:
    """The block of every graph node (``n`` of them) for a chain of pairs of ideals."""
    out = np.full(n, -1, dtype=np.int64)
    for block, ((a0, b0), (a1, b1)) in enumerate(zip(chain, chain[1:], strict=False)):
        out[tc.a_nodes[tc.a_ids.member[a1] & ~tc.a_ids.member[a0]]] = block
        out[tc.b_nodes[tc.b_ids.member[b1] & ~tc.b_ids.member[b0]]] = block
    return out


def chain_bottleneck(tc: TwoChains, chain: list[tuple[int, int]]) -> float:
    """The largest block cost of a chain of pairs of ideals, from the DP's tables."""
    last = tc.a_ids.count - 1
    worst = 0.0
    for (a0, b0), (a1, b1) in zip(chain, chain[1:], strict=False):
        if a1 < last:
            cost = tc.f_a[a0, a1] + tc.f_b[b0, b1]
        elif a0 < last:
            cost = tc.enter[a0, b1] + tc.f_b[b0, b1]
        else:
            cost = tc.after[b0, b1]
        worst = max(worst, float(cost))
    return worst
