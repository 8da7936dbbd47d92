"""A certified lower bound and good plans for big models: Lagrangian relaxation of the memory
limit, each relaxed problem solved EXACTLY by variable elimination (min-sum dynamic programming
over the operator graph, which has a small treewidth: layers meet at one tensor).

For every lambda >= 0 and every plan s within the limit (W = weight bytes, P = activation peak,
P >= P_floor, the least live activation bytes at any step over every plan):

    time(s) >= time(s) + lambda (W(s) + P_floor - limit)
            >= min over all plans s' of [time(s') + lambda W'(s')] + lambda (P_floor - limit)

where W' counts every weight once, at the layout of its first use (W' <= W). The minimum is
the exact optimum of a sum of unary and pairwise costs, which variable elimination computes;
so the right side is a valid lower bound on the constrained optimum for every lambda. The plans
variable elimination returns are evaluated by ``evaluate``; those within the limit are
incumbents (without a limit, lambda = 0 gives the optimum and its proof at once).
In training (``Planner.training``) every operator output stays alive until the backward, so
P >= O(s), the local bytes of every output; the relaxed problem then prices W' + O(s) and the
floor term is 0: time(s) >= min over s' of [time(s') + lambda (W'(s') + O(s'))] - lambda limit.

Before the Lagrangian search, the weight-budget bound (solver/spmd/budget.py) solves the
relaxation "W' plus the bytes held at one step fit the limit" exactly, bytes rounded down to a
unit, by variable elimination whose tables carry the units used so far, then the
activation-peak bound (every step at once); when either gives a bound the Lagrangian search is
skipped and the time left mixes their plans. :func:`least_memory_plan` bounds the least memory
per device any plan needs (docs/sharding.md, "The exact optimiser").
"""

from __future__ import annotations

import contextlib
import heapq
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from solver.core.result import OPTIMALITY_TOL
from solver.spmd.budget import (
    TimeTables,
    activation_needs,
    budget_bound,
    combine,
    least_memory,
    min_sum,
    peak_bound,
    peak_dual_bound,
    peak_values,
    step_bytes,
    step_memory,
    within_peak,
)
from solver.spmd.exact import DeadlineReached, LeastMemory, ShardModel
from solver.spmd.program import Planner, evaluate
from solver.spmd.rules import Strategy
from solver.spmd.segment_dp import LAMBDA_FACTORS, SegmentProgramme, Unsupported

MAX_TABLE = 20_000_000  # entries of the largest intermediate table variable elimination may build
BUDGET_SHARE = 0.9  # share of the Lagrangian time the weight-budget bounds and their plans may take
# share of the time left that mixing from the leanest plan may take (the bounds' plans all break
# a limit that close to the least memory; exact window solves make better use of the rest)
LEANEST_MIX_SHARE = 0.25
BUDGET_PLANS = 12  # plans evaluated from one weight-budget solve's tables (until one fits)
MIX_RESERVE = 2  # evaluations' time the mixing keeps before the deadline
BRACKET = 1.05  # the segment programme starts once the bisection's multipliers are this close


@dataclass
class LagrangeResult:
    """The best lower bound, the best plan within the limit (or None) and its time."""

    lower_bound: float
    strategies: dict[str, Strategy] | None
    objective: float
    stats: dict
    model_seconds: float = 0.0  # building the model's data (a full CP-SAT model takes longer)


