"""Bounds of the memory limit by variable elimination with a level axis, and the least bytes
a plan holds at a step.

- Weight-budget bound: the exact minimum time over every plan whose bytes at one step (weights
  W' plus the outputs alive there plus the copies made there) fit the limit, bytes above their
  least rounded DOWN to a unit. Every plan within the limit has ``W'(s) + mem_v(s) <= W(s) +
  peak(s) <= limit`` (W' counts each weight once at its first use), so it is a lower bound on
  the constrained optimum without the Lagrangian duality gap. Variable elimination computes it
  exactly when every table carries one more axis, the units used so far: factors are combined
  by a (min, +) convolution along it.
- Activation-peak bound: every step at once, through the least peak each choice and pair of
  choices implies (:func:`activation_needs`): min over caps c of the least time with W' within
  c units and no need above the room those units leave (:func:`peak_bound`).
- Least bytes at a step (:func:`least_memory`): a plain min-sum elimination, a lower bound on
  the memory per device every plan needs.

Used by solver/spmd/lagrange.py; docs/sharding.md has the proofs and measurements.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import math
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from solver.spmd.exact import DeadlineReached, ShardModel
from solver.spmd.redistribute import local_bytes
from solver.spmd.segment_dp import eliminate

BUDGET_LEVELS = 4096  # the weight budget is cut into at most this many units in budget_bound
BUDGET_LOSS = 0.01  # ... losing at most this share of it to rounding down, else no such bound
BUDGET_CANDIDATES = 200  # units tried for that (the largest first)
BUDGET_FEW = 256  # ... else the unit losing least among those of at most this many levels
BUDGET_TABLE = 20_000_000  # entries of the largest table the weight-budget bound may build
BUDGET_MEMORY = 2 * 2**30  # bytes of the tables it may keep for backtracking


class TooWide(Exception):
    """A table would have more than BUDGET_TABLE entries."""


@dataclass
class StepMemory:
    """The activation bytes a plan holds at one step of the order, as a sum of operator and
    edge terms: ``unary[i][s]`` (operator i's outputs alive at the step, its model-input copies
    there; only the operators with a term), ``pairs[(u, v)][a, b]`` (redistributed copies of
    u's output made for v at the step, u < v as in the time pairs) and ``const`` (operators
    with one choice). A plan's memory per device is at least W' plus this, at every step."""

    unary: dict[int, np.ndarray]
    pairs: dict[tuple[int, int], np.ndarray]
    const: float

    def least(self) -> float:
        """The least bytes of each term, summed (no plan holds less at the step)."""
        return (
            self.const
            + sum(float(b.min()) for b in self.unary.values())
            + sum(float(m.min()) for m in self.pairs.values())
        )

    def with_weights(self, prob) -> StepMemory:
        """The same with ``prob``'s first-use weights W' added (every operator a term)."""
        unary = {i: w + self.unary[i] if i in self.unary else w for i, w in enumerate(prob.wbytes)}
        return StepMemory(unary, self.pairs, self.const + prob.wconst)


@dataclass
class BudgetTables:
    """Variable elimination with a level axis, done: ``total[l]`` is the least time of the
    choices whose levels sum to exactly l (l <= cap), and :meth:`choice` backtracks one."""

    total: np.ndarray
    cap: int
    trace: list
    finals: list[tuple[int, np.ndarray]]
    size: int

    def choice(self, level: int) -> list[int]:
        """A least-time choice per operator whose levels sum to ``level``."""
        vecs = [arr for _, arr in self.finals]
        split = _split(vecs, level, self.cap)
        level_of = dict(zip((f for f, _ in self.finals), split, strict=True))
        choice = [0] * self.size
        for x, rest, arg, fs, mid in reversed(self.trace):
            at = tuple(choice[y] for y in rest)
            choice[x] = int(arg[(*at, level_of[mid])])
            vals = [arr[tuple(choice[y] for y in sc)] for _, sc, arr in fs]
            for (f, _, _), lv in zip(fs, _split(vals, level_of[mid], self.cap), strict=True):
                level_of[f] = lv
        return choice

    def best_level(self, top: int | None = None) -> int | None:
        """The level (at most ``top``) of the least time, None when no choice reaches one."""
        t = self.total[: None if top is None else max(0, top + 1)]
        if (top is not None and top < 0) or not np.isfinite(t).any():
            return None
        return int(np.argmin(t))


def solve_budget(
    prob,
    levels: list[np.ndarray],
    cap: int,
    deadline: float,
    pair_levels: dict | None = None,
    memo: dict | None = None,
) -> BudgetTables | None:
    """Variable elimination over ``prob`` (a :class:`solver.spmd.lagrange._Problem`:
    unary and pairwise time tables) whose tables carry one more axis, the units used so far:
    ``levels[i][s]`` the whole units choice s of operator i uses, ``pair_levels[(u, v)][a, b]``
    those of a pair of choices; only choices within ``cap`` units in all. Factors are combined
    by a (min, +) convolution along the level axis. ``memo`` (a dict kept between calls)
    reuses the result of an elimination whose tables are equal to an earlier one's (repeated
    layers). None past ``deadline`` or once the tables kept for backtracking take more than
    BUDGET_MEMORY bytes; TooWide when a table would have more than BUDGET_TABLE entries."""
    factors, by_var, fid = _level_factors(prob, levels, pair_levels or {}, cap)
    order = _budget_order(
        {f: (sc, arr.shape[-1]) for f, (sc, arr) in factors.items()}, prob.sizes, cap
    )
    memo = {} if memo is None else memo
    trace = []
    finals: list[tuple[int, np.ndarray]] = []
    kept = 0  # bytes of the tables kept for backtracking
    for x in order:
        if time.perf_counter() > deadline or kept > BUDGET_MEMORY:
            return None
        ids = sorted(by_var[x], key=lambda f: factors[f][1].shape[-1])
        fs = [(f, *factors.pop(f)) for f in ids]
        scope = sorted({y for _, sc, _ in fs for y in sc})
        red, arg = _eliminate(x, scope, fs, prob.sizes, cap, memo)
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
    total = np.zeros(1)
    for _, v in finals:
        total = _convolve(total, v, cap)
    return BudgetTables(total + prob.const, cap, trace, finals, len(prob.sizes))


MEMO_BYTES = 2**30  # bytes of elimination results solve_budget's memo may hold


def _eliminate(x: int, scope: list[int], fs: list, sizes: list[int], cap: int, memo: dict):
    """(min over x of the (min, +) product of the tables ``fs``, the argmin), levels past the
    last reached dropped; looked up in ``memo`` by the tables' contents and places first."""
    span = 1 + sum(arr.shape[-1] - 1 for _, _, arr in fs)
    key = (
        scope.index(x),
        min(span, cap + 1),
        tuple(
            (tuple(scope.index(y) for y in sc), arr.shape, hashlib.blake2b(arr.tobytes()).digest())
            for _, sc, arr in fs
        ),
    )
    if key in memo:
        return memo[key]
    acc = np.zeros([1] * len(scope) + [1])
    for _, sc, arr in fs:  # the tables without levels first: they only add
        acc = _convolve(acc, _broadcast(sc, arr, scope, sizes), cap)
    ax = scope.index(x)
    red, arg = _trim(np.min(acc, axis=ax), np.argmin(acc, axis=ax))
    size = red.nbytes + arg.nbytes
    if memo.get("bytes", 0) + size <= MEMO_BYTES:
        memo[key] = (red, arg)
        memo["bytes"] = memo.get("bytes", 0) + size
    return red, arg


