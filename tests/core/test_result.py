"""The one honest-status rule (solver.core.result): certify, claim_problem, Verdict."""

import math

import pytest

from solver.core.result import (
    ALL_PLACEMENTS,
    FEASIBLE,
    MAX_RESOLUTION,
    OPTIMAL,
    OPTIMALITY_TOL,
    InvalidBoundError,
    Verdict,
    certify,
    claim_problem,
    relative_gap,
)


def test_a_bound_above_the_objective_raises_naming_the_solver():
    with pytest.raises(InvalidBoundError, match=r"^cpsat claims the lower bound 2\.5 above"):
        certify("cpsat", 2.0, [1.0, 2.5], proven=True)
    with pytest.raises(InvalidBoundError, match=r"^brkga returned the lower bound nan$"):
        certify("brkga", 2.0, [math.nan], proven=False)
    with pytest.raises(InvalidBoundError, match="returned the lower bound inf"):
        certify("x", 2.0, [math.inf], proven=False)


def test_a_bound_above_by_float_rounding_is_clipped_and_kept_raw():
    over = 2.0 * (1 + 5e-10)  # within BOUND_TOL (1e-9 relative)
    v = certify("dp", 2.0, [None, over, 1.0], proven=True)
    assert v.raw_lower_bound == over and v.lower_bound == 2.0
    assert v.status == OPTIMAL and v.gap == 0.0 and v.optimal_within is None
    assert v.stats_view() == {"raw_lower_bound": over, "bound_scope": "all plans"}


def test_optimal_needs_a_proof_and_a_bound_that_meets_the_objective():
    assert certify("a", 3.0, [3.0], proven=False).status == FEASIBLE  # no claim of proof
    assert certify("a", 3.0, [], proven=True).status == FEASIBLE  # a claim without a bound
    assert certify("a", 3.0, [None], proven=True).lower_bound is None
    near = 3.0 * (1 - OPTIMALITY_TOL / 2)
    assert certify("a", 3.0, [near], proven=True).status == OPTIMAL
    far = 3.0 * (1 - 2 * OPTIMALITY_TOL)
    v = certify("a", 3.0, [far], proven=True)
    assert v.status == FEASIBLE and v.gap == pytest.approx(2 * OPTIMALITY_TOL)


def test_a_rounding_resolution_proves_optimal_within_it_only_when_small():
    # objective 10, bound 9.995: gap 5e-4; a resolution of 0.006 explains it (<= 1e-3 * 10)
    v = certify("cpsat", 10.0, [9.995], proven=True, resolution=0.006)
    assert v.status == OPTIMAL and v.optimal_within == 0.006
    assert v.stats_view()["optimal_within"] == 0.006
    # a resolution that does not cover objective - bound proves nothing
    assert certify("cpsat", 10.0, [9.99], proven=True, resolution=0.006).status == FEASIBLE
    # nor one above MAX_RESOLUTION of the objective, even when it covers the difference
    big = MAX_RESOLUTION * 10.0 * 1.5
    assert certify("cpsat", 10.0, [9.995], proven=True, resolution=big).status == FEASIBLE
    assert certify("cpsat", 10.0, [9.995], proven=False, resolution=0.006).status == FEASIBLE


def test_the_largest_bound_binds_and_the_facts_are_kept():
    v = certify(
        "joint", 4.0, [1.0, 3.0, None], proven=True, source="chain", scope=ALL_PLACEMENTS,
        stopped="time limit",
    )
    assert v == Verdict(FEASIBLE, 4.0, 3.0, 3.0, "chain", ALL_PLACEMENTS, None, "time limit")
    assert v.gap == 0.25 == relative_gap(4.0, 3.0)
    assert v.stats_view() == {
        "raw_lower_bound": 3.0,
        "bound_source": "chain",
        "bound_scope": ALL_PLACEMENTS,
        "stopped": "time limit",
    }
    bare = certify("m", 4.0, [], proven=False, scope=None)
    assert bare.gap is None and bare.stats_view() == {}


def test_verdict_is_frozen():
    v = certify("m", 1.0, [1.0], proven=True)
    with pytest.raises(AttributeError):
        v.status = FEASIBLE  # type: ignore[misc]


@pytest.mark.parametrize(
    "status, bound, claimed, resolution, why",
    [
        (OPTIMAL, 2.1, 2.1, 0.0, None),
        (FEASIBLE, None, None, 0.0, None),
        (OPTIMAL, 2.1 * (1 + 5e-10), 2.1, 0.0, None),  # float rounding
        (OPTIMAL, "x", 2.1, 0.0, "the lower bound 'x' is not a finite number"),
        (OPTIMAL, math.inf, 2.1, 0.0, "the lower bound 'inf' is not a finite number"),
        (OPTIMAL, True, 2.1, 0.0, "the lower bound 'True' is not a finite number"),
        (OPTIMAL, 10**400, 2.1, 0.0, f"the lower bound '1{'0' * 39}' is not a finite number"),
        (FEASIBLE, 1.0, "2", 0.0, "the objective '2' is not a finite number"),
        (FEASIBLE, 1.0, 1.0, 0.0, "the file's objective 1 differs from the recomputed one"),
        (FEASIBLE, 1e9, 2.1, 0.0, "the lower bound 1000000000 exceeds the objective 2.1"),
        (OPTIMAL, 2.0, 2.1, 0.0, "OPTIMAL without a lower bound within 1e-6 of the objective"),
        (OPTIMAL, None, 2.1, 0.0, "OPTIMAL without a lower bound within 1e-6 of the objective"),
        (OPTIMAL, 2.099, 2.1, 0.002, None),  # within the stated resolution
        (OPTIMAL, 2.09, 2.1, 0.002, "OPTIMAL without a lower bound within 1e-6 of the objective"),
    ],
)
def test_claim_problem(status, bound, claimed, resolution, why):
    assert claim_problem(2.1, status, bound, claimed, resolution) == why


def test_claim_problem_words_a_differing_objective_as_asked():
    why = claim_problem(
        2.0, FEASIBLE, None, 1.0, objective_differs="objective {claimed!r} is not the slowest"
    )
    assert why == "objective 1.0 is not the slowest"