class _Problem:
    """Unary and pairwise cost tables over the operators that have a choice."""

    def __init__(self, model: ShardModel) -> None:
        self.model = model
        n = len(model.cands)
        self.sizes = [len(c) for c in model.cands]
        self.free = [i for i in range(n) if self.sizes[i] > 1]
        self.const = sum(model.unary[i][0] for i in range(n) if self.sizes[i] == 1)
        self.unary = [np.array(model.unary[i], dtype=float) for i in range(n)]
        self.pairs: dict[tuple[int, int], np.ndarray] = {}
        for u, v, a_of, b_of, tm, _mm in model.edges:
            mat = np.asarray(tm, dtype=float)[np.ix_(a_of, b_of)]  # [choices of u, of v]
            if self.sizes[u] == 1 and self.sizes[v] == 1:
                self.const += float(mat[0, 0])
            elif self.sizes[u] == 1:
                self.unary[v] = self.unary[v] + mat[0]
            elif self.sizes[v] == 1:
                self.unary[u] = self.unary[u] + mat[:, 0]
            else:
                key, m = ((u, v), mat) if u < v else ((v, u), mat.T)
                self.pairs[key] = self.pairs[key] + m if key in self.pairs else m
        # the weight bytes W' of each choice (each weight at its first use's layout)
        self.wbytes = [np.zeros(self.sizes[i]) for i in range(n)]
        self.wconst = 0.0
        for us in model.weights.values():
            v, k = us[0]
            b = np.array([model.weight_bytes(v, k, sh) for sh in model.cands[v]])
            if self.sizes[v] == 1:
                self.wconst += float(b[0])
            else:
                self.wbytes[v] = self.wbytes[v] + b
        self._kept_outputs(model)
        self.order = _elimination_order(self.free, self.sizes, self.pairs)

    def _kept_outputs(self, model: ShardModel) -> None:
        """In training every operator's outputs are alive at the last step (the backward reads
        them): their bytes O of each choice join the priced memory, W' + O <= every plan's
        memory. For inference O = 0 (the activation floor is used instead)."""
        n = len(self.sizes)
        self.obytes = [np.zeros(self.sizes[i]) for i in range(n)]
        self.oconst = 0.0
        if model.pl.training is None:
            return
        for u in range(n):
            b = np.array([model.pl.output_bytes(u, sh) for sh in model.cands[u]])
            if self.sizes[u] == 1:
                self.oconst += float(b[0])
            else:
                self.obytes[u] = self.obytes[u] + b

    def solve(self, lam: float, deadline: float | None = None) -> tuple[float, list[int]]:
        """The exact minimum of time + lam * (W' + O) over all choices, and a minimiser;
        raises DeadlineReached once ``time.perf_counter()`` passes ``deadline``."""
        unary = [
            u + lam * (w + o) for u, w, o in zip(self.unary, self.wbytes, self.obytes, strict=True)
        ]
        value, choice = min_sum(self.sizes, self.order, unary, self.pairs, deadline)
        return value + self.const + lam * (self.wconst + self.oconst), choice


def _elimination_order(free, sizes, pairs) -> list[int]:
    """Greedy: eliminate next the variable whose new table is smallest (neighbours' sizes)."""
    adj: dict[int, set[int]] = {i: set() for i in free}
    for u, v in pairs:
        adj[u].add(v)
        adj[v].add(u)

    def cost(x: int) -> float:
        return math.prod(sizes[y] for y in adj[x])

    heap = [(cost(x), x) for x in free]
    heapq.heapify(heap)
    done: set[int] = set()
    order = []
    while heap:
        c, x = heapq.heappop(heap)
        if x in done or c != cost(x):
            continue
        if c * sizes[x] > MAX_TABLE:
            raise _TooWide
        done.add(x)
        order.append(x)
        nb = adj.pop(x)
        for y in nb:
            adj[y].discard(x)
            adj[y] |= nb - {y}
        for y in nb:
            heapq.heappush(heap, (cost(y), y))
    return order


class _TooWide(Exception):
    """Variable elimination would build a table above MAX_TABLE entries."""


def lagrange(
    planner: Planner,
    limit: float | None,
    pins: dict[str, Strategy],
    time_limit: float,
    iterations: int = 40,
) -> LagrangeResult | None:
    """The best Lagrangian bound and plan within ``time_limit``; None when the graph is too
    wide for variable elimination, an operator has no choice within the limit, or the time
    limit passes before the first bound (stats "lagrange_stopped" says it passed later).
    When the least bytes any plan holds at one step exceed the limit, no plan fits: no bound,
    no plan, and stats "least_memory_bound" says how many bytes every plan needs."""
    t0 = time.perf_counter()
    try:
        search = _LagrangeSearch.build(planner, limit, pins, t0, time_limit)
        model_seconds = time.perf_counter() - t0
        low = search.least_step_bytes() if search is not None and limit is not None else None
    except DeadlineReached:
        return None
    if search is None:
        return None
    if low is not None and low > limit:  # no plan fits: the least bytes at one step exceed it
        stats = {"least_memory_bound": low}
        return LagrangeResult(-math.inf, None, math.inf, stats, model_seconds)
    try:
        bracketed = search.segment_plan if planner.training is not None else None
        _search(search.run, search.budget, limit, t0, time_limit, iterations, bracketed)
    except DeadlineReached:
        if not math.isfinite(search.best_lb):
            return None
        search.stats["lagrange_stopped"] = "the time limit passed during variable elimination"
    search.segment_plan()
    search.start_from_leanest()
    search.mix()
    return replace(search.result(), model_seconds=model_seconds)


