"""Pipeline planning: a graph and a cluster in, a plan of contiguous blocks (and its placement) out.

`registry` holds the method table; `bounds` the certified lower bounds; `exact` CP-SAT and brute
force; `dp` the exact dynamic programs; `heuristics` the baselines; `plan` the result and its
file."""
