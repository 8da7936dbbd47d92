"""The weight-budget bound of the memory limit: the exact minimum time over every plan whose
weights plus the outputs alive at one step fit the limit, bytes rounded DOWN to a unit.

Every plan within the limit has ``W'(s) + live_v(s) <= W(s) + peak(s) <= limit`` (W' counts
each weight once at its first use, ``live_v`` the outputs alive at step v), so the minimum under
that one constraint is a lower bound on the constrained optimum, without the Lagrangian duality
gap; its minimiser, when it fits, is the optimum. Variable elimination computes it exactly when
every table carries one more axis, the units used so far: factors are combined by a (min, +)
convolution along it. Used by solver/sharding/lagrange.py; docs/sharding.md has the measurements.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict

import numpy as np

from solver.sharding.exact import ShardModel
from solver.sharding.redistribute import local_bytes

BUDGET_LEVELS = 4096  # the weight budget is cut into at most this many units in budget_bound
BUDGET_LOSS = 0.01  # ... losing at most this share of it to rounding down, else no such bound
BUDGET_CANDIDATES = 200  # units tried for that (the largest first)
BUDGET_TABLE = 20_000_000  # entries of the largest table the weight-budget bound may build
BUDGET_MEMORY = 2 * 2**30  # bytes of the tables it may keep for backtracking


class TooWide(Exception):
    """A table would have more than BUDGET_TABLE entries."""


def solve_budget(
    prob, levels: list[np.ndarray], cap: int, deadline: float
) -> tuple[float, list[int]] | None:
    """The exact minimum time over all choices whose levels sum to at most ``cap``
    (``levels[i][s]``: the whole units choice s of operator i uses), and a minimiser; ``prob``
    is a :class:`solver.sharding.lagrange._Problem` (unary and pairwise time tables). None
    past ``deadline`` or once the tables kept for backtracking take more than BUDGET_MEMORY
    bytes; TooWide when a table would have more than BUDGET_TABLE entries. Variable elimination
    whose tables carry one more axis, the units used so far: factors are combined by a
    (min, +) convolution along it, and the minimiser comes back by backtracking."""
    factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
    by_var: dict[int, set[int]] = {i: set() for i in prob.free}
    fid = 0
    for i in prob.free:
        lv = levels[i]
        top = int(lv.max())
        arr = np.full((prob.sizes[i], min(top, cap) + 1), math.inf)
        ok = lv <= cap
        arr[np.nonzero(ok)[0], lv[ok]] = prob.unary[i][ok]
        factors[fid] = ((i,), arr)
        by_var[i].add(fid)
        fid += 1
    for (u, v), m in prob.pairs.items():
        factors[fid] = ((u, v), m[:, :, None])
        by_var[u].add(fid)
        by_var[v].add(fid)
        fid += 1
    order = _budget_order(
        {f: (sc, arr.shape[-1]) for f, (sc, arr) in factors.items()}, prob.sizes, cap
    )
    trace = []
    finals: list[tuple[int, np.ndarray]] = []
    kept = 0  # bytes of the tables kept for backtracking
    for x in order:
        if time.perf_counter() > deadline or kept > BUDGET_MEMORY:
            return None
        ids = sorted(by_var[x], key=lambda f: factors[f][1].shape[-1])
        fs = [(f, *factors.pop(f)) for f in ids]
        scope = sorted({y for _, sc, _ in fs for y in sc})
        acc = np.zeros([1] * len(scope) + [1])
        for _, sc, arr in fs:  # the tables without levels first: they only add
            acc = _convolve(acc, _broadcast(sc, arr, scope, prob.sizes), cap)
        ax = scope.index(x)
        arg = np.argmin(acc, axis=ax)
        red = np.min(acc, axis=ax)
        red, arg = _trim(red, arg)
        kept += red.nbytes + arg.nbytes
        rest = tuple(y for y in scope if y != x)
        trace.append((x, rest, arg, fs, fid))
        for y in scope:
            by_var[y] -= set(ids)
        if rest:
            factors[fid] = (rest, red)
            for y in rest:
                by_var[y].add(fid)
        else:
            finals.append((fid, red))
        fid += 1
    if not finals:
        return prob.const, [0] * len(prob.sizes)
    vecs = [arr for _, arr in finals]
    total = vecs[0]
    for v in vecs[1:]:
        total = _convolve(total, v, cap)
    if not np.isfinite(total).any():
        return math.inf, []
    best = int(np.argmin(total))
    level = dict(zip((f for f, _ in finals), _split(vecs, best, cap), strict=True))
    choice = [0] * len(prob.sizes)
    for x, rest, arg, fs, mid in reversed(trace):
        at = tuple(choice[y] for y in rest)
        choice[x] = int(arg[(*at, level[mid])])
        vals = [arr[tuple(choice[y] for y in sc)] for _, sc, arr in fs]
        for (f, _, _), lv in zip(fs, _split(vals, level[mid], cap), strict=True):
            level[f] = lv
    return float(total[best]) + prob.const, choice


def _budget_order(factors: dict[int, tuple[tuple, int]], sizes: list[int], cap: int) -> list:
    """The elimination order of solve_budget from the factors' scopes and level spans alone:
    greedy by the entries of the table each elimination builds, levels included (they grow
    along a chain of layers, so the layers are summed one by one). Raises _TooWide when a
    table would exceed BUDGET_TABLE entries (before any is built)."""
    by_var: dict[int, set[int]] = defaultdict(set)
    for f, (sc, _) in factors.items():
        for y in sc:
            by_var[y].add(f)
    factors = dict(factors)

    def cost(x: int) -> int:
        scope = {y for f in by_var[x] for y in factors[f][0]}
        span = 1 + sum(factors[f][1] - 1 for f in by_var[x])
        return math.prod(sizes[y] for y in scope) * min(span, cap + 1)

    heap = [(cost(x), x) for x in by_var]
    heapq.heapify(heap)
    done: set[int] = set()
    order = []
    fid = max(factors, default=0) + 1
    while heap:
        c, x = heapq.heappop(heap)
        if x in done:
            continue
        if c != cost(x):
            heapq.heappush(heap, (cost(x), x))
            continue
        if c > BUDGET_TABLE:
            raise TooWide
        done.add(x)
        order.append(x)
        ids = by_var.pop(x)
        scope = {y for f in ids for y in factors[f][0]} - {x}
        span = min(cap + 1, 1 + sum(factors[f][1] - 1 for f in ids))
        for f in ids:
            del factors[f]
        for y in scope:
            by_var[y] -= ids
            by_var[y].add(fid)
        factors[fid] = (tuple(scope), span)
        fid += 1
        for y in scope:
            heapq.heappush(heap, (cost(y), y))
    return order


def _broadcast(sc, arr, scope, sizes) -> np.ndarray:
    """``arr`` over ``sc`` (+ a trailing level axis) as an array broadcastable over ``scope``."""
    idx = [scope.index(y) for y in sc]
    view = np.transpose(arr, [*np.argsort(idx), len(sc)])
    full = [1] * len(scope) + [arr.shape[-1]]
    for y in sc:
        full[scope.index(y)] = sizes[y]
    return view.reshape(full)


def _convolve(a: np.ndarray, b: np.ndarray, cap: int) -> np.ndarray:
    """(min, +) convolution of two level-indexed tables along their last axis, up to ``cap``."""
    if a.shape[-1] == 1 or b.shape[-1] == 1:
        return a + b
    if a.shape[-1] < b.shape[-1]:
        a, b = b, a
    la, lb = a.shape[-1], b.shape[-1]
    n = min(la + lb - 1, cap + 1)
    out = np.full((*np.broadcast_shapes(a.shape[:-1], b.shape[:-1]), n), math.inf)
    support = np.isfinite(b).reshape(-1, lb).any(axis=0)
    for d in np.nonzero(support)[0]:
        if d >= n:
            break
        k = min(la, n - d)
        np.minimum(out[..., d : d + k], a[..., :k] + b[..., d : d + 1], out=out[..., d : d + k])
    return out


def _trim(red: np.ndarray, arg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the trailing levels no entry reaches."""
    finite = np.isfinite(red).reshape(-1, red.shape[-1]).any(axis=0)
    keep = int(np.nonzero(finite)[0].max()) + 1 if finite.any() else 1
    return red[..., :keep], arg[..., :keep]