def _level_factors(prob, levels, pair_levels, cap):
    """The factors of solve_budget: per operator and per pair, time over (choices, level)."""
    factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
    by_var: dict[int, set[int]] = {i: set() for i in prob.free}
    fid = 0

    def spread(times: np.ndarray, lv: np.ndarray) -> np.ndarray:
        arr = np.full((*times.shape, min(int(lv.max()), cap) + 1), math.inf)
        ok = lv <= cap
        arr[(*np.nonzero(ok), lv[ok])] = times[ok]
        return arr

    for i in prob.free:
        factors[fid] = ((i,), spread(prob.unary[i], levels[i]))
        by_var[i].add(fid)
        fid += 1
    for key in sorted(set(prob.pairs) | set(pair_levels)):
        u, v = key
        m = prob.pairs.get(key)
        if m is None:
            m = np.zeros((prob.sizes[u], prob.sizes[v]))
        factors[fid] = (key, spread(m, pair_levels[key]) if key in pair_levels else m[:, :, None])
        by_var[u].add(fid)
        by_var[v].add(fid)
        fid += 1
    return factors, by_var, fid


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


@dataclass
class BudgetBound:
    """The weight-budget bound at one step: ``value`` the least time of every choice whose
    units fit ``cap`` (a lower bound on every plan within the limit), ``budget`` the bytes
    above the step's least, ``unit`` the bytes of one unit; ``tables`` give the least-time
    choice at every level (fewer units: more room for the other steps)."""

    value: float
    budget: float
    unit: int
    cap: int
    tables: BudgetTables
    levels: list[np.ndarray]  # the units of each operator's choices


