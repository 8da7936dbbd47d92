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

Before the Lagrangian search, the weight-budget bound (solver/sharding/budget.py) solves the
relaxation "W' plus the outputs alive at one step fit the limit" exactly, bytes rounded down to
a unit, by variable elimination whose tables carry the units used so far: no duality gap, and
its minimiser, when it fits, is the optimum (docs/sharding.md, "The exact optimiser").
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

import numpy as np

from solver.plan import OPTIMALITY_TOL
from solver.sharding.budget import budget_bound, live_bytes, peak_step
from solver.sharding.exact import DeadlineReached, ShardModel
from solver.sharding.program import Planner, evaluate
from solver.sharding.redistribute import local_bytes
from solver.sharding.rules import Strategy

MAX_TABLE = 20_000_000  # entries of the largest intermediate table variable elimination may build
BUDGET_SHARE = 0.5  # share of the Lagrangian time the weight-budget bound and its plans may take
BUDGET_TRIES = 2  # weight-budget solves after the first (another step, or a shrunk budget)


@dataclass
class LagrangeResult:
    """The best lower bound, the best plan within the limit (or None) and its time."""

    lower_bound: float
    strategies: dict[str, Strategy] | None
    objective: float
    stats: dict


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
        sm = model.sm
        self.wbytes = [np.zeros(self.sizes[i]) for i in range(n)]
        self.wconst = 0.0
        for t, us in model.weights.items():
            v, k = us[0]
            b = np.array([local_bytes(sh.in_layouts[k], sm.itemsize(t)) for sh in model.cands[v]])
            if self.sizes[v] == 1:
                self.wconst += float(b[0])
            else:
                self.wbytes[v] = self.wbytes[v] + b
        self.order = _elimination_order(self.free, self.sizes, self.pairs)

    def solve(self, lam: float, deadline: float | None = None) -> tuple[float, list[int]]:
        """The exact minimum of time + lam * W' over all choices, and a minimiser; raises
        DeadlineReached once ``time.perf_counter()`` passes ``deadline``."""
        factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        by_var: dict[int, set[int]] = {i: set() for i in self.free}
        fid = 0
        for i in self.free:
            factors[fid] = ((i,), self.unary[i] + lam * self.wbytes[i])
            by_var[i].add(fid)
            fid += 1
        for (u, v), m in self.pairs.items():
            factors[fid] = ((u, v), m)
            by_var[u].add(fid)
            by_var[v].add(fid)
            fid += 1
        trace = []
        total = 0.0
        for x in self.order:
            if deadline is not None and time.perf_counter() > deadline:
                raise DeadlineReached
            fs = [factors.pop(f) for f in sorted(by_var[x])]
            scope = sorted({y for sc, _ in fs for y in sc})
            shape = [self.sizes[y] for y in scope]
            acc = np.zeros(shape)
            for sc, arr in fs:
                idx = [scope.index(y) for y in sc]
                perm = np.argsort(idx)
                view = np.transpose(arr, perm)
                full = [1] * len(scope)
                for y in sc:
                    full[scope.index(y)] = self.sizes[y]
                acc = acc + view.reshape(full)
            ax = scope.index(x)
            arg = np.argmin(acc, axis=ax)
            red = np.min(acc, axis=ax)
            rest = tuple(y for y in scope if y != x)
            trace.append((x, rest, arg))
            for y in scope:
                by_var[y] -= {f for f in list(by_var[y]) if f not in factors}
            if rest:
                factors[fid] = (rest, red)
                for y in rest:
                    by_var[y].add(fid)
                fid += 1
            else:
                total += float(red)
        choice = [0] * len(self.sizes)
        for x, rest, arg in reversed(trace):
            choice[x] = int(arg[tuple(choice[y] for y in rest)]) if rest else int(arg)
        return total + self.const + lam * self.wconst, choice


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
    limit passes before the first bound (stats "lagrange_stopped" says it passed later)."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    try:
        model = ShardModel(planner, limit, pins, "time", build=False, deadline=deadline)
    except DeadlineReached:
        return None
    if model.infeasible:
        return None
    try:
        prob = _Problem(model)
    except _TooWide:
        return None
    sm = planner.sm
    _wmin, _omin, steps = model.floors()
    p_floor = max(steps, default=0.0)
    best_lb, best = -math.inf, None
    stats: dict = {}
    evaluated = 0
    plans: list = []

    def run(lam: float) -> bool:
        """Bound at ``lam``; True when its plan fits the limit."""
        nonlocal best_lb, best, evaluated
        value, choice = prob.solve(lam, deadline)
        lb = value + (lam * (p_floor - limit) if limit is not None else 0.0)
        if lb > best_lb:
            best_lb, stats["binding_bound"] = lb, "lagrangian"
        strategies = {op.name: model.cands[i][choice[i]].strategy for i, op in enumerate(sm.ops)}
        program = evaluate(planner, strategies)
        plans.append((strategies, program))
        evaluated += 1
        ok = limit is None or program.memory_per_device <= limit
        if ok and (best is None or program.objective < best[0]):
            best = (program.objective, strategies)
        return ok

    def budget() -> bool:
        """The weight-budget bounds and their plans: first with the outputs alive at the step
        of the largest activation floor, then at the peak step of a plan that does not fit (a
        new bound) or with the budget shrunk by its excess; True when a plan that fits meets
        the best bound (proven optimal)."""
        nonlocal best_lb, best
        tb = time.perf_counter()
        deadline = tb + BUDGET_SHARE * (time_limit - (tb - t0))
        step, cap, tried = int(np.argmax(steps)), None, set()
        for _ in range(1 + BUDGET_TRIES):
            out = budget_bound(prob, limit, live_bytes(model, step), deadline, cap)
            if out is None or not math.isfinite(out[0]):
                break
            value, choice, room, unit = out
            if cap is None:
                tried.add(step)
                if value > best_lb:
                    best_lb, stats["binding_bound"] = value, "weight budget"
                stats["budget_lower_bound"] = max(value, stats.get("budget_lower_bound", value))
                stats["budget_unit_bytes"] = unit
            strategies = {
                op.name: model.cands[i][choice[i]].strategy for i, op in enumerate(sm.ops)
            }
            program = evaluate(planner, strategies)
            plans.append((strategies, program))
            over = program.memory_per_device - limit
            if over <= 0 and (best is None or program.objective < best[0]):
                best = (program.objective, strategies)
            if over <= 0 or (best is not None and best[0] - best_lb <= OPTIMALITY_TOL * best[0]):
                break
            peak = peak_step(model, choice)
            if peak not in tried:
                step, cap = peak, None
            else:
                cap = room - over
        stats["budget_seconds"] = round(time.perf_counter() - tb, 3)
        return best is not None and best[0] - best_lb <= OPTIMALITY_TOL * best[0]

    try:
        _search(run, budget, limit, t0, time_limit, iterations)
    except DeadlineReached:
        if not math.isfinite(best_lb):
            return None
        stats["lagrange_stopped"] = "the time limit passed during variable elimination"
    proven = best is not None and best[0] - best_lb <= OPTIMALITY_TOL * best[0]
    if best is not None and limit is not None and len(plans) > 1 and not proven:
        packed = knapsack_segments(planner, plans, limit)
        mixed = mix_segments(planner, plans, limit, t0 + time_limit)
        for found in (packed, mixed):
            if found is not None and found[0] < best[0]:
                best = found
        if packed is not None and time.perf_counter() < t0 + time_limit:
            start = (packed[1], evaluate(planner, packed[1]))
            again = mix_segments(planner, [start, *plans], limit, t0 + time_limit, start)
            if again is not None and again[0] < best[0]:
                best = again
    stats = {
        **stats,
        "lagrange_seconds": round(time.perf_counter() - t0, 3),
        "lagrange_plans": evaluated,
        "activation_floor": p_floor,
    }
    if best is None:
        return LagrangeResult(best_lb, None, math.inf, stats)
    return LagrangeResult(best_lb, best[1], best[0], stats)


