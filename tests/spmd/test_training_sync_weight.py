"""The gradient-sync weight of a training spec (``TrainingSpec(sync_weight=mu)``): the sync's
time scaled in the program and the objective, the optimum it moves, the default unchanged, and
the refusal of a bad weight."""

from __future__ import annotations

import math

import pytest

from solver.core.errors import MtppError
from solver.core.result import OPTIMAL
from solver.spmd.model import from_proto
from solver.spmd.program import evaluate
from solver.spmd.solve import solve_sharding
from solver.spmd.training import TrainingSpec
from tests.spmd.test_training_sharding import CL4, DP, MEGATRON, _allreduce, _planner, mlp2


def test_the_sync_weight_scales_the_sync_by_hand():
    """Data parallel on 4 devices: one AllReduce per weight gradient; with weight 0.25 each is
    a quarter, the objective less 3/4 of the sync, every other term the same."""
    batch, d, h = 16, 64, 256
    full = evaluate(_planner(mlp2(batch, d, h)), DP)
    quarter = evaluate(_planner(mlp2(batch, d, h), training=TrainingSpec(4.0, 0.25)), DP)
    syncs = [_allreduce(4 * d * h), 0.0, _allreduce(4 * h * d)]
    assert full.training.sync_time == pytest.approx(syncs)
    assert quarter.training.sync_time == pytest.approx([s / 4 for s in syncs])
    assert quarter.objective == pytest.approx(full.objective - 0.75 * sum(syncs))
    assert quarter.training.backward_compute == full.training.backward_compute
    assert quarter.weight_memory == full.weight_memory  # memory does not depend on the weight


def test_a_zero_sync_weight_moves_the_large_weight_mlp_to_data_parallel():
    """The large-weight MLP trains Megatron-style because of the gradient sync; counted 0
    times it is data parallel (no per-step communication at all), and its optimum is the
    weight-1 data-parallel time less its sync."""
    big = from_proto(mlp2(batch=16, d=1024, h=4096), {})
    one = solve_sharding(big, cluster=CL4, method="cpsat", training=TrainingSpec(), workers=1)
    assert one.strategies == MEGATRON
    zero = solve_sharding(
        big, cluster=CL4, method="cpsat", training=TrainingSpec(4.0, 0.0), workers=1
    )
    assert zero.status == OPTIMAL
    assert zero.strategies == DP
    dp = evaluate(_planner(mlp2(batch=16, d=1024, h=4096)), DP)
    assert zero.objective == pytest.approx(dp.objective - math.fsum(dp.training.sync_time))
    assert zero.objective < one.objective


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, True, "1"])
def test_a_bad_sync_weight_is_refused(bad):
    with pytest.raises(MtppError) as e:
        TrainingSpec(4.0, bad)
    assert str(e.value) == f"the gradient sync weight must be a number >= 0, got {bad!r}"
