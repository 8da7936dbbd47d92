"""Exact solvers: brute force (the test oracle) and the CP-SAT model."""
