"""Plans under a memory limit from the layer structure: a dynamic programme over the chain of
segments (:func:`solver.spmd.lagrange.segments`: stretches of the order separated by points
where at most one activation is alive, a transformer's half layers).

Each segment offers, for every choice of the operator whose output enters it and of the one
whose output leaves it, the minimisers of time + lambda x bytes inside it for a few lambdas
around the Lagrangian multiplier: their time, their bytes (weights and, in training, the
outputs kept) and the largest copy set they make at one step. Identical segments (a model's
repeated layers) are solved once. The programme picks one option per segment, the boundary
choices agreeing, of least time whose bytes, rounded UP to a unit, fit the limit less the
largest copy set of the options it may use. Every plan it returns is priced by ``evaluate``
and kept only when it fits. Plans only: the options are a subset of the choices, so nothing
here is a bound (a bound on a restricted problem is not a bound).
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.spmd.program import Planner, evaluate

DP_LEVELS = 4096  # the bytes above each segment's least are counted in this many units
DP_RETRIES = 3  # solves, the room corrected by the exact memory of the last plan
# multiples of the Lagrangian multiplier whose minimisers each segment offers
LAMBDA_FACTORS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.4, 1.7, 2.0, 3.0, 5.0)


@dataclass
class SegmentPlan:
    """A plan of the dynamic programme that fits the limit: its time, strategies, program."""

    objective: float
    strategies: dict
    program: object


@dataclass(frozen=True)
class SegmentOption:
    """One assignment of a segment's free operators given the choices ``a`` of the operator
    entering it and ``b`` of the one leaving it: its time, bytes and largest copy set."""

    a: int
    b: int
    time: float
    nbytes: float
    copies: float
    choice: tuple[int, ...]  # per operator of the segment's ``free`` list


@dataclass
class _Segment:
    """A segment's operators with a choice (``free``), the operator whose output enters it and
    the one whose output leaves it (None: one choice, or no activation crosses)."""

    ops: range
    free: list[int]
    enter: int | None
    leave: int | None
    options: list[SegmentOption] = field(default_factory=list)


@dataclass
class Elimination:
    """Min-sum variable elimination down to the ``keep`` variables: ``table``, the minimum
    over the others as an array over the kept ones (in order; 0-d when none is kept), and the
    trace to back-track the others' minimisers."""

    table: np.ndarray
    keep: list[int]
    trace: list

    def choice(self, at: tuple = ()) -> dict[int, int]:
        """The minimising choice of every eliminated variable with the kept ones at ``at``."""
        choice = dict(zip(self.keep, (int(x) for x in at), strict=True))
        for x, rest, arg in reversed(self.trace):
            choice[x] = int(arg[tuple(choice[y] for y in rest)])
        return choice


class Unsupported(Exception):
    """An edge enters a segment from an operator with a choice other than its entering one."""


def crossing_producers(planner: Planner, segs: list[range]) -> list[int | None]:
    """Per segment, the operator whose output is the one activation alive after it (None when
    none is: the last segment)."""
    last: dict[int, int] = {}
    for v in range(len(planner.sm.ops)):
        for u, _, _ in planner.in_edges[v]:
            last[u] = max(last.get(u, -1), v)
    ends = sorted(last.items())
    out = []
    for seg in segs:
        p = seg.stop - 1
        alive = [u for u, end in ends if u <= p < end]
        out.append(alive[0] if len(alive) == 1 else None)
    return out