@dataclass
class _Found:
    """The best plan within the limit so far: its time and strategies."""

    objective: float
    strategies: dict[str, Strategy]


class _LagrangeSearch:
    """The state the steps of :func:`lagrange` share: the relaxed problem, the best bound
    (and which bound it is, in ``stats["binding_bound"]``), the best plan that fits, and every
    plan priced (mixed at the end)."""

    def __init__(self, planner, model: ShardModel, prob: _Problem, limit, t0, time_limit):
        self.planner, self.model, self.prob, self.limit = planner, model, prob, limit
        self.t0, self.time_limit, self.deadline = t0, time_limit, t0 + time_limit
        self.steps = model.floors()[2]
        self.p_floor = max(self.steps, default=0.0)
        # the activation bytes the relaxed problem does not price (training prices them all)
        self.unpriced_floor = self.p_floor if planner.training is None else 0.0
        self.best_lb = -math.inf
        self.best_lambda = 0.0  # the multiplier of the best Lagrangian bound
        self.segment_planned = False
        self.evaluate_seconds = 0.0  # the longest evaluation of a plan so far
        self.best: _Found | None = None
        self.stats: dict = {}
        self.evaluated = 0
        self.plans: list = []  # (strategies, program) of every plan priced

    @classmethod
    def build(cls, planner, limit, pins, t0: float, time_limit: float) -> _LagrangeSearch | None:
        """The search over the model's choices; None when an operator has no choice within
        the limit or the graph is too wide (DeadlineReached when time runs out)."""
        deadline = t0 + time_limit
        model = ShardModel(planner, limit, pins, "time", build=False, deadline=deadline)
        if model.infeasible:
            return None
        try:
            prob = _Problem(model)
        except _TooWide:
            return None
        return cls(planner, model, prob, limit, t0, time_limit)

    # ------------------------------------------------------------------ bookkeeping
    def strategies_of(self, choice: list[int]) -> dict[str, Strategy]:
        cands = self.model.cands
        return {op.name: cands[i][choice[i]].strategy for i, op in enumerate(self.planner.sm.ops)}

    def raise_bound(self, value: float, name: str) -> None:
        if value > self.best_lb:
            self.best_lb, self.stats["binding_bound"] = value, name

    def keep(self, objective: float, strategies: dict[str, Strategy]) -> None:
        """Keep a plan that fits when it beats the best so far."""
        if self.best is None or objective < self.best.objective:
            self.best = _Found(objective, strategies)

    def proven(self) -> bool:
        best = self.best
        return best is not None and best.objective - self.best_lb <= OPTIMALITY_TOL * best.objective

    def least_step_bytes(self) -> float:
        """The least bytes any plan holds at the step of the largest activation floor."""
        step = step_memory(self.model, int(np.argmax(self.steps)))
        return least_memory(self.prob, step, self.deadline).nbytes

    # ------------------------------------------------------------------ bounds and their plans
    def run(self, lam: float) -> bool:
        """Bound at ``lam``; True when its plan fits the limit."""
        value, choice = self.prob.solve(lam, self.deadline)
        limit = self.limit
        bound = value + (lam * (self.unpriced_floor - limit) if limit is not None else 0.0)
        if bound > self.best_lb:
            self.best_lambda = lam
        self.raise_bound(bound, "lagrangian")
        strategies = self.strategies_of(choice)
        t0 = time.perf_counter()
        program = evaluate(self.planner, strategies)
        self.evaluate_seconds = max(self.evaluate_seconds, time.perf_counter() - t0)
        self.plans.append((strategies, program))
        self.evaluated += 1
        ok = limit is None or program.memory_per_device <= limit
        if ok:
            self.keep(program.objective, strategies)
        return ok

    def budget(self) -> bool:
        """The weight-budget bound at the step of the largest activation floor, then (unless
        its plans prove it) the activation-peak bound, each with its plans; True when one of
        them gave a bound."""
        tb = time.perf_counter()
        deadline = tb + BUDGET_SHARE * (self.time_limit - (tb - self.t0))
        memo: dict = {}  # eliminations shared by the solves (equal layers, equal tables)
        out = self.weight_budget(deadline, memo)
        if out is not None and not self.proven():  # (no unit for one, none for the other)
            self.peak_bounds(deadline, memo)
        stats = self.stats
        stats["budget_seconds"] = round(time.perf_counter() - tb, 3)
        return self.proven() or "budget_lower_bound" in stats or "peak_lower_bound" in stats

    def weight_budget(self, deadline: float, memo: dict):
        """The weight-budget bound at the step of the largest floor, with its plans."""
        floor_step = step_memory(self.model, int(np.argmax(self.steps)))
        out = budget_bound(self.prob, self.limit, floor_step, deadline, memo)
        if out is not None and math.isfinite(out.value):
            self.raise_bound(out.value, "weight budget")
            self.stats["budget_lower_bound"] = out.value
            self.stats["budget_unit_bytes"] = out.unit
            self.budget_plans(out.tables, out.cap, out.unit, deadline)
        return out

    def peak_bounds(self, deadline: float, memo: dict) -> None:
        """The activation-peak bound, then (unless proven) the same with W' exact in bytes."""
        prob, limit, stats = self.prob, self.limit, self.stats
        try:
            needs = activation_needs(self.model, prob, deadline)
        except DeadlineReached:
            return
        peak = peak_bound(prob, limit, needs, deadline, self.budget_plans, memo)
        if peak is not None and math.isfinite(peak.value):
            self.raise_bound(peak.value, "activation peak")
            stats["peak_lower_bound"] = peak.value
            stats["peak_caps_solved"] = peak.solved
        if not self.proven():
            dual = peak_dual_bound(prob, limit, needs, deadline, self.choice_plan)
            if dual is not None:
                self.raise_bound(dual.value, "activation peak, exact weights")
                stats["peak_dual_lower_bound"] = dual.value

    def budget_plans(self, tables, cap: int, unit: int, deadline: float | None = None) -> float:
        """Plans of one weight-budget solve's tables, the least time first, until one fits:
        each next one at fewer units (by the bytes the last one was over); returns the time of
        the best plan that fits so far (inf if none)."""
        top = cap
        for k in range(BUDGET_PLANS):
            level = tables.best_level(top)
            if level is None or (k and deadline is not None and time.perf_counter() > deadline):
                break
            strategies = self.strategies_of(tables.choice(level))
            program = evaluate(self.planner, strategies)
            self.plans.append((strategies, program))
            over = program.memory_per_device - self.limit
            if over <= 0:
                self.keep(program.objective, strategies)
                break
            top = level - max(1, math.ceil(over / unit))
        return math.inf if self.best is None else self.best.objective

    def choice_plan(self, choice: list[int]) -> None:
        """A minimiser of a bound, priced: the best plan when it fits and is faster."""
        strategies = self.strategies_of(choice)
        program = evaluate(self.planner, strategies)
        best = self.best
        if program.memory_per_device <= self.limit and (
            best is None or program.objective < best.objective
        ):
            self.keep(program.objective, strategies)
            self.plans.append((strategies, program))

    # ------------------------------------------------------------------ mixing, the result
    def segment_plan(self) -> None:
        """The dynamic programme over the segments (solver/spmd/segment_dp.py), its options
        the minimisers of each segment at multiples of the best multiplier: a plan that fits
        close to the Lagrangian bound when the limit binds (repeated layers mixed). Training
        only: there the memory is a sum over the segments (weights and kept outputs) plus one
        copy set; in inference the activation peak is not."""
        lam = self.best_lambda
        if self.planner.training is None or self.limit is None or lam <= 0 or self.proven():
            return
        if self.segment_planned:
            return
        self.segment_planned = True
        if time.perf_counter() > self.deadline:
            return
        t0 = time.perf_counter()
        try:
            programme = SegmentProgramme(
                self.planner, self.model, self.prob, segments(self.planner)
            )
        except Unsupported:
            return
        found = None
        if programme.build_options([lam * f for f in LAMBDA_FACTORS], self.deadline):
            found = programme.plan(self.limit, self.deadline)
        self.stats["segment_plan_seconds"] = round(time.perf_counter() - t0, 3)
        if found is not None:
            self.plans.append((found.strategies, found.program))
            self.keep(found.objective, found.strategies)
            self.stats["segment_plan"] = found.objective

    def start_from_leanest(self) -> None:
        """No plan fits yet (a limit near the least memory): the leanest plan starts the
        mixing."""
        if self.best is not None or self.limit is None or time.perf_counter() >= self.deadline:
            return
        with contextlib.suppress(DeadlineReached):
            lean = _leanest(self.planner, self.model, self.prob, self.deadline)
            self.plans.append((lean.strategies, evaluate(self.planner, lean.strategies)))
            if lean.upper <= self.limit:
                self.best = _Found(self.plans[-1][1].objective, lean.strategies)
                self.stats["leanest_plan_started_mixing"] = True

    def mix(self) -> None:
        """Segments of the plans priced, packed and mixed into a faster plan that fits."""
        limit, plans, planner = self.limit, self.plans, self.planner
        if self.best is None or limit is None or len(plans) <= 1 or self.proven():
            return
        end = self.deadline - MIX_RESERVE * self.evaluate_seconds  # the last one ends in time
        if self.stats.get("leanest_plan_started_mixing"):  # the rest for exact windows
            end = time.perf_counter() + LEANEST_MIX_SHARE * (end - time.perf_counter())
        packed = knapsack_segments(planner, plans, limit) if time.perf_counter() < end else None
        mixed = mix_segments(planner, plans, limit, end)
        for found in (packed, mixed):
            if found is not None:
                self.keep(found.objective, found.strategies)
        if packed is not None and time.perf_counter() < end:
            start = (packed.strategies, evaluate(planner, packed.strategies))
            again = mix_segments(planner, [start, *plans], limit, end, start)
            if again is not None:
                self.keep(again.objective, again.strategies)

    def result(self) -> LagrangeResult:
        stats = {
            **self.stats,
            "lagrange_seconds": round(time.perf_counter() - self.t0, 3),
            "lagrange_plans": self.evaluated,
            "activation_floor": self.p_floor,
        }
        if self.best is None:
            return LagrangeResult(self.best_lb, None, math.inf, stats)
        return LagrangeResult(self.best_lb, self.best.strategies, self.best.objective, stats)


