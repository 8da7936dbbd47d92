"""One result contract for every planner (pipeline, SPMD sharding, joint): the statuses, the
tolerances, and THE honest-status rule.

:func:`certify` is the rule a planner applies to its own plan: every bound finite and not above
the objective beyond float rounding (else :class:`InvalidBoundError`, a solver bug), the largest
bound clipped to the objective, and OPTIMAL only with a proof whose bound meets the objective
within :data:`OPTIMALITY_TOL` (or within a stated rounding resolution, :func:`optimal_within`).
:func:`claim_problem` is the same rule read back from a plan file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

OPTIMALITY_TOL = 1e-6
# a lower bound may exceed the re-evaluated objective by float rounding only (sums taken in
# another order): this much relative, plus BOUND_ABS_TOL absolute for objectives near zero
BOUND_TOL = 1e-9
BOUND_ABS_TOL = 1e-12
MAX_RESOLUTION = 1e-3  # a rounding resolution above this share of the objective proves nothing

OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN = "OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN"
INVALID = "INVALID"  # a plan that breaks a hard constraint (evaluate only; solvers refuse it)
ERROR = "ERROR"  # an experiment run that failed; its record carries the reason
STATUSES = (OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, INVALID, ERROR)
# stats["bound_scope"] of a method whose own bound holds for every plan and every placement
# of its blocks on the devices (CP-SAT and brute force on a heterogeneous cluster)
ALL_PLACEMENTS = "all plans and placements"
ALL_PLANS = "all plans"  # the default scope: the bound holds for every plan of the problem
# stats["stopped"] of an exact solve whose warm start met the certified bound
WARM_START_MET = "the warm start met the certified bound: no search"
# how a plan file's objective that differs from the recomputed one is described by default
OBJECTIVE_DIFFERS = "the file's objective {claimed:.10g} differs from the recomputed one"


class InvalidBoundError(AssertionError):
    """A solver claimed a lower bound above its own plan's objective: a bug, not a user error."""


def relative_gap(objective: float, bound: float | None) -> float | None:
    """(objective - bound) / objective, clipped at 0; None without a bound, 0 for a zero
    objective. Every kind of plan (pipeline, sharding, joint) reports its gap this way.

    >>> relative_gap(4.0, 3.0), relative_gap(4.0, None), relative_gap(0.0, 0.0)
    (0.25, None, 0.0)
    """
    if bound is None:
        return None
    if objective <= 0:
        return 0.0
    return max(0.0, (objective - bound) / objective)


def bound_exceeds(bound: float, objective: float) -> bool:
    """True when ``bound`` is above ``objective`` by more than float rounding can explain."""
    return bound > objective + BOUND_TOL * abs(objective) + BOUND_ABS_TOL


def meets_target(target: float | None, bound: float) -> bool:
    """True when ``bound`` meets ``target``, a known plan's cost (within OPTIMALITY_TOL, the
    test certify applies to OPTIMAL): no other bound can add anything."""
    return target is not None and math.isfinite(target) and target <= bound * (1 + OPTIMALITY_TOL)


def optimal_within(objective: float, bound: float, resolution: float) -> bool:
    """True when ``objective - bound`` is explained by a rounding ``resolution`` (seconds) no
    larger than MAX_RESOLUTION of the objective: OPTIMAL "within the stated resolution"."""
    return (
        math.isfinite(resolution)
        and 0 <= resolution <= MAX_RESOLUTION * abs(objective)
        and objective - bound <= resolution
    )


@dataclass(frozen=True)
class Verdict:
    """What :func:`certify` decided about one plan: the facts code reads (today's stats keys,
    typed). ``lower_bound`` is clipped to the objective; ``raw_lower_bound`` is as proven."""

    status: str
    objective: float
    lower_bound: float | None
    raw_lower_bound: float | None
    bound_source: str | None
    bound_scope: str | None
    optimal_within: float | None
    stopped: str | bool | None = None

    @property
    def gap(self) -> float | None:
        return relative_gap(self.objective, self.lower_bound)

    def stats_view(self) -> dict:
        """These facts under today's ``stats`` keys (only those that are set), for to_dict()."""
        keys = {
            "raw_lower_bound": self.raw_lower_bound,
            "optimal_within": self.optimal_within,
            "bound_source": self.bound_source,
            "bound_scope": self.bound_scope,
            "stopped": self.stopped,
        }
        return {k: v for k, v in keys.items() if v is not None}