class SegmentProgramme:
    """The segments of one relaxed problem (``prob``, a lagrange._Problem of the ShardModel
    ``model``), their options, and the dynamic programme over them. Raises
    :class:`Unsupported` when the segments do not chain through one operator's choice."""

    def __init__(self, planner: Planner, model, prob, segs: list[range]) -> None:
        self.planner, self.model, self.prob = planner, model, prob
        sizes = prob.sizes
        self.segments: list[_Segment] = []
        enter = None
        for seg, out in zip(segs, crossing_producers(planner, segs), strict=True):
            free = [i for i in seg if sizes[i] > 1]
            out = out if out is not None and sizes[out] > 1 else None
            if out is not None and out not in free and out != enter:
                raise Unsupported
            self.segments.append(_Segment(seg, free, enter, out))
            enter = out
        self.where = np.empty(len(sizes), dtype=np.int64)
        for j, s in enumerate(self.segments):
            self.where[s.ops.start : s.ops.stop] = j
        self.pairs: list[list] = [[] for _ in self.segments]  # time pairs by later operator
        for (u, v), m in prob.pairs.items():
            s = self.segments[self.where[v]]
            if u not in s.ops and u != s.enter:
                raise Unsupported
            self.pairs[self.where[v]].append((u, v, m))
        self.copies: dict[int, list] = {}  # step v -> (producer, copy bytes over both choices)
        for u, v, a_of, b_of, _tm, mm in model.edges:
            mat = np.asarray(mm, dtype=float)[np.ix_(a_of, b_of)]
            if mat.any():
                self.copies.setdefault(v, []).append((u, mat))
        self.nbytes = [w + o for w, o in zip(prob.wbytes, prob.obytes, strict=True)]

    # ------------------------------------------------------------------ options
    def build_options(self, lambdas: list[float], deadline: float) -> bool:
        """Every segment's options at ``lambdas`` (identical segments solved once); False
        when ``deadline`` passed first."""
        done: dict[bytes, list[SegmentOption]] = {}
        for j, s in enumerate(self.segments):
            if time.perf_counter() > deadline:
                return False
            key = self._key(j)
            if key not in done:
                done[key] = self._options(j, lambdas)
            s.options = done[key]
        return True

    def _key(self, j: int) -> bytes:
        """Equal keys: equal options (every array of the segment in its own numbering)."""
        s, prob = self.segments[j], self.prob
        h = hashlib.blake2b()
        h.update(repr((len(s.ops), [self._rel(s, x) for x in (s.enter, s.leave)])).encode())
        for i in s.ops:
            for arr in (prob.unary[i], self.nbytes[i], self.model.step_unary[i]):
                h.update(np.asarray(arr, dtype=float).tobytes())
            for u, mat in self.copies.get(i, []):
                h.update(repr(self._rel(s, u)).encode() + mat.tobytes())
        for u, v, m in self.pairs[j]:
            h.update(repr((self._rel(s, u), self._rel(s, v))).encode() + m.tobytes())
        return h.digest()

    @staticmethod
    def _rel(s: _Segment, x: int | None):
        if x is None:
            return None
        return x - s.ops.start if x in s.ops else ("enter" if x == s.enter else "fixed")

    def _options(self, j: int, lambdas: list[float]) -> list[SegmentOption]:
        """The minimisers of time + lambda x bytes per pair of boundary choices, each lambda,
        the dominated ones dropped."""
        s = self.segments[j]
        found: dict[tuple, SegmentOption] = {}
        for lam in lambdas:
            elim = self._eliminate(j, lam)
            for at in np.ndindex(*elim.table.shape):
                if not math.isfinite(elim.table[at]):
                    continue
                choice = elim.choice(at)
                opt = self._priced(s, j, choice)
                found.setdefault((opt.a, opt.b, opt.choice), opt)
        return _pareto(list(found.values()))

    def _eliminate(self, j: int, lam: float) -> Elimination:
        """Min over the segment's free operators other than its boundary ones of time +
        lam x bytes, as a table over the boundary ones (enter first, then leave)."""
        s, prob = self.segments[j], self.prob
        keep = [x for x in dict.fromkeys((s.enter, s.leave)) if x is not None]
        factors = [((i,), prob.unary[i] + lam * self.nbytes[i]) for i in s.free]
        factors += [((u, v), m) for u, v, m in self.pairs[j]]
        if s.enter is not None:
            factors.append(((s.enter,), np.zeros(prob.sizes[s.enter])))
        return eliminate(factors, prob.sizes, keep)

    def _priced(self, s: _Segment, j: int, choice: dict[int, int]) -> SegmentOption:
        """The option of one assignment: exact time, bytes and largest copy set."""
        prob = self.prob
        t = sum(float(prob.unary[i][choice[i]]) for i in s.free)
        t += sum(float(m[choice[u], choice[v]]) for u, v, m in self.pairs[j])
        nbytes = sum(float(self.nbytes[i][choice[i]]) for i in s.free)
        copies = 0.0
        for v in s.ops:
            cv = choice.get(v, 0)
            c = float(self.model.step_unary[v][cv])
            c += sum(float(mat[choice.get(u, 0), cv]) for u, mat in self.copies.get(v, []))
            copies = max(copies, c)
        a = choice[s.enter] if s.enter is not None else 0
        b = choice[s.leave] if s.leave is not None else 0
        return SegmentOption(a, b, t, nbytes, copies, tuple(choice[i] for i in s.free))

    # ------------------------------------------------------------------ the programme
    def plan(self, limit: float, deadline: float) -> SegmentPlan | None:
        """The least-time choice of options that fits ``limit`` (bytes rounded up, beside the
        largest copy set of the options), priced by evaluate; the room is corrected by what
        the exact memory of its plan leaves or breaks, up to DP_RETRIES solves. The fastest
        plan that fits, or None."""
        budget = limit - self.fixed_bytes()
        best = None
        for _ in range(DP_RETRIES):
            if budget <= 0 or time.perf_counter() > deadline:
                break
            chosen = self.solve(budget, deadline)
            if chosen is None:
                break
            strategies = self.strategies(chosen)
            program = evaluate(self.planner, strategies)
            over = program.memory_per_device - limit
            if over <= 0 and (best is None or program.objective < best.objective):
                best = SegmentPlan(program.objective, strategies, program)
            if -2 * budget / DP_LEVELS < over <= 0:  # within two units of the limit
                break
            budget -= over
        return best

    def fixed_bytes(self) -> float:
        """The bytes every choice of options holds whatever it is: the operators without a
        choice, each segment's least, and the largest copy set of any option."""
        copies = max((o.copies for s in self.segments for o in s.options), default=0.0)
        least = sum(_least_bytes(s) for s in self.segments)
        return copies + least + self.prob.wconst + self.prob.oconst

    def strategies(self, chosen: Chosen) -> dict:
        """The plan of one option per segment (the operators without a choice: their one)."""
        choice = [0] * len(self.prob.sizes)
        for s, opt in zip(self.segments, chosen.options, strict=True):
            for i, c in zip(s.free, opt.choice, strict=True):
                choice[i] = c
        return {
            op.name: self.model.cands[i][choice[i]].strategy
            for i, op in enumerate(self.planner.sm.ops)
        }

    def solve(self, budget: float, deadline: float | None = None) -> Chosen | None:
        """The dynamic programme over (boundary choice, units used): the least-time option per
        segment whose bytes above the segments' least, each rounded up to budget /
        DP_LEVELS, fit in DP_LEVELS units (a budget below a byte: a byte). None when nothing
        fits, the budget is negative, or past ``deadline``."""
        if budget < 0:
            return None
        unit = max(budget, 1.0) / DP_LEVELS
        cost = np.full((1, DP_LEVELS + 1), math.inf)
        cost[0, 0] = 0.0
        args = []
        for s in self.segments:
            if deadline is not None and time.perf_counter() > deadline:
                return None
            cost, arg, levels = _step(cost, s, unit, self.prob.sizes)
            args.append((arg, levels))
        if not np.isfinite(cost).any():
            return None
        b, level = np.unravel_index(int(np.argmin(cost)), cost.shape)
        total = float(cost[b, level])
        options = []
        for s, (arg, levels) in zip(reversed(self.segments), reversed(args), strict=True):
            o = int(arg[b, level])
            options.append(s.options[o])
            level -= levels[o]
            b = s.options[o].a
        return Chosen(total, options[::-1])


