"""The exact SPMD search (``solve_sharding(method="cpsat")``) in named stages: warm starts from
the heuristics, the Lagrangian bound, exact windows over the repeating layers, a proof by the
bound alone, CP-SAT (re-solved once at a finer scale when rounding leaves a gap), the leanest
plan when nothing that fits was found in time, and the refusal of a memory limit no plan meets.

This module pulls ortools at import (through spmd.exact, spmd.lagrange and spmd.windows):
spmd/solve.py imports it only when the cpsat method runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from solver.core.errors import MtppError
from solver.core.result import OPTIMALITY_TOL, certify
from solver.spmd.exact import (
    NOT_BUILT,
    ExactOptions,
    ExactResult,
    LeastMemory,
    min_memory,
    solve_exact,
)
from solver.spmd.lagrange import lagrange, least_memory_plan
from solver.spmd.plan import SearchOptions, ShardResult, fits, fmt_floor, fmt_limit, heuristic
from solver.spmd.program import Planner, Program, evaluate
from solver.spmd.strategy import Strategy
from solver.spmd.windows import window_search

LAGRANGE_SHARE = 0.92  # share of the time limit the Lagrangian bound and mixing may take
WINDOW_GAP = 0.01  # exact window solves start only when the best plan is this far from the bound
WINDOW_SHARE = 0.8  # share of the time left after the bounds the window solves may take
MEMORY_BOUND_SHARE = 0.25  # share of the time limit spent bounding an impossible memory limit
# the CP-SAT model starts only with this many times the seconds the Lagrangian stage took to
# build the model's data left (the full model of a 48-layer decoder took 2.3 times as long
# from cold caches; past its deadline it is not built, and a model cut short is no use)
CPSAT_BUILD_FACTOR = 2.5
FINISH_EVALUATIONS = 3  # ... and with the time of this many evaluations kept to finish after it
WARM_STARTS = ("dp", "propagate", "megatron")  # the order they run in: the cheapest first
TIE_ORDER = ("propagate", "dp", "megatron")  # equal times: the first of these is kept


@dataclass
class Candidate:
    """A plan the search may return: its time, where it came from, its strategies and program."""

    objective: float
    name: str
    strategies: dict[str, Strategy]
    program: Program


def exact_search(
    planner: Planner, pins: dict, limit: float | None, bound: float, t0: float, opts: SearchOptions
) -> ShardResult:
    """Warm starts from the heuristics, then CP-SAT; the best plan that fits, its status.
    ``bound``: the least-compute bound; ``t0``: when the solve started (the time limit counts
    from there)."""
    search = _ExactSearch(planner, pins, limit, bound, t0, opts)
    search.warm_starts()
    search.lagrange_stage()
    search.window_stage()
    search.report_progress()
    proven = search.proven_by_bound()
    if proven is not None:
        return proven
    search.cpsat_stage()
    if search.best is None:
        search.least_memory_fallback()
    return search.result()


class _ExactSearch:
    """The state the stages of :func:`exact_search` share: the candidates, the bound, stats."""

    def __init__(self, planner, pins, limit, bound: float, t0: float, opts: SearchOptions):
        self.planner, self.pins, self.limit, self.opts = planner, pins, limit, opts
        self.bound, self.t0 = bound, t0
        self.deadline = t0 + opts.time_limit
        self.hints: list[Candidate] = []  # every plan priced, fitting or not
        self.fitting: list[Candidate] = []  # those within the limit, the fastest first
        self.skipped: list[str] = []
        self.lag_stats: dict = {}
        self.stats: dict = {}
        self.best: Candidate | None = None
        self.res: ExactResult | None = None
        self.evaluate_seconds = 0.0  # the longest evaluation of a plan so far
        self.model_seconds = 0.0  # building the model's data in the Lagrangian stage

    def note(self, text: str) -> None:
        if self.opts.progress is not None:
            self.opts.progress.note(text)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def candidate(self, name: str, strategies: dict[str, Strategy], program=None) -> Candidate:
        if program is None:
            t0 = time.perf_counter()
            program = evaluate(self.planner, strategies)
            self.evaluate_seconds = max(self.evaluate_seconds, time.perf_counter() - t0)
        return Candidate(program.objective, name, strategies, program)

    def warm_start_stats(self) -> dict:
        return {h.name: h.objective if fits(h.program, self.limit) else None for h in self.hints}

    # ------------------------------------------------------------------ the stages
    def warm_starts(self) -> None:
        """The heuristic plans, one at least whatever the time."""
        for name in WARM_STARTS:
            if self.hints and self.left() <= 0:
                self.skipped.append(name)
                continue
            self.note(f"warm start: {name}")
            self.hints.append(self.candidate(name, heuristic(self.planner, name, self.pins)))
        self.hints.sort(key=lambda h: (h.objective, TIE_ORDER.index(h.name)))

    def lagrange_stage(self) -> None:
        """The Lagrangian bound and its plan (refuses a limit below every plan's need)."""
        lag = None
        if self.left() > 0:
            self.note("Lagrangian bound (variable elimination)")
            lag = lagrange(self.planner, self.limit, self.pins, LAGRANGE_SHARE * self.left())
        if lag is not None and "least_memory_bound" in lag.stats:  # no plan fits the limit
            raise self.refusal(max(1.0, self.left()))
        if lag is not None:
            self.model_seconds = lag.model_seconds
            self.bound = max(self.bound, lag.lower_bound)
            self.lag_stats = {**lag.stats, "lagrange_lower_bound": lag.lower_bound}
            if lag.strategies is not None:
                program = evaluate(self.planner, lag.strategies)
                self.hints.append(Candidate(lag.objective, "lagrange", lag.strategies, program))
        self.hints.sort(key=lambda h: (h.objective, h.name not in TIE_ORDER))
        if self.skipped:
            self.lag_stats["skipped_warm_starts"] = self.skipped
        self.fitting = [h for h in self.hints if fits(h.program, self.limit)]

    def window_stage(self) -> None:
        """Exact windows over the repeating layers when the best plan is far from the bound."""
        first = self.fitting[0] if self.fitting else None
        if first is None or self.limit is None:
            return
        if first.objective - self.bound <= WINDOW_GAP * first.objective:
            return
        self.note("exact windows over the repeating layers")
        end = time.perf_counter() + WINDOW_SHARE * self.left()
        found = window_search(
            self.planner, self.limit, self.pins, first.strategies, end, self.opts.workers
        )
        if found.improved:
            self.lag_stats["window_improvements"] = found.improved
            self.fitting.insert(0, self.candidate("windows", found.strategies, found.program))
            self.hints.append(self.fitting[0])

    def report_progress(self) -> None:
        if self.opts.progress is not None and self.fitting:
            elapsed = time.perf_counter() - self.t0
            self.opts.progress.update(self.fitting[0].objective, self.bound, elapsed)

    def proven_by_bound(self) -> ShardResult | None:
        """The best plan, OPTIMAL, when the Lagrangian bound already proves it: no search."""
        if not self.fitting:
            return None
        best, bound = self.fitting[0], self.bound
        if best.objective - bound > OPTIMALITY_TOL * best.objective:
            return None
        proof = f"{self.lag_stats.get('binding_bound', 'lagrangian')} bound"
        verdict = certify(f"the {proof}", best.objective, [bound], proven=True)
        stats = {**self.lag_stats, "proof": proof, "kept_warm_start": best.name}
        stats["warm_starts"] = self.warm_start_stats()
        stats["raw_lower_bound"] = verdict.raw_lower_bound
        return self.shard_result(verdict.status, best, verdict.lower_bound, stats)

    def cpsat_stage(self) -> None:
        """CP-SAT warm-started by every plan that fits; again once with the best plan as the
        upper bound when it proved its integer model but rounding leaves a gap."""
        self.note("building the CP-SAT model")
        opts = self.opts
        exact = ExactOptions(
            time_limit=self.cpsat_time(),
            workers=opts.workers,
            seed=opts.seed,
            log=opts.log,
            encoding=opts.encoding,
            on_progress=opts.progress.update if opts.progress is not None else None,
        )
        upper = self.fitting[0].objective if self.fitting else None
        res = self.first_solve(exact, upper)
        self.best = self.fitting[0] if self.fitting else None
        if self.best is not None:
            self.stats["kept_warm_start"] = self.best.name
        self.take(res)
        rest = self.finer_resolve_time(res, upper)
        if rest is not None:
            # proven in the integer model but the rounding of a coarse scale leaves a gap: solve
            # again with the plan found as the upper bound, which caps the coefficients (finer S)
            exact.time_limit = rest
            upper = self.best.objective
            starts = [self.best.strategies]
            res = solve_exact(self.planner, self.limit, self.pins, starts, exact, upper)
            self.stats["resolved_with_upper_bound"] = upper
            self.take(res)
        self.res = res

    def cpsat_time(self) -> float:
        """The seconds CP-SAT may take: the time left less the time to price its plan and
        finish; 0 (not built) when that is too short to build its model."""
        rest = self.left() - FINISH_EVALUATIONS * self.evaluate_seconds
        return rest if rest > CPSAT_BUILD_FACTOR * self.model_seconds else 0.0

    def first_solve(self, exact: ExactOptions, upper: float | None) -> ExactResult:
        """The first CP-SAT solve (or why none ran) and the stats it starts."""
        if exact.time_limit > 0:
            starts = [h.strategies for h in self.fitting]
            res = solve_exact(self.planner, self.limit, self.pins, starts, exact, upper)
        else:
            why = "too little of the time limit was left to build the CP-SAT model"
            res = ExactResult(None, -math.inf, NOT_BUILT, {"cpsat_status": NOT_BUILT, "note": why})
        self.stats = {**res.stats, **self.lag_stats}
        if res.cpsat_status == NOT_BUILT:
            self.stats["stopped"] = (
                f"time limit ({self.opts.time_limit:g} s) reached before CP-SAT ran: the best "
                f"warm start is kept, with the "
                f"{self.lag_stats.get('binding_bound', 'least compute')} bound"
            )
        self.stats["warm_starts"] = self.warm_start_stats()
        if res.cpsat_status == "INFEASIBLE":
            raise self.refusal(max(1.0, self.left()))
        return res

    def take(self, res: ExactResult) -> None:
        """Raise the bound by CP-SAT's; keep its plan when it fits and is faster."""
        self.bound = max(self.bound, res.lower_bound)
        if res.strategies is None:
            return
        found = self.candidate("cpsat", res.strategies)
        if not fits(found.program, self.limit):  # bytes are rounded down in the model: not kept
            self.stats["cpsat_plan_over_limit"] = found.program.memory_per_device
        elif self.best is None or found.objective < self.best.objective:
            self.best = found
            self.stats.pop("kept_warm_start", None)

    def finer_resolve_time(self, res: ExactResult, upper: float | None) -> float | None:
        """The seconds for a re-solve at a finer scale, or None: one is worth it when CP-SAT
        proved its integer model, a gap is left, a second is left, and the best plan is below
        the upper bound the first solve had."""
        if self.best is None:
            return None
        best = self.best.objective
        gap = (best - self.bound) / best if best > 0 else 0.0
        rest = self.cpsat_time()
        rounding = res.cpsat_status == "OPTIMAL" and gap > OPTIMALITY_TOL
        if not rounding or rest < 1.0 or (upper is not None and best >= upper):
            return None
        return rest

    def least_memory_fallback(self) -> None:
        """Past the time limit with no plan that fits: the leanest plan, when it fits, beats
        no plan at all; else the refusal with the least memory known."""
        seconds = max(1.0, MEMORY_BOUND_SHARE * self.opts.time_limit)
        lean = least_memory(self.planner, self.pins, seconds, self.opts.workers)
        if lean is None or lean.strategies is None or lean.upper > self.limit:
            raise self.refusal(0.0, lean, self.opts.time_limit)
        self.best = self.candidate("least memory", lean.strategies)
        self.stats["kept_warm_start"] = "least memory"

    def result(self) -> ShardResult:
        """The best plan with its bound and status (OPTIMAL only when CP-SAT proved it)."""
        best = self.best
        proven = self.res.cpsat_status == "OPTIMAL"
        verdict = certify("cpsat", best.objective, [self.bound], proven=proven)
        self.stats["raw_lower_bound"] = verdict.raw_lower_bound
        return self.shard_result(verdict.status, best, verdict.lower_bound, self.stats)

    def shard_result(self, status: str, best: Candidate, lb: float, stats: dict) -> ShardResult:
        return ShardResult(
            "cpsat",
            status,
            best.strategies,
            best.program,
            self.planner,
            self.pins,
            self.limit,
            lb,
            time.perf_counter() - self.t0,
            stats,
        )

    def refusal(self, seconds: float, lean=None, time_limit=None) -> MtppError:
        return refusal(
            self.planner, self.pins, self.limit, seconds, self.opts.workers, lean, time_limit
        )


# ---------------------------------------------------------------------- least memory, refusal
def least_memory(planner, pins, seconds: float, workers: int) -> LeastMemory | None:
    """The least memory per device any plan needs (a LeastMemory, or None): variable
    elimination's interval, narrowed by CP-SAT's memory model in the time left when open."""
    t0 = time.perf_counter()
    lean = least_memory_plan(planner, pins, seconds)
    rest = seconds - (time.perf_counter() - t0)
    if (lean is not None and lean.exact) or rest <= 0:
        return lean
    cp = min_memory(planner, pins, rest, workers)
    if lean is None or cp.upper < lean.upper:
        lean = LeastMemory(lean.lower if lean else 0.0, cp.upper, cp.strategies)
    return LeastMemory(max(lean.lower, cp.lower), lean.upper, lean.strategies)


def refusal(
    planner, pins, limit: float, seconds: float, workers: int, lean=None, time_limit=None
) -> MtppError:
    """The one-line refusal of a memory limit no plan is known to meet (proven when
    ``time_limit`` is None), with the least memory any plan needs: exact when proven, else the
    interval from what every plan needs to what the leanest plan found needs."""
    if lean is None and seconds > 0:
        lean = least_memory(planner, pins, seconds, workers)
    proven = time_limit is None or (lean is not None and lean.lower > limit)
    least = ""
    if lean is not None and lean.exact:
        least = f"; the least memory any plan needs is {fmt_limit(lean.upper)}"
    elif lean is not None:
        if lean.lower > limit or not proven:
            least = f"; every plan needs at least {fmt_floor(lean.lower)}"
        else:
            least = f"; every plan needs more than {fmt_limit(limit)}"
        if math.isfinite(lean.upper):
            least += f" and a plan with {fmt_limit(lean.upper)} exists"
    if proven:
        return MtppError(
            f"no sharding plan fits the memory limit of {fmt_limit(limit)} per device{least}; "
            "raise --memory"
        )
    return MtppError(
        f"no plan that fits {fmt_limit(limit)} per device found within the time limit "
        f"({time_limit:g} s){least}; raise --time-limit or --memory"
    )
