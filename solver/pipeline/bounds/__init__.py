"""Certified lower bounds on the bottleneck max f(S) of every plan (docs/bounds.md).

Each bound is a relaxation of the real problem, proved in docs/bounds.md and tested against
brute force (tests/test_bounds.py); :func:`certified_lower_bound` reports the largest one.
"""

from solver.pipeline.bounds.combine import BoundReport, certified_lower_bound

__all__ = ["BoundReport", "certified_lower_bound"]
