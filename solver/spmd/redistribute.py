"""Tensor redistribution: the cheapest sequence of local slices and collectives we consider that
turns one layout into another on the same devices, with its bytes and ring-formula time.

Both layouts are brought to a common device matrix (each axis a run of the finer one); a
shortest-path search over per-axis states then combines

- ``Slice`` (keep a sub-block, free),
- ``AllGather`` along an axis (each device sends (n-1)/n of the gathered bytes B),
- ``AllToAll`` moving an axis from one tensor dim to another ((n-1)/n^2 of B),
- ``ReduceScatter`` of a partial sum onto a dim ((n-1)/n of the partial B),
- ``AllReduce`` of a partial sum (2(n-1)/n of B),

each with ``steps x latency`` added (n-1 steps, 2(n-1) for AllReduce). "All-reduce every partial,
gather every axis, then slice" is one path of the search, so the result never costs more.
When the two device matrices have no common refinement (e.g. [2, 3] and [3, 2]) that path is
the plan.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

from solver.spmd.mesh import Layout, Mesh, canonical, common_matrix, refine


@dataclass(frozen=True)
class Step:
    """One operation of a redistribution; ``axis`` indexes ``before.device_matrix``."""

    kind: str
    axis: int | None
    before: Layout
    after: Layout
    bytes_per_device: float
    time: float

    def to_dict(self) -> dict:
        m = len(self.before.device_matrix)
        return {
            "op": self.kind,
            "group_size": 1 if self.axis is None else self.before.device_matrix[self.axis],
            "axis": None if self.axis is None else m - 1 - self.axis,
            "device_matrix": list(self.before.device_matrix),
            "bytes_per_device": self.bytes_per_device,
            "time": self.time,
        }


@dataclass(frozen=True)
class Redistribution:
    """A sequence of steps from ``src`` to ``dst``; empty when the placements agree."""

    src: Layout
    dst: Layout
    steps: tuple[Step, ...]

    @property
    def time(self) -> float:
        return sum(s.time for s in self.steps)

    @property
    def bytes_per_device(self) -> float:
        return sum(s.bytes_per_device for s in self.steps)

    @property
    def collectives(self) -> list[str]:
        return [s.kind for s in self.steps if s.kind != "Slice"]

    def to_dict(self) -> dict:
        return {
            "from": self.src.to_dict(),
            "to": self.dst.to_dict(),
            "ops": [s.to_dict() for s in self.steps],
            "bytes_per_device": self.bytes_per_device,
            "time": self.time,
        }


def local_bytes(lay: Layout, itemsize: float) -> float:
    return float(math.prod(lay.local_shape)) * itemsize


def _step(kind: str, axis: int | None, before: Layout, after: Layout, itemsize, mesh) -> Step:
    if kind == "Slice":
        return Step(kind, axis, before, after, 0.0, 0.0)
    n = before.device_matrix[axis]
    size = local_bytes(before, itemsize)
    sent = {
        "AllGather": (n - 1) * size,
        "ReduceScatter": (n - 1) / n * size,
        "AllReduce": 2 * (n - 1) / n * size,
        "AllToAll": (n - 1) / n * size,
    }[kind]
    steps = 2 * (n - 1) if kind == "AllReduce" else n - 1
    bw, lat = mesh.group_link(before.device_matrix, axis)
    return Step(kind, axis, before, after, sent, sent / bw + steps * lat)


def _moves(cur: Layout, dst: Layout):
    """(kind, axis, next layout) for every step the search considers from ``cur``."""
    dm = cur.device_matrix
    used = {a for axes in cur.dims for a in axes} | set(cur.partial)
    want = {a: d for d, axes in enumerate(dst.dims) for a in axes}

    def make(dims, partial):
        try:
            return Layout(cur.shape, dm, tuple(dims), tuple(sorted(partial)))
        except ValueError:  # does not divide
            return None

    for a in range(len(dm)):
        if dm[a] == 1:
            continue
        if a in cur.partial:
            rest = set(cur.partial) - {a}
            if a in want:
                d = want[a]
                dims = list(cur.dims)
                dims[d] = dims[d] + (a,)
                yield "ReduceScatter", a, make(dims, rest)
            yield "AllReduce", a, make(cur.dims, rest)
        elif a not in used:
            if a in want:
                d = want[a]
                dims = list(cur.dims)
                dims[d] = dims[d] + (a,)
                yield "Slice", a, make(dims, cur.partial)
        else:
            for d, axes in enumerate(cur.dims):
                if axes and axes[-1] == a:
                    dims = list(cur.dims)
                    dims[d] = axes[:-1]
                    yield "AllGather", a, make(dims, cur.partial)
                    if a in want and want[a] != d:
                        d2 = want[a]
                        dims2 = list(dims)
                        dims2[d2] = dims2[d2] + (a,)
                        yield "AllToAll", a, make(dims2, cur.partial)


@lru_cache(maxsize=262144)
def plan_redistribution(src: Layout, dst: Layout, itemsize: float, mesh: Mesh) -> Redistribution:
    """The cheapest (time, then bytes) sequence we consider from ``src`` to ``dst``."""
    if src.shape != dst.shape or src.devices != dst.devices:
        raise ValueError(f"cannot redistribute {src} to {dst}")
    if dst.partial:
        raise ValueError("a redistribution target cannot hold partial sums")
    steps = _plan(canonical(src), canonical(dst), float(itemsize), mesh)
    return Redistribution(src, dst, steps)


@lru_cache(maxsize=65536)
def _plan(src: Layout, dst: Layout, itemsize: float, mesh: Mesh) -> tuple[Step, ...]:
    if src == dst:
        return ()
    fine = common_matrix(src.device_matrix, dst.device_matrix)
    if fine is None:
        return _gather_then_slice(src, dst, itemsize, mesh)
    s, t = refine(src, fine), refine(dst, fine)
    tie = itertools.count()
    best = {s: (0.0, 0.0, 0)}
    heap = [(0.0, 0.0, 0, next(tie), s, ())]
    while heap:
        time, sent, n, _, cur, path = heapq.heappop(heap)
        if cur == t:
            return _merge_slices(path, t)
        if best.get(cur, (math.inf,)) < (time, sent, n):
            continue
        for kind, axis, nxt in _moves(cur, t):
            if nxt is None:
                continue
            st = _step(kind, axis, cur, nxt, itemsize, mesh)
            key = (time + st.time, sent + st.bytes_per_device, n + 1)
            if key < best.get(nxt, (math.inf, math.inf, math.inf)):
                best[nxt] = key
                heapq.heappush(heap, (*key, next(tie), nxt, (*path, st)))
    return _gather_then_slice(src, dst, itemsize, mesh)  # unreachable in practice


def _merge_slices(path: tuple[Step, ...], target: Layout) -> tuple[Step, ...]:
    """Consecutive free slices become one step (fewer rows to read in a plan)."""
    out: list[Step] = []
    for st in path:
        if st.kind == "Slice" and out and out[-1].kind == "Slice":
            out[-1] = Step("Slice", None, out[-1].before, st.after, 0.0, 0.0)
        else:
            out.append(st if st.kind != "Slice" else Step("Slice", None, st.before, st.after, 0, 0))
    return tuple(out)


def _gather_then_slice(src: Layout, dst: Layout, itemsize: float, mesh: Mesh) -> tuple[Step, ...]:
    """All-reduce every partial axis, gather every split axis (minor first), slice to ``dst``."""
    steps: list[Step] = []
    cur = src
    for a in list(cur.partial):
        nxt = Layout(
            cur.shape, cur.device_matrix, cur.dims, tuple(x for x in cur.partial if x != a)
        )
        steps.append(_step("AllReduce", a, cur, nxt, itemsize, mesh))
        cur = nxt
    for d in range(len(cur.dims)):
        while cur.dims[d]:
            a = cur.dims[d][-1]
            dims = list(cur.dims)
            dims[d] = dims[d][:-1]
            nxt = Layout(cur.shape, cur.device_matrix, tuple(dims), cur.partial)
            if cur.device_matrix[a] > 1:
                steps.append(_step("AllGather", a, cur, nxt, itemsize, mesh))
            cur = nxt
    if any(dst.dims):
        steps.append(Step("Slice", None, cur, dst, 0.0, 0.0))
    return tuple(steps)


def gather_then_slice_cost(src: Layout, dst: Layout, itemsize: float, mesh: Mesh) -> float:
    """The time of the naive plan: the ceiling every redistribution stays under."""
    return sum(s.time for s in _gather_then_slice(canonical(src), dst, itemsize, mesh))