def _split(vecs: list[np.ndarray], level: int, cap: int) -> list[int]:
    """Levels l_i summing to ``level`` that minimise sum vecs[i][l_i] (vectors over levels)."""
    if all(v.shape[-1] == 1 for v in vecs):
        return [0] * len(vecs)
    prefix = [vecs[0]]
    for v in vecs[1:]:
        prefix.append(_convolve(prefix[-1], v, cap))
    out = [0] * len(vecs)
    left = level
    for i in range(len(vecs) - 1, 0, -1):
        v, p = vecs[i], prefix[i - 1]
        ds = np.arange(min(v.shape[-1], left + 1))
        rest = left - ds
        cost = np.where(rest < p.shape[-1], p[np.minimum(rest, p.shape[-1] - 1)], math.inf) + v[ds]
        d = int(np.argmin(cost))
        out[i], left = d, left - d
    out[0] = left
    return out


def budget_bound(
    prob,
    limit: float,
    live: list[np.ndarray],
    deadline: float,
    cap_bytes: float | None = None,
):
    """The exact minimum time over every plan whose weights W' plus ``live`` (per operator and
    choice: its outputs alive at one step of the order) fit the limit, bytes rounded DOWN to a
    unit: a lower bound on the constrained optimum without the Lagrangian duality gap (every
    plan within the limit has W' + live <= W + its activation peak <= limit). ``cap_bytes``
    replaces the budget above the least bytes (a smaller one, to find a plan that fits).
    Returns (bound, choice, budget in bytes, unit in bytes), or None when no unit cuts the
    budget into at most BUDGET_LEVELS parts losing at most BUDGET_LOSS of it to rounding with
    tables of at most BUDGET_TABLE entries, or past ``deadline``."""
    mem = [w + a for w, a in zip(prob.wbytes, live, strict=True)]
    least = prob.wconst + sum(float(b.min()) for b in mem if b.size)
    budget = limit - least if cap_bytes is None else cap_bytes
    if budget < 0:
        return None
    excess = [np.floor(b - b.min()).astype(np.int64) for b in mem]
    for unit in budget_units(excess, budget, BUDGET_LEVELS, BUDGET_LOSS * budget):
        cap = int(math.floor(budget / unit))
        if cap * unit > budget:  # float division rounded up
            cap -= 1
        try:
            out = solve_budget(prob, [e // unit for e in excess], cap, deadline)
        except TooWide:  # a coarser unit makes smaller tables
            continue
        return None if out is None else (*out, budget, unit)
    return None


def live_bytes(model: ShardModel, step: int) -> list[np.ndarray]:
    """Per operator and choice, the local bytes of its outputs alive at ``step``."""
    sm = model.sm
    out = [np.zeros(len(c)) for c in model.cands]
    for u, pos in model.live[step]:
        t = sm.ops[u].outputs[pos]
        sizes = [local_bytes(sh.out_layouts[pos], sm.itemsize(t)) for sh in model.cands[u]]
        out[u] = out[u] + np.array(sizes)
    return out


def peak_step(model: ShardModel, choice: list[int]) -> int:
    """The step of the order where a plan's live outputs take the most bytes."""
    sm = model.sm
    size = {}
    for u, op in enumerate(sm.ops):
        sh = model.cands[u][choice[u]]
        for pos, t in enumerate(op.outputs):
            size[(u, pos)] = local_bytes(sh.out_layouts[pos], sm.itemsize(t))
    per = [sum(size[x] for x in model.live[v]) for v in range(len(sm.ops))]
    return int(np.argmax(per))


def budget_units(excess: list[np.ndarray], budget: float, levels: int, most: float) -> list[int]:
    """Units of bytes to round the excess weights down to, the one to try first first: of the
    units of at least ``budget / levels`` bytes, the largest that drops at most twice the fewest
    bytes any of them drops (fewer units, a faster bound), then the larger ones that drop at
    most ``most`` bytes. Candidates are the excess sizes and their halves, quarters and eighths
    (a transformer's weight shards are multiples of one size, which then drops nothing from
    them) and the least power of two."""
    least = max(1, math.ceil(budget / levels))
    width = max((e.size for e in excess), default=0)
    table = np.zeros((len(excess), width), np.int64)
    for i, e in enumerate(excess):
        table[i, : e.size] = e
    values = np.unique(table[table >= least])
    cands = {2 ** math.ceil(math.log2(least))}
    for k in (1, 2, 4, 8):
        cands.update(int(v) for v in values // k if v // k >= least)
    units = sorted(cands, reverse=True)[:BUDGET_CANDIDATES]
    losses = [int((table % u).max(axis=1).sum()) if table.size else 0 for u in units]
    fewest = min(losses)
    first = next(u for u, x in zip(units, losses, strict=True) if x <= 2 * fewest)
    coarser = [u for u, x in zip(units, losses, strict=True) if u > first and x <= most]
    return ([first] if fewest <= most else []) + coarser[::-1]