def _search(run, budget, limit, t0: float, time_limit: float, iterations: int) -> None:
    """lambda = 0, then the weight-budget bound, then bisection on lambda (on a log scale)
    between a lambda whose plan does not fit and one whose plan fits."""
    if not run(0.0) and limit is not None and not budget():
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


def mix_segments(planner: Planner, plans: list, limit: float, deadline: float, start=None):
    """Greedy knapsack over segments: from the fastest plan within the limit, move a run of
    consecutive segments to the choices of another (faster, bigger) plan while the result
    still fits and is faster, best estimated time saved per byte added first (a run, not one
    segment, so that a single mismatch at its ends is paid); ``start`` = (strategies, program)
    starts from that plan instead. Returns (time, strategies) or None."""
    sm = planner.sm
    fitting = [(p.objective, s, p) for s, p in plans if p.memory_per_device <= limit]
    if not fitting:
        return None
    cur_t, cur, prog = min(fitting, key=lambda x: x[0])
    if start is not None:
        cur, prog = start
        cur_t = prog.objective
    segs = segments(planner)
    if len(segs) < 2:
        return None

    n, nseg = len(sm.ops), len(segs)
    names = [op.name for op in sm.ops]
    seg_of = np.empty(n, dtype=np.int64)
    for j, seg in enumerate(segs):
        seg_of[seg.start : seg.stop] = j

    def per_op(program):
        w = np.array([planner.weight_bytes(i, program.shardings[i]) for i in range(n)])
        return np.add(program.compute, program.comm), w

    options = [(*per_op(p), s) for s, p in plans]
    upper = np.triu(np.ones((nseg + 1, nseg + 1), dtype=bool), k=1)  # intervals [j, k), j < k
    single = np.eye(nseg + 1, k=1, dtype=bool)  # one segment: [j, j + 1)
    runs = single  # single segments first; runs of several once those stop paying
    while time.perf_counter() < deadline:
        ct, cw = per_op(prog)
        moves = []
        for o, (t, w, s) in enumerate(options):
            differs = np.array([s[x] != cur[x] for x in names], dtype=float)
            dif = np.concatenate([[0.0], np.cumsum(np.bincount(seg_of, differs, nseg))])
            c_t = np.concatenate([[0.0], np.cumsum(np.bincount(seg_of, t - ct, nseg))])
            c_m = np.concatenate([[0.0], np.cumsum(np.bincount(seg_of, w - cw, nseg))])
            dt = c_t[None, :] - c_t[:, None]
            dm = c_m[None, :] - c_m[:, None]
            ok = runs & (dt < 0) & (dif[None, :] - dif[:, None] > 0)
            for j, k in zip(*np.nonzero(ok), strict=True):
                ratio = dt[j, k] / dm[j, k] if dm[j, k] > 0 else -math.inf
                moves.append((ratio, dt[j, k], int(j), int(k), o))
        moves.sort(key=lambda m: (m[0], m[1]))
        found = False
        seen = set()
        for _, _, j, k, o in moves:
            if time.perf_counter() > deadline:
                break
            s = options[o][2]
            key = (j, k, tuple(s[names[v]] for v in range(segs[j].start, segs[k - 1].stop)))
            if key in seen:  # the same run of choices from another plan
                continue
            seen.add(key)
            trial = dict(cur)
            for v in range(segs[j].start, segs[k - 1].stop):
                trial[names[v]] = s[names[v]]
            p = evaluate(planner, trial)
            if p.memory_per_device <= limit and p.objective < cur_t * (1 - 1e-12):
                cur_t, cur, prog = p.objective, trial, p
                found = True
                break
        if found:
            runs = single
        elif runs is single:
            runs = upper
        else:
            break
    return cur_t, cur