def _search(
    run, budget, limit, t0: float, time_limit: float, iterations: int, bracketed=None
) -> None:
    """lambda = 0, then the weight-budget bounds, then, only when they gave no bound (they are
    at least as tight where they exist, and the time left goes to mixing their plans),
    bisection on lambda (on a log scale) between a lambda whose plan does not fit and one
    whose plan fits. With ``bracketed`` (training: the segment programme) the bisection runs
    first, ``bracketed()`` once the two multipliers are within BRACKET of each other (the
    multiplier is known well enough to build plans from), and the weight-budget bounds get
    the time left after it (in training they seldom find a unit, and slowly)."""
    if run(0.0) or limit is None:
        return
    if bracketed is None and budget():
        return
    _bisect(run, t0, time_limit, iterations, bracketed)
    if bracketed is not None and time.perf_counter() - t0 < time_limit:
        budget()


def _bisect(run, t0: float, time_limit: float, iterations: int, bracketed) -> None:
    """The bisection of :func:`_search`."""
    lo, hi = 0.0, None
    lam = 1e-12
    while hi is None and time.perf_counter() - t0 < time_limit and lam < 1e6:
        if run(lam):
            hi = lam
        else:
            lo, lam = lam, lam * 10
    for _ in range(iterations):
        if hi is None or time.perf_counter() - t0 > time_limit or hi - lo <= 1e-9 * hi:
            break
        if bracketed is not None and lo > 0 and hi <= BRACKET * lo:
            bracketed()
            bracketed = None
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 10
        if run(mid):
            hi = mid
        else:
            lo = mid


