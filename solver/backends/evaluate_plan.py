"""A pipeline plan read from a file, evaluated again: ``mtpp evaluate``'s numbers.

The plan is priced from its graph and cluster (the training model for a training plan), its
lower bound is recomputed (the certified bounds, as ``mtpp solve`` computes them; an invalid
plan gets none, since bounds speak of valid plans only) and its status follows from that
bound by the one rule (:func:`solver.pipeline.plan.make_plan`). What the file claims (status,
bound, objective) is then checked against the recomputed numbers
(:func:`solver.core.result.claim_problem`); a consistent OPTIMAL claim made for this cluster
is used for the status when the recomputed bound does not prove it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import Violation, validate
from solver.core.graph import Graph, coarse_view
from solver.core.result import claim_problem
from solver.core.training import TrainingSpec, training_cost
from solver.pipeline import registry  # registry.certified_bound: tests patch it there
from solver.pipeline.plan import FEASIBLE, INVALID, OPTIMAL, Plan, make_plan
from solver.pipeline.training.certificate import certified_training_bound

EVALUATE_BOUND_SECONDS = 10.0  # time for the certified bounds of a plan being evaluated (the
# exact chain DP needs 4-7 s on a 7B decoder at k = 64; small graphs finish at once)


@dataclass
class PlanEvaluation:
    """A pipeline plan evaluated again: the plan with its recomputed status, its violations,
    and what its file claims, checked (:func:`check_claim`)."""

    plan: Plan
    violations: list[Violation]  # empty: the plan is valid
    claim: dict  # claimed_status, claimed_lower_bound, ..., claim (in words), used
    method: str  # the file's method ("given" when it names none)


@dataclass
class _Bound:
    """A recomputed lower bound and what the plan's stats say of it."""

    value: float | None  # None: no bound (an invalid plan)
    stats: dict | None


def evaluate_plan(
    g: Graph,
    cluster: Cluster,
    assignment: np.ndarray,
    placement: np.ndarray | None,
    data: dict,
    claims_apply: bool,
    training: TrainingSpec | None = None,
) -> PlanEvaluation:
    """Price the plan, recompute its bound and status, and check the claims of ``data`` (the
    file's content); ``claims_apply`` says the file was made for this cluster (by content)."""
    if training is None:
        violations = validate(g, cluster, assignment, placement=placement)
        bound = _pipeline_bound(g, cluster, violations)
    else:
        cost = training_cost(g, cluster, assignment, training, placement=placement)
        # order, co-location and training memory (core.training replaces the capacity test)
        violations = [Violation("training", v) for v in cost.violations]
        bound = _training_bound(g, cluster, training, violations)
    method = data.get("method") if isinstance(data.get("method"), str) else "given"
    plan = make_plan(
        g,
        cluster,
        assignment,
        method,
        status=FEASIBLE if bound.value is None else OPTIMAL,
        check=False,
        lower_bound=bound.value,
        placement=placement,
        training=training,
    )
    if bound.stats is not None:
        plan.stats["bound"] = bound.stats
    claim = _status_from_claim(plan, data, violations, claims_apply)
    return PlanEvaluation(plan, list(violations), claim, method)


def _pipeline_bound(g: Graph, cluster: Cluster, violations: list) -> _Bound:
    if violations:
        return _Bound(None, None)
    rep = registry.certified_bound(g, cluster, EVALUATE_BOUND_SECONDS)
    return _Bound(rep.value, registry.bound_stats(rep))


def _training_bound(g: Graph, cluster: Cluster, spec: TrainingSpec, violations: list) -> _Bound:
    """The bound ``mtpp solve`` certifies for training plans (on T, not on max f)."""
    if violations:
        return _Bound(None, None)
    k = min(cluster.devices, coarse_view(g)[0].n)
    cert = certified_training_bound(g, cluster, k, spec, EVALUATE_BOUND_SECONDS)
    if cert.infeasible or not cert.bounds:
        return _Bound(None, None)
    stats = {"binding": cert.binding, "value": cert.value, "certified": dict(cert.bounds)}
    return _Bound(cert.value, stats)


def _status_from_claim(plan: Plan, data: dict, violations: list, claims_apply: bool) -> dict:
    """The checked claim; the plan's status set from the violations, the recomputed bound,
    then a usable claim, in that order."""
    proven = plan.status == OPTIMAL
    claim = check_claim(plan, data, claims_apply)
    if violations:
        plan.status = INVALID
        claim["used"] = False
    elif proven:
        claim["used"] = False  # the recomputed bound proves the status; no claim is needed
    elif claim["used"]:
        plan.status = OPTIMAL
    return claim


def _number(x: object) -> bool:
    """A finite int or float (not a bool, not an int too large for a float)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def check_claim(plan: Plan, data: dict, claims_apply: bool) -> dict:
    """Compare what a plan file claims (status, lower bound, objective) with the recomputed
    numbers (the honest-status rule, :func:`solver.core.result.claim_problem`). The claim is
    "consistent" or says why not; it is ``used`` for the status only when consistent, made
    for this cluster (``claims_apply``: by content, the name may differ), and its bound
    proves that status."""
    status, bound, obj = data.get("status"), data.get("lower_bound"), data.get("objective")
    res = data.get("optimal_within")
    res = float(res) if _number(res) else 0.0
    out = {
        "claimed_status": status[:40] if isinstance(status, str) else None,
        "claimed_lower_bound": float(bound) if _number(bound) else None,
        "claimed_objective": float(obj) if _number(obj) else None,
        "claimed_optimal_within": res or None,
        "claim": "consistent",
        "used": False,
    }
    if status is None and bound is None:
        out["claim"] = "none (the file states no status or bound)"
        return out
    if not claims_apply:
        out["claim"] = "not applicable: evaluated on another cluster than the plan was made for"
        return out
    problem = claim_problem(plan.objective, status, bound, obj, res)
    if problem is not None:
        out["claim"] = f"invalid: {problem}"
        return out
    out["used"] = out["claimed_status"] == OPTIMAL
    return out