def budget_bound(
    prob, limit: float, mem: StepMemory, deadline: float, memo: dict | None = None
) -> BudgetBound | None:
    """The exact minimum time over every plan whose bytes at one step (weights W' plus the
    outputs alive there plus the copies made there, ``mem``) fit the limit, bytes above their
    least rounded DOWN to a unit: a lower bound on the constrained optimum without the
    Lagrangian duality gap (every plan within the limit holds at most the limit at that step).
    None when even the least bytes exceed the limit, when no unit cuts the budget into at most
    BUDGET_LEVELS parts losing at most BUDGET_LOSS of it to rounding with tables of at most
    BUDGET_TABLE entries, or past ``deadline``."""
    mem = mem.with_weights(prob)
    budget = limit - mem.least()
    if budget < 0:
        return None
    unary = [np.floor(b - b.min()).astype(np.int64) for b in mem.unary.values()]
    pairs = {k: np.floor(m - m.min()).astype(np.int64) for k, m in mem.pairs.items()}
    return _solve_levels(prob, unary, pairs, budget, limit, deadline, memo)


def _solve_levels(
    prob, unary: list, pairs: dict, budget: float, limit: float, deadline: float, memo=None
) -> BudgetBound | None:
    """solve_budget with the excess bytes ``unary`` (per operator) and ``pairs`` rounded down
    to the first unit of :func:`budget_units` whose tables are not too wide, within ``budget``
    bytes (a unit dropping more than BUDGET_LOSS of it only if it drops at most BUDGET_LOSS of
    the ``limit``); None past the deadline or without a unit."""
    excess = unary + [m.ravel() for m in pairs.values()]
    most = BUDGET_LOSS * budget
    for unit in budget_units(excess, budget, BUDGET_LEVELS, most, BUDGET_LOSS * limit):
        cap = int(math.floor(budget / unit))
        if cap * unit > budget:  # float division rounded up
            cap -= 1
        levels = [e // unit for e in unary]
        try:
            tables = solve_budget(
                prob, levels, cap, deadline, {k: m // unit for k, m in pairs.items()}, memo
            )
        except TooWide:  # a coarser unit makes smaller tables
            continue
        if tables is None:
            return None
        value = float(tables.total.min()) if tables.total.size else math.inf
        return BudgetBound(value, budget, unit, cap, tables, levels)
    return None


def step_memory(model: ShardModel, step: int) -> StepMemory:
    """The activation bytes every plan holds at ``step`` as operator and edge terms: the local
    outputs alive there, the model-input copies and the redistributed copies the operator at
    ``step`` makes (as evaluate counts them)."""
    sm = model.sm
    sizes = [len(c) for c in model.cands]
    unary: dict[int, np.ndarray] = {}
    const = 0.0
    pairs: dict[tuple[int, int], np.ndarray] = {}

    def add(i: int, values) -> None:
        nonlocal const
        if sizes[i] == 1:
            const += float(values[0])
        else:
            unary[i] = unary.get(i, 0.0) + np.asarray(values, dtype=float)

    for u, pos in model.live[step]:
        t = sm.ops[u].outputs[pos]
        add(u, [local_bytes(sh.out_layouts[pos], sm.itemsize(t)) for sh in model.cands[u]])
    if any(model.step_unary[step]):
        add(step, model.step_unary[step])
    for u, a_of, b_of, mm in model.edges_into[step]:
        mat = np.asarray(mm, dtype=float)[np.ix_(a_of, b_of)]
        if sizes[u] == 1:
            add(step, mat[0])
        elif sizes[step] == 1:
            add(u, mat[:, 0])
        else:
            key, m = ((u, step), mat) if u < step else ((step, u), mat.T)
            pairs[key] = pairs[key] + m if key in pairs else m
    return StepMemory(unary, pairs, const)


def step_bytes(model: ShardModel, choice: list[int]) -> np.ndarray:
    """The activation bytes of one plan at every step: outputs alive, model-input copies and
    redistributed copies (evaluate's activation memory, step by step)."""
    sm = model.sm
    n = len(sm.ops)
    size = {}
    for u, op in enumerate(sm.ops):
        sh = model.cands[u][choice[u]]
        for pos, t in enumerate(op.outputs):
            size[(u, pos)] = local_bytes(sh.out_layouts[pos], sm.itemsize(t))
    per = np.array([sum(size[x] for x in model.live[v]) for v in range(n)], dtype=float)
    per += [model.step_unary[v][choice[v]] for v in range(n)]
    for u, v, a_of, b_of, _tm, mm in model.edges:
        per[v] += mm[a_of[choice[u]]][b_of[choice[v]]]
    return per


def min_sum(
    sizes: list[int], order: list[int], unary: list[np.ndarray], pairs: dict, deadline=None
) -> tuple[float, list[int]]:
    """The exact minimum of ``sum_i unary[i][s_i] + sum_(u, v) pairs[(u, v)][s_u, s_v]`` over
    the operators in ``order`` (the others take choice 0 and add nothing), and a minimiser:
    min-sum variable elimination in that order (segment_dp.eliminate). Raises DeadlineReached
    past ``deadline``."""

    def check() -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise DeadlineReached

    factors = [((i,), unary[i]) for i in order] + [((u, v), m) for (u, v), m in pairs.items()]
    elim = eliminate(factors, sizes, order=order, check=check)
    choice = [0] * len(sizes)
    for x, c in elim.choice().items():
        choice[x] = c
    return float(elim.table), choice


@dataclass
class LeastBytes:
    """The least bytes of a sum of memory terms over every plan, and a plan holding them."""

    nbytes: float
    choice: list[int]


def least_memory(prob, mem: StepMemory, deadline=None) -> LeastBytes:
    """The exact least of W' + ``mem`` over every plan and a plan holding it; for the terms of
    one step, a lower bound on every plan's memory per device."""
    full = mem.with_weights(prob)
    value, choice = min_sum(prob.sizes, prob.order, full.unary, full.pairs, deadline)
    return LeastBytes(value + full.const, choice)


def combine(mems: list[StepMemory], scale: float = 1.0) -> StepMemory:
    """``scale`` times the sum of the terms of ``mems`` (a weighted objective; step -1)."""
    unary: dict[int, np.ndarray] = {}
    pairs: dict[tuple[int, int], np.ndarray] = {}
    for mem in mems:
        for i, b in mem.unary.items():
            unary[i] = unary[i] + scale * b if i in unary else scale * b
        for k, m in mem.pairs.items():
            pairs[k] = pairs[k] + scale * m if k in pairs else scale * m
    return StepMemory(unary, pairs, scale * sum(m.const for m in mems))


def budget_units(
    excess: list[np.ndarray], budget: float, levels: int, most: float, fallback: float = 0.0
) -> list[int]:
    """Units of bytes to round the excess weights down to, the one to try first first: of the
    units of at least ``budget / levels`` bytes, the largest that drops at most twice the fewest
    bytes any of them drops (fewer units, a faster bound), then the larger ones that drop at
    most ``most`` bytes; last, those that cut the budget into at most BUDGET_FEW units and drop
    at most ``fallback`` bytes, the fewest dropped first (a weaker bound, but a cheap one, for
    when none drops little enough or their tables are too wide). Candidates
    are the excess sizes and their halves, quarters and eighths (a transformer's weight shards
    are multiples of one size, which then drops nothing from them) and the least power of two."""
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
    out = ([first] if fewest <= most else []) + coarser[::-1]
    # last (none loses little enough, or their tables are too wide): a weaker bound, only
    # where it is cheap (few levels)
    cheap = [
        (x, -u)
        for u, x in zip(units, losses, strict=True)
        if budget / u <= BUDGET_FEW and x <= fallback
    ]
    out += [-u for _, u in sorted(cheap) if -u not in out]  # the next when too wide
    return out


@dataclass
class ActivationNeeds:
    """The least activation peak of any plan making a choice (``unary[i][s]``) or a pair of
    choices of operators adjacent in the time graph (``pairs[(u, v)][a, b]``), implied by the
    bytes of one step with its other terms at their least, the largest over the steps; and
    ``floor``, the largest least bytes of any step. A plan whose peak is at most Q makes no
    choice and no pair that needs more than Q."""

    unary: dict[int, np.ndarray]
    pairs: dict[tuple[int, int], np.ndarray]
    floor: float


def activation_needs(model: ShardModel, prob, deadline: float | None = None) -> ActivationNeeds:
    """:class:`ActivationNeeds` from every step's :func:`step_memory`: per operator its own
    term and the least of each copy term given its choice; per pair of operators alive
    together and adjacent in the time graph, both of those (a copy between them exactly)."""
    unary: dict[int, np.ndarray] = {}
    pairs: dict[tuple[int, int], np.ndarray] = {}
    floor = 0.0
    for step in range(len(model.cands)):
        if deadline is not None and time.perf_counter() > deadline:
            raise DeadlineReached
        mem = step_memory(model, step)
        base = mem.least()
        floor = max(floor, base)
        env = _envelopes(mem)
        for i, e in env.items():
            unary[i] = np.maximum(unary[i], base + e) if i in unary else base + e
        scope = sorted(env)
        for k, i in enumerate(scope):
            for j in scope[k + 1 :]:
                if (i, j) not in prob.pairs and (i, j) not in mem.pairs:
                    continue
                need = base + _pair_excess(mem, env, i, j)
                pairs[(i, j)] = np.maximum(pairs[(i, j)], need) if (i, j) in pairs else need
    return ActivationNeeds(unary, pairs, floor)


def _envelopes(mem: StepMemory) -> dict[int, np.ndarray]:
    """Per operator in the step's terms, a lower bound on the bytes above the step's least
    given its choice: its own term's excess plus each copy term's least excess over the other
    end."""
    env: dict[int, np.ndarray] = {i: b - b.min() for i, b in mem.unary.items()}
    for (u, v), m in mem.pairs.items():
        low = m.min()
        for i, e in ((u, m.min(axis=1) - low), (v, m.min(axis=0) - low)):
            env[i] = env[i] + e if i in env else e
    return env


def _pair_excess(mem: StepMemory, env: dict, i: int, j: int) -> np.ndarray:
    """A lower bound on the step's bytes above its least given the choices of i and j (i < j):
    both envelopes, with the copy term between them (if any) counted exactly once."""
    m = mem.pairs.get((i, j))
    if m is None:
        return env[i][:, None] + env[j][None, :]
    low = m.min()
    ei = env[i] - (m.min(axis=1) - low)
    ej = env[j] - (m.min(axis=0) - low)
    return ei[:, None] + ej[None, :] + (m - low)


@dataclass
class TimeTables:
    """Unary and pairwise time tables over the operators with a choice (as
    :class:`solver.spmd.lagrange._Problem` holds them)."""

    sizes: list[int]
    free: list[int]
    unary: list[np.ndarray]
    pairs: dict[tuple[int, int], np.ndarray]
    const: float


@dataclass
class PeakBound:
    """The activation-peak bound: ``value`` (a lower bound on every plan within the limit),
    the unit of its weight levels, the number of caps solved, and whether every cap that
    could matter was solved (else ``value`` is the weights-only bound of the first left)."""

    value: float
    unit: int
    solved: int
    complete: bool


def peak_bound(
    prob,
    limit: float,
    needs: ActivationNeeds,
    deadline: float,
    on_tables=None,
    memo: dict | None = None,
) -> PeakBound | None:
    """min over c of the least time of the choices whose weights W' use at most c units above
    their least and that make no choice or pair needing a peak above Q_c = limit - least W' -
    c units: every plan s within the limit is one of them for c = floor((limit - peak(s) -
    least W') / unit), so this is a lower bound (docs/sharding.md). One weight-budget solve
    without activations gives g(c), the least time within c units, which bounds the caps not
    solved; they are solved the largest first (only where the choices allowed change) while
    g(c) is below the best so far. ``on_tables(tables, cap, unit)`` is called with each solve
    and returns the time of the best plan known to fit (inf if none), which ends the search
    as well. None when no plan can fit or no unit suits."""
    wmin = prob.wconst + sum(float(w.min()) for w in prob.wbytes)
    room = limit - wmin - needs.floor
    if room < 0:
        return None
    excess = [np.floor(w - w.min()).astype(np.int64) for w in prob.wbytes]
    memo = {} if memo is None else memo
    weights = _solve_levels(prob, excess, {}, room, limit, deadline, memo)
    if weights is None:
        return None
    unit, top, levels = weights.unit, weights.cap, weights.levels
    g = np.minimum.accumulate(weights.tables.total)  # the least time within c units, c = 0..top
    g = np.concatenate([g, np.full(top + 1 - g.size, g[-1])])[: top + 1]
    best, upper = math.inf, math.inf
    caps = _peak_caps(needs, limit - wmin, unit, top)
    for k, c in enumerate(caps):
        if g[c] >= min(best, upper):  # every cap left: its least time is at least g[c]
            return PeakBound(min(best, float(g[c])), unit, k, True)
        pruned = within_peak(prob, needs, limit - wmin - c * unit)
        t = None
        if time.perf_counter() < deadline:
            with contextlib.suppress(TooWide):
                t = solve_budget(pruned, levels, c, deadline, memo=memo)
        if t is None:
            return PeakBound(min(best, float(g[c])), unit, k, False)
        level = t.best_level(c)
        if level is not None:
            best = min(best, float(t.total[level]))
            if on_tables is not None:
                upper = min(upper, on_tables(t, c, unit))
    return PeakBound(best, unit, len(caps), True)


def _peak_caps(needs: ActivationNeeds, room: float, unit: int, top: int) -> list[int]:
    """The caps where the choices allowed change, the largest first: c = top and, for every
    need q, the largest c with room - c units >= q."""
    values = [top]
    for arr in [*needs.unary.values(), *needs.pairs.values()]:
        q = np.unique(arr[np.isfinite(arr)])
        c = np.floor((room - q) / unit).astype(np.int64)
        values += [int(x) for x in c if 0 <= x < top]
    return sorted(set(values), reverse=True)


def within_peak(prob, needs: ActivationNeeds, peak: float) -> TimeTables:
    """``prob``'s time tables with every choice and pair that needs a peak above ``peak``
    forbidden (infinite time)."""
    unary = list(prob.unary)
    for i, need in needs.unary.items():
        if (need > peak).any():
            unary[i] = np.where(need > peak, math.inf, unary[i])
    pairs = dict(prob.pairs)
    for key, need in needs.pairs.items():
        if (need > peak).any():
            base = pairs.get(key)
            if base is None:
                base = np.zeros(need.shape)
            pairs[key] = np.where(need > peak, math.inf, base)
    return TimeTables(prob.sizes, prob.free, unary, pairs, prob.const)


DUAL_PEAKS = 8  # the exact-weights peak bound is skipped when more peak values than this matter
DUAL_ITERATIONS = 24  # Lagrange multipliers tried per peak value (growth, then bisection)


@dataclass
class DualPeakBound:
    """The activation-peak bound with the weights exact in bytes: ``value`` = min over the peak
    values Q of the best Lagrangian bound of R(Q) found (a lower bound on every plan within the
    limit), and how many values Q there were."""

    value: float
    peaks: int


def peak_values(prob, limit: float, needs: ActivationNeeds) -> list[float]:
    """The peaks Q a plan within ``limit`` can be bounded by: the floor and every need above it
    up to the limit less the least W' (a plan needing more holds more than the limit)."""
    wmin = prob.wconst + sum(float(w.min()) for w in prob.wbytes)
    values = {needs.floor}
    for arr in [*needs.unary.values(), *needs.pairs.values()]:
        q = np.unique(arr[np.isfinite(arr)])
        values.update(float(x) for x in q if needs.floor < x <= limit - wmin)
    return sorted(v for v in values if v <= limit - wmin)


def peak_dual_bound(
    prob,
    limit: float,
    needs: ActivationNeeds,
    deadline: float,
    on_choice=None,
    most: int = DUAL_PEAKS,
) -> DualPeakBound | None:
    """min over Q of max over lambda >= 0 of D_Q(lambda) = min over the choices that make no
    choice or pair needing more than Q of [time + lambda W'] - lambda (limit - Q): every plan
    s within the limit makes no choice or pair needing more than Q(s) = max(floor, its needs)
    <= peak(s), and W'(s) <= W(s) <= limit - peak(s) <= limit - Q(s), so time(s) >=
    D_Q(s)(lambda) for every lambda (docs/sharding.md). No rounding of bytes: a few bytes of
    bias shards count. ``on_choice(choice)`` sees every minimiser. None with more than
    ``most`` values of Q or past ``deadline`` (a minimum over part of them is no bound)."""
    values = peak_values(prob, limit, needs)
    if len(values) > most:
        return None
    best = math.inf
    try:
        for q in values:
            allowed = within_peak(prob, needs, q)
            best = min(best, _dual_at_peak(prob, allowed, limit - q, deadline, on_choice))
    except DeadlineReached:
        return None
    return DualPeakBound(best, len(values))


def _dual_at_peak(prob, allowed: TimeTables, room: float, deadline: float, on_choice) -> float:
    """The best D(lambda) = min [time + lambda W'] - lambda room over ``allowed`` found for
    lambda = 0, then growing tenfold until a minimiser has W' <= room, then bisecting (log
    scale) between the last that did not and the first that did; inf when none allowed."""

    def dual(lam: float) -> tuple[float, bool]:
        unary = [u + lam * w for u, w in zip(allowed.unary, prob.wbytes, strict=True)]
        value, choice = min_sum(prob.sizes, prob.order, unary, allowed.pairs, deadline)
        if not math.isfinite(value):
            return math.inf, True
        if on_choice is not None:
            on_choice(choice)
        w = prob.wconst + sum(float(prob.wbytes[i][c]) for i, c in enumerate(choice))
        return value + allowed.const + lam * (prob.wconst - room), w <= room

    best, fits = dual(0.0)
    if fits:  # lambda = 0's minimiser is within the room: the minimum over R(Q) itself
        return best
    lo, hi, lam = 0.0, None, 1e-15
    for _ in range(DUAL_ITERATIONS):
        if hi is None and lam > 1e6:
            break
        if hi is not None and hi - lo <= 1e-6 * hi:
            break
        trial = lam if hi is None else (math.sqrt(lo * hi) if lo > 0 else hi / 10)
        value, fits = dual(trial)
        best = max(best, value)
        if fits:
            hi = trial
        elif hi is None:
            lo, lam = trial, trial * 10
        else:
            lo = trial
    return best