def segments(planner: Planner) -> list[range]:
    """Ranges of the topological order separated by points where at most one activation is
    alive (a transformer's layer boundaries): plans can be mixed segment by segment there."""
    sm = planner.sm
    n = len(sm.ops)
    last = [-1] * n
    for v in range(n):
        for u, _, _ in planner.in_edges[v]:
            last[u] = max(last[u], v)
    crossing = [0] * (n + 1)  # activations produced at <= p and consumed after p
    for u in range(n):
        for p in range(u, last[u]):
            crossing[p] += 1
    out, start = [], 0
    for p in range(n - 1):
        if crossing[p] <= 1:
            out.append(range(start, p + 1))
            start = p + 1
    out.append(range(start, n))
    return out


@dataclass
class _PlanCosts:
    """One priced plan, per operator: its time (compute + communication) and the bytes it
    adds up (its weights; in training also its outputs, all alive at the last step)."""

    strategies: dict[str, Strategy]
    time: np.ndarray
    weights: np.ndarray
    peak: float  # its activation peak (in training: above its outputs' bytes)


def _plan_costs(planner: Planner, strategies: dict[str, Strategy], program) -> _PlanCosts:
    sm = planner.sm
    shs = program.shardings
    w = np.array([planner.weight_bytes(i, shs[i]) for i in range(len(sm.ops))])
    peak = program.peak_activation_memory
    if planner.training is not None:
        kept = np.array([planner.output_bytes(i, shs[i]) for i in range(len(sm.ops))])
        w, peak = w + kept, max(0.0, peak - float(kept.sum()))
    return _PlanCosts(strategies, program.time_per_op(), w, peak)


