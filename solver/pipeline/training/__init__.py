"""Training plans: the iteration time T and per-stage memory of a pipeline schedule
(model), the exact DP over ideals and a certified lower bound (exact), and the practitioners'
splits (splits). docs/training.md states the model and the proofs."""
