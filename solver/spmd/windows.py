"""Plans near the least memory: exact CP-SAT solves on a window of consecutive segments (every
operator outside it fixed to the current plan, every step's memory exact), and the window's
choices copied to every segment with the same structure (a transformer's identical layers).

Mixing whole segments of the bounds' plans (lagrange.py) breaks a limit that leaves no room:
their activations at some step add up past it. Here every candidate plan is the solution of
the exact model (solver/spmd/exact.py) on the window, so it fits whatever the rest holds,
and every copy is re-evaluated by ``evaluate`` and kept only when it fits and is faster.
Plans only: no bound comes from here (a bound on a restricted problem is not a bound).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from solver.spmd.exact import ExactOptions, solve_exact
from solver.spmd.lagrange import segments
from solver.spmd.program import Planner, Program, evaluate
from solver.spmd.rules import Strategy

WINDOW_PERIODS = 2  # a window spans this many periods of the repeating segments
MIN_SOLVE_SECONDS = 2.0  # no window solve is started with less time left
TIED_SOLVE_SECONDS = 10.0  # nor the solve of all repeating segments at once (its build: ~5 s)


@dataclass
class WindowPlan:
    """A plan that fits, its program, and how many window solves and copies improved it."""

    strategies: dict[str, Strategy]
    program: Program
    improved: int = 0


def segment_signatures(planner: Planner, segs: list[range]) -> list[tuple]:
    """Per segment, what its operators are position by position: type, candidate strategies
    with the shapes they place, and the in-edges (relative inside the segment, else -1).
    Segments with equal signatures have the same choices in the same order."""
    out = []
    for seg in segs:
        sig = []
        for i in seg:
            cands = tuple(
                (c.strategy, tuple(lay.shape for lay in c.out_layouts))
                for c in planner.candidates(i)
            )
            edges = tuple(
                (u - seg.start if u in seg else -1, pos, k) for u, pos, k in planner.in_edges[i]
            )
            sig.append((planner.sm.ops[i].op_type, cands, edges))
        out.append(tuple(sig))
    return out


def repeating_window(sigs: list[tuple]) -> range | None:
    """Segment indices of a window of WINDOW_PERIODS periods in the middle of the longest run
    where the signatures repeat with the smallest period; None when nothing repeats."""
    n = len(sigs)
    for period in range(1, n // 2 + 1):
        best_start, best_len, start = 0, 0, 0
        for j in range(n - period + 1):
            if j + period >= n or sigs[j] != sigs[j + period]:
                if j + period - start > best_len:
                    best_start, best_len = start, j + period - start
                start = j + 1
        if best_len >= 3 * period:
            middle = best_start + (best_len // (2 * period)) * period - period
            middle = max(best_start, middle)
            return range(middle, middle + WINDOW_PERIODS * period)
    return None


def _solve_window(planner, limit, pins, cur: WindowPlan, idx: set[int], deadline, workers):
    """The exact optimum on the operators ``idx``, everything else as in ``cur``: a plan that
    fits (re-evaluated) or None."""
    names = [op.name for op in planner.sm.ops]
    fixed = {n: cur.strategies[n] for i, n in enumerate(names) if i not in idx}
    fixed.update(pins)
    opts = ExactOptions(time_limit=max(0.0, deadline - time.perf_counter()), workers=workers)
    res = solve_exact(planner, limit, fixed, [cur.strategies], opts, cur.program.objective)
    if res.strategies is None:
        return None
    program = evaluate(planner, res.strategies)
    if program.memory_per_device > limit:
        return None
    return WindowPlan(res.strategies, program)


def _copy_segments(planner, pins, plan: WindowPlan, ties) -> dict:
    """``plan`` with every counterpart set to its source's choice (pins kept)."""
    names = [op.name for op in planner.sm.ops]
    out = dict(plan.strategies)
    for a, b in ties:
        if names[b] not in pins:
            out[names[b]] = plan.strategies[names[a]]
    return out


def _tied_solve(planner, limit, pins, cur: WindowPlan, ties, deadline, workers):
    """The exact model over every operator with each segment of the repeating run choosing
    as its source segment does (a restricted problem: plans only), from ``cur``."""
    opts = ExactOptions(
        time_limit=max(0.0, deadline - time.perf_counter()), workers=workers, same_choice=ties
    )
    res = solve_exact(planner, limit, pins, [cur.strategies], opts, cur.program.objective)
    if res.strategies is None:
        return None
    program = evaluate(planner, res.strategies)
    if program.memory_per_device > limit or program.objective >= cur.program.objective:
        return None
    return WindowPlan(res.strategies, program, cur.improved + 1)


def _ties(segs, sigs, sources) -> tuple:
    """Pairs (source operator, its counterpart) over every segment equal to a source."""
    out = []
    for src in sources:
        for j, seg in enumerate(segs):
            if j != src and sigs[j] == sigs[src]:
                out += list(zip(segs[src], seg, strict=True))
    return tuple(out)


def window_search(
    planner: Planner,
    limit: float,
    pins: dict[str, Strategy],
    start: dict[str, Strategy],
    deadline: float,
    workers: int = 0,
) -> WindowPlan:
    """From ``start`` (a plan that fits): solve the middle window of the repeating segments
    exactly, copy its last period to every segment of the same structure, keep whichever of
    the two is faster and fits; again until neither improves; then, with the time left, the
    whole model with every such segment tied to its source (all layers change together)."""
    cur = WindowPlan(dict(start), evaluate(planner, start))
    segs = segments(planner)
    sigs = segment_signatures(planner, segs)
    window = repeating_window(sigs)
    if window is None:
        return cur
    idx = {i for j in window for i in segs[j]}
    period = len(window) // WINDOW_PERIODS
    ties = _ties(segs, sigs, list(window)[-period:])
    while deadline - time.perf_counter() > MIN_SOLVE_SECONDS:
        found = _solve_window(planner, limit, pins, cur, idx, deadline, workers)
        if found is None or found.program.objective >= cur.program.objective * (1 - 1e-9):
            break
        copied = _copy_segments(planner, pins, found, ties)
        program = evaluate(planner, copied)
        if program.memory_per_device <= limit and program.objective < found.program.objective:
            found = WindowPlan(copied, program)
        cur = WindowPlan(found.strategies, found.program, cur.improved + 1)
    if deadline - time.perf_counter() > TIED_SOLVE_SECONDS:  # every layer changes at once
        cur = _tied_solve(planner, limit, pins, cur, ties, deadline, workers) or cur
    return cur