@dataclass
class _Move:
    """Give segments ``start`` .. ``end - 1`` the choices of plan ``option``: ``saved`` (< 0)
    the estimated change of time, ``ratio`` that per byte added."""

    ratio: float
    saved: float
    start: int
    end: int
    option: int


def _objective_of(plan) -> float:
    _, program = plan
    return program.objective


def mix_segments(planner: Planner, plans: list, limit: float, deadline: float, start=None):
    """Greedy knapsack over segments: from the fastest plan within the limit, move a run of
    consecutive segments to the choices of another (faster, bigger) plan while the result
    still fits and is faster, best estimated time saved per byte added first (a run, not one
    segment, so that a single mismatch at its ends is paid); ``start`` = (strategies, program)
    starts from that plan instead. Returns the plan (a _Found) or None."""
    fitting = [(s, p) for s, p in plans if p.memory_per_device <= limit]
    if not fitting:
        return None
    cur, prog = start if start is not None else min(fitting, key=_objective_of)
    segs = segments(planner)
    if len(segs) < 2:
        return None
    mixer = _Mixer(planner, segs, [_plan_costs(planner, s, p) for s, p in plans])
    return mixer.run(cur, prog, limit, deadline)


class _Mixer:
    """The moves of :func:`mix_segments` over fixed segments and plans."""

    def __init__(self, planner: Planner, segs: list[range], options: list[_PlanCosts]) -> None:
        self.planner, self.segs, self.options = planner, segs, options
        sm = planner.sm
        self.names = [op.name for op in sm.ops]
        self.nseg = nseg = len(segs)
        self.seg_of = np.empty(len(sm.ops), dtype=np.int64)
        for j, seg in enumerate(segs):
            self.seg_of[seg.start : seg.stop] = j
        self.upper = np.triu(np.ones((nseg + 1, nseg + 1), dtype=bool), k=1)  # [j, k), j < k
        self.single = np.eye(nseg + 1, k=1, dtype=bool)  # one segment: [j, j + 1)

    def run(self, cur: dict, prog, limit: float, deadline: float) -> _Found:
        """Single segments first; runs of several once those stop paying."""
        runs = self.single
        while time.perf_counter() < deadline:
            moved = self.first_move(
                self.moves(cur, prog, runs), cur, prog.objective, limit, deadline
            )
            if moved is not None:
                cur, prog = moved
                runs = self.single
            elif runs is self.single:
                runs = self.upper
            else:
                break
        return _Found(prog.objective, cur)

    def prefix(self, per_op: np.ndarray) -> np.ndarray:
        """Sums over the first j segments, j = 0 .. nseg."""
        return np.concatenate([[0.0], np.cumsum(np.bincount(self.seg_of, per_op, self.nseg))])

    def moves(self, cur: dict, prog, runs: np.ndarray) -> list[_Move]:
        """Every run (of ``runs``) another plan makes faster, best ratio first."""
        now = _plan_costs(self.planner, cur, prog)
        out = []
        for o, opt in enumerate(self.options):
            differs = np.array([opt.strategies[x] != cur[x] for x in self.names], dtype=float)
            dif = self.prefix(differs)
            c_t = self.prefix(opt.time - now.time)
            c_m = self.prefix(opt.weights - now.weights)
            dt = c_t[None, :] - c_t[:, None]
            dm = c_m[None, :] - c_m[:, None]
            ok = runs & (dt < 0) & (dif[None, :] - dif[:, None] > 0)
            for j, k in zip(*np.nonzero(ok), strict=True):
                ratio = dt[j, k] / dm[j, k] if dm[j, k] > 0 else -math.inf
                out.append(_Move(ratio, dt[j, k], int(j), int(k), o))
        out.sort(key=lambda m: (m.ratio, m.saved))
        return out

    def first_move(self, moves: list[_Move], cur: dict, cur_t: float, limit, deadline):
        """The first move whose plan fits and is faster: (strategies, program), or None."""
        names, seen = self.names, set()
        for m in moves:
            if time.perf_counter() > deadline:
                break
            s = self.options[m.option].strategies
            span = range(self.segs[m.start].start, self.segs[m.end - 1].stop)
            key = (m.start, m.end, tuple(s[names[v]] for v in span))
            if key in seen:  # the same run of choices from another plan
                continue
            seen.add(key)
            trial = dict(cur)
            for v in span:
                trial[names[v]] = s[names[v]]
            p = evaluate(self.planner, trial)
            if p.memory_per_device <= limit and p.objective < cur_t * (1 - 1e-12):
                return trial, p
        return None