def checked_bound(who: str, bound: float, objective: float) -> float:
    """``bound`` as a float when it is finite and not above ``objective`` beyond float
    rounding; otherwise :class:`InvalidBoundError` naming the solver ``who``."""
    bound = float(bound)
    if not math.isfinite(bound):
        raise InvalidBoundError(f"{who} returned the lower bound {bound}")
    if bound_exceeds(bound, objective):
        raise InvalidBoundError(
            f"{who} claims the lower bound {bound!r} above its plan's re-evaluated "
            f"objective {objective!r} (more than float rounding): a solver bug"
        )
    return bound


def certify(
    who: str,
    objective: float,
    bounds: Sequence[float | None],
    *,
    proven: bool,
    resolution: float = 0.0,
    source: str | None = None,
    scope: str | None = ALL_PLANS,
    stopped: str | bool | None = None,
) -> Verdict:
    """THE honest-status rule. Every bound (None: none) must be finite and not above
    ``objective`` beyond float rounding, else :class:`InvalidBoundError` naming ``who``; the
    largest is clipped to the objective. The status is OPTIMAL only when ``proven`` (the solver
    claims optimality) and the bound meets the objective within OPTIMALITY_TOL, or within the
    rounding ``resolution`` of an exact model (:func:`optimal_within`, then stated in
    ``optimal_within``); otherwise FEASIBLE."""
    given = [checked_bound(who, b, objective) for b in bounds if b is not None]
    raw = max(given) if given else None
    bound = None if raw is None else min(raw, objective)
    gap = relative_gap(objective, bound)
    within = None
    status = FEASIBLE
    if proven and gap is not None:
        if gap <= OPTIMALITY_TOL:
            status = OPTIMAL
        elif optimal_within(objective, bound, resolution):
            status, within = OPTIMAL, float(resolution)
    return Verdict(status, objective, bound, raw, source, scope, within, stopped)


def _number(x: object) -> bool:
    """True for a finite int or float (not a bool, not an int too large for a float)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer too large for a float
        return False


def claim_problem(
    objective: float,
    status: object,
    bound: object,
    claimed_objective: object,
    resolution: float = 0.0,
    *,
    objective_differs: str = OBJECTIVE_DIFFERS,
) -> str | None:
    """The honest-status rule read from a plan file: None when the file's ``status``,
    ``bound`` and ``claimed_objective`` (as read, None when absent) agree with the recomputed
    ``objective``, else why not. ``resolution``: the file's ``optimal_within`` (0: none).
    ``objective_differs`` words a differing objective (format field ``claimed``)."""
    if bound is not None and not _number(bound):
        return f"the lower bound {str(bound)[:40]!r} is not a finite number"
    if claimed_objective is not None and not _number(claimed_objective):
        return f"the objective {str(claimed_objective)[:40]!r} is not a finite number"
    if _number(claimed_objective) and abs(claimed_objective - objective) > (
        BOUND_TOL * abs(objective) + BOUND_ABS_TOL
    ):
        return objective_differs.format(claimed=claimed_objective)
    if _number(bound) and bound_exceeds(float(bound), objective):
        return f"the lower bound {bound:.10g} exceeds the objective {objective:.10g}"
    if status == OPTIMAL and (
        not _number(bound)
        or (
            objective - bound > OPTIMALITY_TOL * objective
            and not optimal_within(objective, float(bound), resolution)
        )
    ):
        return "OPTIMAL without a lower bound within 1e-6 of the objective"
    return None


class Result(Protocol):
    """What every planner returns (pipeline ``Plan``, SPMD ``ShardResult``, ``JointPlan``)."""

    kind: ClassVar[str]  # "pipeline" | "spmd" | "joint"
    method: str
    status: str
    lower_bound: float | None
    wall_seconds: float

    @property
    def objective(self) -> float: ...

    @property
    def gap(self) -> float | None: ...

    def to_dict(self) -> dict: ...