KNAPSACK_BUCKETS = 4000  # resolution of the weight budget in knapsack_segments


def knapsack_segments(planner: Planner, plans: list, limit: float, tries: int = 4):
    """Pick, for every segment, the choices of one of ``plans`` so that the time is least and
    the weights fit beside the largest activation peak of the plans (a multiple-choice knapsack
    solved by dynamic programming, weights rounded up); the result is re-evaluated, and the
    budget shrunk by the excess when it does not fit. Returns (time, strategies) or None."""
    sm = planner.sm
    segs = segments(planner)
    if len(segs) < 2:
        return None
    n = len(sm.ops)
    per = []
    for s, p in plans:
        t = np.add(p.compute, p.comm)
        w = np.array([planner.weight_bytes(i, p.shardings[i]) for i in range(n)])
        per.append((s, t, w, p.peak_activation_memory))
    act = max(x[3] for x in per)
    options = []  # per segment: (time, weight bytes, plan index), distinct assignments only
    for seg in segs:
        seen, opts = set(), []
        for k, (s, t, w, _a) in enumerate(per):
            key = tuple(s[sm.ops[v].name] for v in seg)
            if key not in seen:
                seen.add(key)
                opts.append(
                    (float(t[seg.start : seg.stop].sum()), float(w[seg.start : seg.stop].sum()), k)
                )
        options.append(opts)
    budget = limit - act
    best = None
    for _ in range(tries):
        if budget <= 0:
            break
        unit = budget / KNAPSACK_BUCKETS
        cost = np.zeros(KNAPSACK_BUCKETS + 1)
        picks = []
        for opts in options:
            new = np.full(KNAPSACK_BUCKETS + 1, math.inf)
            arg = np.full(KNAPSACK_BUCKETS + 1, -1)
            for o, (t, w, _k) in enumerate(opts):
                c = math.ceil(w / unit - 1e-9)
                if c > KNAPSACK_BUCKETS:
                    continue
                cand = np.full(KNAPSACK_BUCKETS + 1, math.inf)
                cand[c:] = cost[: KNAPSACK_BUCKETS + 1 - c] + t
                better = cand < new
                new[better], arg[better] = cand[better], o
            cost = new
            picks.append(arg)
        if not math.isfinite(cost[-1]):
            return best
        b, chosen = KNAPSACK_BUCKETS, []
        for j in range(len(segs) - 1, -1, -1):
            o = int(picks[j][b])
            chosen.append(o)
            b -= math.ceil(options[j][o][1] / unit - 1e-9)
        chosen.reverse()
        trial = {}
        for seg, opts, o in zip(segs, options, chosen, strict=True):
            s = per[opts[o][2]][0]
            for v in seg:
                trial[sm.ops[v].name] = s[sm.ops[v].name]
        p = evaluate(planner, trial)
        if p.memory_per_device <= limit:
            if best is None or p.objective < best[0]:
                best = (p.objective, trial)
            return best
        budget -= p.memory_per_device - limit  # shrink by the excess and pack again
    return best