KNAPSACK_BUCKETS = 4000  # resolution of the weight budget in knapsack_segments


@dataclass
class _SegmentChoice:
    """One plan's choices on one segment: their time and weight bytes."""

    time: float
    weights: float
    plan: int  # index into the plans


def knapsack_segments(planner: Planner, plans: list, limit: float, tries: int = 4):
    """Pick, for every segment, the choices of one of ``plans`` so that the time is least and
    the weights fit beside the largest activation peak of the plans (a multiple-choice knapsack
    solved by dynamic programming, weights rounded up); the result is re-evaluated, and the
    budget shrunk by the excess when it does not fit. Returns the plan (a _Found) or None."""
    sm = planner.sm
    segs = segments(planner)
    if len(segs) < 2:
        return None
    per = [_plan_costs(planner, s, p) for s, p in plans]
    options = [_segment_choices(sm, seg, per) for seg in segs]  # distinct assignments only
    budget = limit - max(x.peak for x in per)
    for _ in range(tries):
        if budget <= 0:
            break
        chosen = _pack(options, budget / KNAPSACK_BUCKETS)
        if chosen is None:
            return None
        trial = {}
        for seg, opts, o in zip(segs, options, chosen, strict=True):
            s = per[opts[o].plan].strategies
            for v in seg:
                trial[sm.ops[v].name] = s[sm.ops[v].name]
        p = evaluate(planner, trial)
        if p.memory_per_device <= limit:
            return _Found(p.objective, trial)
        budget -= p.memory_per_device - limit  # shrink by the excess and pack again
    return None


def _segment_choices(sm, seg: range, per: list[_PlanCosts]) -> list[_SegmentChoice]:
    seen, out = set(), []
    for k, pc in enumerate(per):
        key = tuple(pc.strategies[sm.ops[v].name] for v in seg)
        if key not in seen:
            seen.add(key)
            t = float(pc.time[seg.start : seg.stop].sum())
            out.append(_SegmentChoice(t, float(pc.weights[seg.start : seg.stop].sum()), k))
    return out


def _pack(options: list[list[_SegmentChoice]], unit: float) -> list[int] | None:
    """The least-time choice per segment whose weights, rounded up to ``unit``, fit in
    KNAPSACK_BUCKETS units (dynamic programming); None when none fits."""
    cap = KNAPSACK_BUCKETS
    cost = np.zeros(cap + 1)
    picks = []
    for opts in options:
        new = np.full(cap + 1, math.inf)
        arg = np.full(cap + 1, -1)
        for o, choice in enumerate(opts):
            c = math.ceil(choice.weights / unit - 1e-9)
            if c > cap:
                continue
            cand = np.full(cap + 1, math.inf)
            cand[c:] = cost[: cap + 1 - c] + choice.time
            better = cand < new
            new[better], arg[better] = cand[better], o
        cost = new
        picks.append(arg)
    if not math.isfinite(cost[-1]):
        return None
    b, chosen = cap, []
    for j in range(len(options) - 1, -1, -1):
        o = int(picks[j][b])
        chosen.append(o)
        b -= math.ceil(options[j][o].weights / unit - 1e-9)
    chosen.reverse()
    return chosen


LEAST_MEMORY_TRIES = 6  # steps whose least bytes are bounded in least_memory_plan


