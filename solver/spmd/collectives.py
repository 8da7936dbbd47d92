"""Redistribution steps carried out exactly between per-device numpy buffers.

These functions are the emulated network: a collective reads only the buffers of its group
(the devices that differ along one device-matrix axis) and writes each member's new buffer.
"""

from __future__ import annotations

import math

import numpy as np

from solver.spmd.mesh import Layout
from solver.spmd.redistribute import Redistribution, Step


def group(dm: tuple[int, ...], axis: int, rank: int) -> list[int]:
    """The ranks that differ from ``rank`` only along ``axis``, ordered by that coordinate."""
    stride = math.prod(dm[axis + 1 :])
    c = (rank // stride) % dm[axis]
    base = rank - c * stride
    return [base + k * stride for k in range(dm[axis])]


def _piece(x: np.ndarray, dim: int, k: int, n: int) -> np.ndarray:
    size = x.shape[dim] // n
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(k * size, (k + 1) * size)
    return x[tuple(idx)]


def apply_step(step: Step, bufs: list[np.ndarray]) -> list[np.ndarray]:
    """Per-device buffers in ``step.before`` -> buffers in ``step.after``."""
    b, a = step.before, step.after
    p = len(bufs)
    if step.kind == "Slice":
        out = []
        for r in range(p):
            ob, oa = b.block(r), a.block(r)
            idx = tuple(
                slice(y.start - x.start, y.stop - x.start) for x, y in zip(ob, oa, strict=True)
            )
            out.append(np.ascontiguousarray(bufs[r][idx]))
        return out
    dm, ax = b.device_matrix, step.axis
    n = dm[ax]
    out = []
    for r in range(p):
        g = group(dm, ax, r)
        me = g.index(r)
        if step.kind == "AllReduce":  # asarray: a sum of 0-d arrays is a numpy scalar
            out.append(np.asarray(sum(bufs[q] for q in g)))
        elif step.kind == "ReduceScatter":
            d = _dim_gaining(b, a, ax)
            out.append(_piece(sum(bufs[q] for q in g), d, me, n))
        elif step.kind == "AllGather":
            d = _dim_losing(b, a, ax)
            out.append(np.concatenate([bufs[q] for q in g], axis=d))
        elif step.kind == "AllToAll":
            d1, d2 = _dim_losing(b, a, ax), _dim_gaining(b, a, ax)
            out.append(np.concatenate([_piece(bufs[q], d2, me, n) for q in g], axis=d1))
        else:
            raise ValueError(f"unknown step {step.kind}")
    return out


def _dim_losing(b: Layout, a: Layout, ax: int) -> int:
    return next(d for d in range(len(b.dims)) if ax in b.dims[d] and ax not in a.dims[d])


def _dim_gaining(b: Layout, a: Layout, ax: int) -> int:
    return next(d for d in range(len(a.dims)) if ax in a.dims[d] and ax not in b.dims[d])


def apply(redist: Redistribution, bufs: list[np.ndarray]) -> list[np.ndarray]:
    for st in redist.steps:
        bufs = apply_step(st, bufs)
    return bufs


def scatter(full: np.ndarray, lay: Layout, rng: np.random.Generator | None = None) -> list:
    """Each device's buffer for ``full`` laid out as ``lay``. Partial axes get random pieces
    that sum to the value (with ``rng``), else the value on coordinate 0 and zeros."""
    out = []
    parts: dict[tuple, np.ndarray] = {}
    for r in range(lay.devices):
        c = lay.coords(r)
        block = full[lay.block(r)]
        shard = np.ascontiguousarray(block).reshape(np.shape(block))  # a scalar stays 0-d
        if lay.partial:
            key = tuple(c[a] for a in range(len(c)) if a not in lay.partial) + (
                tuple(x for axes in lay.dims for x in axes),
            )
            pc = tuple(c[a] for a in lay.partial)
            if rng is not None:
                n = math.prod(lay.device_matrix[a] for a in lay.partial)
                if key not in parts:
                    noise = rng.standard_normal((n - 1, *shard.shape)).astype(full.dtype)
                    parts[key] = np.concatenate([noise, (shard - noise.sum(0))[None]], 0)
                flat = int(np.ravel_multi_index(pc, [lay.device_matrix[a] for a in lay.partial]))
                shard = parts[key][flat]
            elif any(pc):
                shard = np.zeros_like(shard)
        out.append(shard)
    return out


def assemble(bufs: list[np.ndarray], lay: Layout) -> np.ndarray:
    """The global tensor from per-device buffers: blocks placed by the layout, partial sums
    added; replicas are checked to agree (a mismatch raises)."""
    dtype = np.result_type(*[b.dtype for b in bufs])
    full = np.zeros(lay.shape, dtype=dtype)
    seen = np.zeros(lay.shape, dtype=bool) if not lay.partial else None
    used = {a for axes in lay.dims for a in axes}
    for r in range(lay.devices):
        if tuple(bufs[r].shape) != lay.local_shape:
            raise ValueError(f"device {r} holds shape {bufs[r].shape}, expected {lay.local_shape}")
        c = lay.coords(r)
        rep = [a for a in range(len(c)) if a not in used and a not in lay.partial]
        if any(c[a] for a in rep):
            if not lay.partial:
                primary = bufs[r]
                got = full[lay.block(r)] if seen[lay.block(r)].all() else None
                if got is not None and not np.allclose(primary, got, rtol=1e-4, atol=1e-5):
                    raise ValueError(f"device {r} holds a replica that differs from its peers")
            continue
        if lay.partial:
            full[lay.block(r)] += bufs[r]
        else:
            full[lay.block(r)] = bufs[r]
            seen[lay.block(r)] = True
    if seen is not None and not seen.all():
        raise ValueError("some elements are held by no device")
    return full