@dataclass
class Chosen:
    """One option per segment (in order) and their time."""

    time: float
    options: list[SegmentOption]


def _least_bytes(s: _Segment) -> float:
    return min((o.nbytes for o in s.options), default=0.0)


def _step(cost: np.ndarray, s: _Segment, unit: float, sizes: list[int]):
    """One segment of the programme: the least time per (leaving choice, units) and the
    option taken there (-1: none)."""
    width = sizes[s.leave] if s.leave is not None else 1
    top = cost.shape[1] - 1
    new = np.full((width, top + 1), math.inf)
    arg = np.full((width, top + 1), -1, dtype=np.int32)
    least = _least_bytes(s)
    levels = [max(0, math.ceil((o.nbytes - least) / unit - 1e-9)) for o in s.options]
    for o, (opt, lev) in enumerate(zip(s.options, levels, strict=True)):
        if lev > top or opt.a >= cost.shape[0]:
            continue
        cand = cost[opt.a, : top + 1 - lev] + opt.time
        region = new[opt.b, lev:]
        better = cand < region
        region[better] = cand[better]
        arg[opt.b, lev:][better] = o
    return new, arg, levels


def _pareto(options: list[SegmentOption]) -> list[SegmentOption]:
    """Per pair of boundary choices, the options no other beats in time, bytes and copies."""
    by_pair: dict[tuple[int, int], list[SegmentOption]] = {}
    for o in sorted(options, key=lambda o: (o.time, o.nbytes, o.copies)):
        kept = by_pair.setdefault((o.a, o.b), [])
        if not any(k.nbytes <= o.nbytes and k.copies <= o.copies for k in kept):
            kept.append(o)
    return [o for kept in by_pair.values() for o in kept]