def least_memory_plan(
    planner: Planner, pins: dict[str, Strategy], time_limit: float
) -> LeastMemory | None:
    """The least memory per device any plan needs, bounded below by the least bytes held at
    one step (W' + activations + copies, exact by variable elimination: every plan holds at
    least that there) and by the activation-peak relaxation (min over Q of Q + the least W' of
    the plans needing no peak above Q), and above by the leanest plan found (each minimiser,
    with every step's bytes as a tie-break, priced by evaluate). None when the model cannot be
    built in time or is too wide."""
    deadline = time.perf_counter() + time_limit
    try:
        model = ShardModel(planner, None, pins, "time", build=False, deadline=deadline)
        prob = _Problem(model)
        return _leanest(planner, model, prob, deadline)
    except (DeadlineReached, _TooWide):
        return None


def _leanest(planner, model: ShardModel, prob: _Problem, deadline: float) -> LeastMemory:
    """The least memory interval over the choices of ``model`` (see least_memory_plan)."""
    every = _every_step(model)
    best = _lean_at_steps(planner, model, prob, every, deadline)
    if not best.exact:
        _lean_by_peak(planner, model, prob, every, best, deadline)
    return best


def _every_step(model: ShardModel):
    """Every step's bytes, summed and scaled so that they add at most a quarter of the largest
    (the tie-break of the leanest plan: the steps not minimised stay lean too)."""
    steps = range(len(model.cands))
    return combine([step_memory(model, v) for v in steps], 1 / (4 * len(steps)))


def _lean_plan(planner: Planner, model: ShardModel, choice: list[int]) -> LeastMemory:
    """A plan and its memory per device (as the upper end of a LeastMemory, lower 0)."""
    s = {
        op.name: model.cands[i][c].strategy
        for i, (op, c) in enumerate(zip(planner.sm.ops, choice, strict=True))
    }
    return LeastMemory(0.0, evaluate(planner, s).memory_per_device, s)


def _lean_at_steps(planner, model, prob, every, deadline: float) -> LeastMemory:
    """The least bytes at the step of the largest floor, then at the peak step of the plan
    minimising them (up to LEAST_MEMORY_TRIES steps): the best lower and upper ends."""
    step, tried, best = int(np.argmax(model.floors()[2])), set(), None
    lower = 0.0
    while len(tried) < LEAST_MEMORY_TRIES and step not in tried:
        tried.add(step)
        mem = step_memory(model, step)
        lower = max(lower, least_memory(prob, mem, deadline).nbytes)
        lean = least_memory(prob, combine([mem, every]), deadline)
        plan = _lean_plan(planner, model, lean.choice)
        if best is None or plan.upper < best.upper:
            best = plan
        best.lower = lower
        if best.exact:
            break
        step = int(np.argmax(step_bytes(model, lean.choice)))
    return best


def _lean_by_peak(planner, model, prob, every, best: LeastMemory, deadline: float) -> None:
    """Raise ``best.lower`` (and lower ``best.upper``) by the activation-peak relaxation: a
    plan s with peak P makes no choice or pair needing more than Q(s) = max(floor, its needs)
    <= P, so its memory W + P >= Q(s) + the least W' of the plans within Q(s). Peaks Q are the
    floor and the needs above it, ascending, while Q + least W' is below the best so far."""
    needs = activation_needs(model, prob, deadline)
    wmin = prob.wconst + sum(float(w.min()) for w in prob.wbytes)
    weights = TimeTables(prob.sizes, prob.free, prob.wbytes, {}, prob.wconst)
    lower = best.upper  # no plan needs more than the leanest found
    for q in peak_values(prob, math.inf, needs):
        if q + wmin >= min(lower, best.upper):  # this peak and every larger one need more
            break
        allowed = within_peak(weights, needs, q)
        value, _ = min_sum(prob.sizes, prob.order, allowed.unary, allowed.pairs, deadline)
        lower = min(lower, q + value + prob.wconst)
        if q + value + prob.wconst < best.upper:  # a leaner plan may be among these
            unary = [u + every.unary.get(i, 0.0) for i, u in enumerate(allowed.unary)]
            pairs = dict(allowed.pairs)
            for k, m in every.pairs.items():
                pairs[k] = pairs[k] + m if k in pairs else m
            _, choice = min_sum(prob.sizes, prob.order, unary, pairs, deadline)
            plan = _lean_plan(planner, model, choice)
            if plan.upper < best.upper:
                best.upper, best.strategies = plan.upper, plan.strategies
    best.lower = max(best.lower, min(lower, best.upper))
