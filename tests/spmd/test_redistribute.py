"""Tensor redistribution: exact on real arrays, free exactly when no data moves, never dearer
than gathering everything and slicing, ring-formula bytes per collective."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.spmd.collectives import apply, assemble, scatter
from solver.spmd.mesh import Layout, Mesh
from solver.spmd.redistribute import gather_then_slice_cost, local_bytes, plan_redistribution
from tests.conftest import scaled_examples


def _factorizations(n: int) -> list[tuple[int, ...]]:
    if n == 1:
        return [()]
    out = []
    for f in range(2, n + 1):
        if n % f == 0:
            out += [(f, *rest) for rest in _factorizations(n // f)]
    return out


@st.composite
def layout_pairs(draw):
    devices = draw(st.sampled_from([2, 4, 6, 8, 12]))
    rank = draw(st.integers(1, 3))

    def assign(partial_ok: bool):
        dm = draw(st.sampled_from(_factorizations(devices)))
        dims: list[list[int]] = [[] for _ in range(rank)]
        partial = []
        for a in draw(st.permutations(range(len(dm)))):
            role = draw(st.integers(-2 if partial_ok else -1, rank - 1))
            if role >= 0:
                dims[role].append(a)
            elif role == -2:
                partial.append(a)
        return dm, tuple(tuple(d) for d in dims), tuple(sorted(partial))

    (dm1, d1, p1), (dm2, d2, _) = assign(True), assign(False)
    shape = []
    for d in range(rank):
        n1 = math.prod(dm1[a] for a in d1[d])
        n2 = math.prod(dm2[a] for a in d2[d])
        shape.append(n1 * n2 // math.gcd(n1, n2) * draw(st.integers(1, 2)))
    shape = tuple(shape)
    return Layout(shape, dm1, d1, p1), Layout(shape, dm2, d2, ())


MESHES = {
    2: Mesh((2,), (1e9,), (1e-6,)),
    4: Mesh((2, 2), (1e9, 5e9), (1e-6, 2e-6)),
    6: Mesh((6,), (1e9,), (1e-6,)),
    8: Mesh((2, 4), (1e9, 4e9), (1e-6, 1e-7)),
    12: Mesh((12,), (2e9,), (1e-6,)),
}


def _moves_data(src: Layout, dst: Layout) -> bool:
    """Independent of the planner: data must move unless every device already holds its target
    block and no partial sums are pending."""
    if any(src.device_matrix[a] > 1 for a in src.partial):
        return True
    for r in range(src.devices):
        for s, t in zip(src.block(r), dst.block(r), strict=True):
            if not (s.start <= t.start and t.stop <= s.stop):
                return True
    return False


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(layout_pairs(), st.integers(0, 2**31))
def test_redistribution_is_exact_free_iff_no_data_moves_and_bounded(pair, seed):
    src, dst = pair
    mesh = MESHES[src.devices]
    plan = plan_redistribution(src, dst, 4, mesh)
    rng = np.random.default_rng(seed)
    full = rng.standard_normal(src.shape).astype(np.float64)
    got = apply(plan, scatter(full, src, rng))
    want = scatter(full, dst)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        if src.partial:
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)
        else:
            np.testing.assert_array_equal(g, w)  # data only moved, never changed
    moves = _moves_data(src, dst)
    assert (plan.time == 0) == (not moves)
    assert (plan.bytes_per_device == 0) == (not moves)
    assert plan.time <= gather_then_slice_cost(src, dst, 4, mesh) * (1 + 1e-12)


def test_ring_formulas_per_collective():
    mesh = Mesh((4,), (1e9,), (1e-6,))
    full = Layout((8, 8), (4,), ((), ()))
    rows = Layout((8, 8), (4,), ((0,), ()))
    part = Layout((8, 8), (4,), ((), ()), (0,))
    cols = Layout((8, 8), (4,), ((), (0,)))
    b = 8 * 8 * 4  # bytes of the whole tensor
    ag = plan_redistribution(rows, full, 4, mesh)
    assert [s.kind for s in ag.steps] == ["AllGather"]
    assert ag.bytes_per_device == pytest.approx(3 / 4 * b)
    assert ag.time == pytest.approx(3 / 4 * b / 1e9 + 3e-6)
    ar = plan_redistribution(part, full, 4, mesh)
    assert [s.kind for s in ar.steps] == ["AllReduce"]
    assert ar.bytes_per_device == pytest.approx(2 * 3 / 4 * b)
    assert ar.time == pytest.approx(2 * 3 / 4 * b / 1e9 + 6e-6)
    rs = plan_redistribution(part, rows, 4, mesh)
    assert [s.kind for s in rs.steps] == ["ReduceScatter"]
    assert rs.bytes_per_device == pytest.approx(3 / 4 * b)
    a2a = plan_redistribution(rows, cols, 4, mesh)
    assert [s.kind for s in a2a.steps] == ["AllToAll"]
    assert a2a.bytes_per_device == pytest.approx(3 / 16 * b)  # (n-1)/n^2 of B
    sl = plan_redistribution(full, cols, 4, mesh)
    assert [s.kind for s in sl.steps] == ["Slice"] and sl.time == 0
    assert local_bytes(rows, 4) == b / 4


def test_matrices_without_a_common_refinement_gather_then_slice():
    mesh = Mesh((6,), (1e9,), (0.0,))
    src = Layout((6, 6), (2, 3), ((0,), (1,)))
    dst = Layout((6, 6), (3, 2), ((0,), (1,)))
    plan = plan_redistribution(src, dst, 8, mesh)
    assert [s.kind for s in plan.steps] == ["AllGather", "AllGather", "Slice"]
    full = np.arange(36.0).reshape(6, 6)
    out = apply(plan, scatter(full, src))
    np.testing.assert_array_equal(assemble(out, dst), full)


def test_assemble_detects_disagreeing_replicas():
    lay = Layout((4,), (2,), ((),))
    with pytest.raises(ValueError, match="replica"):
        assemble([np.zeros(4), np.ones(4)], lay)