def eliminate(factors: list, sizes: list[int], keep=(), order=None, check=None) -> Elimination:
    """Min-sum variable elimination of every variable of ``factors`` ((scope, array) pairs)
    but ``keep``: in ``order`` when given (every variable of the factors not kept), else the
    one whose table is smallest first. ``check()``, when given, runs before each variable (it
    may raise to stop). The one elimination of the sharding planner (budget.min_sum too)."""
    keep = list(keep)
    by_var: dict[int, set[int]] = {}
    table: dict[int, tuple] = dict(enumerate(factors))
    for f, (sc, _) in table.items():
        for y in sc:
            by_var.setdefault(y, set()).add(f)
    fid = len(factors)
    trace = []

    def width(x: int) -> int:
        return math.prod(sizes[y] for y in {y for f in by_var[x] for y in table[f][0]})

    if order is None:
        heap = [(width(x), x) for x in by_var if x not in keep]
        heapq.heapify(heap)
    else:
        heap = [(0, x) for x in reversed(list(order)) if x not in keep]  # popped from the end
    done: set[int] = set()
    while heap:
        w, x = heapq.heappop(heap) if order is None else heap.pop()
        if x in done:
            continue
        if order is None and w != width(x):
            heapq.heappush(heap, (width(x), x))
            continue
        if check is not None:
            check()
        done.add(x)
        fs = [table.pop(f) for f in sorted(by_var.pop(x))]
        scope = sorted({y for sc, _ in fs for y in sc})
        acc = _sum(fs, scope, sizes)
        ax = scope.index(x)
        rest = tuple(y for y in scope if y != x)
        trace.append((x, rest, np.argmin(acc, axis=ax)))
        table[fid] = (rest, np.min(acc, axis=ax))
        for y in rest:
            by_var[y] = {f for f in by_var[y] if f in table} | {fid}
            if order is None and y not in keep:
                heapq.heappush(heap, (width(y), y))
        fid += 1
    return Elimination(_sum(list(table.values()), keep, sizes), keep, trace)


def _sum(fs: list, scope: list[int], sizes: list[int]) -> np.ndarray:
    """The sum of factors ``fs`` (scope, array) as one array over ``scope``."""
    acc = np.zeros([sizes[y] for y in scope])
    for sc, arr in fs:
        order = sorted(range(len(sc)), key=lambda k: scope.index(sc[k]))
        view = np.transpose(arr, order) if len(sc) > 1 else arr
        shape = [1] * len(scope)
        for y in sc:
            shape[scope.index(y)] = sizes[y]
        acc = acc + np.reshape(view, shape)
    return acc
