"""The device mesh and tensor layouts (device matrix + tensor map), as MindSpore defines them.

Devices are numbered row-major over a device matrix: on ``[2, 4]`` device ``d`` has coordinates
``(d // 4, d % 4)``. A :class:`Layout` says, for every tensor dimension, which device-matrix axes
split it (major to minor), and over which axes the tensor is a partial sum. Axes that split no
dimension and hold no partial sum replicate the tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from solver.core.errors import MtppError


@dataclass(frozen=True)
class Mesh:
    """The physical devices as a logical matrix; each axis has an alpha-beta link model.

    ``bandwidth[i]`` (bytes/s) and ``latency[i]`` (s per collective step) price a collective
    among devices that differ only along mesh axis ``i``.
    """

    shape: tuple[int, ...]
    bandwidth: tuple[float, ...]
    latency: tuple[float, ...]

    @property
    def devices(self) -> int:
        return math.prod(self.shape)

    def to_dict(self) -> dict:
        return {
            "shape": list(self.shape),
            "devices": self.devices,
            "bandwidth": list(self.bandwidth),
            "latency": list(self.latency),
        }

    def group_link(self, device_matrix: tuple[int, ...], axis: int) -> tuple[float, float]:
        """(bandwidth, latency) of a collective along ``axis`` of ``device_matrix``: the
        slowest mesh axis the group spans sets the bandwidth, the largest latency the step."""
        return _group_link(self, tuple(device_matrix), axis)


@lru_cache(maxsize=4096)
def _group_link(mesh: Mesh, device_matrix: tuple[int, ...], axis: int) -> tuple[float, float]:
    if device_matrix[axis] == 1:
        return (math.inf, 0.0)
    group = np.arange(device_matrix[axis]) * math.prod(device_matrix[axis + 1 :])
    coords = np.array(np.unravel_index(group, mesh.shape))  # [mesh axes, group]
    spans = [i for i in range(len(mesh.shape)) if len(set(coords[i].tolist())) > 1]
    bw = min(mesh.bandwidth[i] for i in spans)
    lat = max(mesh.latency[i] for i in spans)
    return (bw, lat)


def parse_mesh(spec: str | None, devices: int) -> tuple[int, ...]:
    """``"2x4"`` -> ``(2, 4)``; None -> ``(devices,)``. The product must be ``devices``."""
    if spec is None:
        return (devices,)
    try:
        shape = tuple(int(x) for x in str(spec).lower().split("x"))
    except ValueError:
        raise MtppError(f"--mesh {spec!r}: write sizes joined by 'x', e.g. --mesh 2x4") from None
    if not shape or any(s < 1 for s in shape):
        raise MtppError(f"--mesh {spec!r}: every axis size must be >= 1")
    if math.prod(shape) != devices:
        raise MtppError(
            f"--mesh {spec}: multiplies to {math.prod(shape)} devices but --devices is "
            f"{devices}; make the product equal the devices"
        )
    return shape


def make_mesh(shape: tuple[int, ...], cluster) -> Mesh:
    """The mesh ``shape`` over devices 0..n-1 of ``cluster`` (row-major): see :func:`mesh_on`."""
    return mesh_on(cluster, range(math.prod(shape)), shape)


def mesh_on(cluster, devices, shape: tuple[int, ...]) -> Mesh:
    """The mesh ``shape`` laid row-major over the cluster's ``devices`` (ids), topology-aware.

    Axis i gets the slowest link (least bandwidth, largest latency) of ``cluster.link(a, b)``
    over device pairs that differ only along axis i, so a 2x8 mesh on two 8-GPU servers prices
    axis 0 at the link between servers and axis 1 at the link inside one. A size-1 axis (no
    pair) and every axis of a flat cluster get the cluster's own link, as before topologies.
    """
    shape = tuple(int(s) for s in shape)
    ids = np.asarray(list(devices), dtype=np.int64)
    if ids.size != math.prod(shape):
        raise MtppError(f"mesh {shape} needs {math.prod(shape)} devices, got {ids.size}")
    if len(set(ids.tolist())) != ids.size:
        raise MtppError(f"mesh {shape}: a device is listed twice in {ids.tolist()}")
    own = (float(cluster.link_bandwidth), float(cluster.link_latency))
    if cluster.topology is None:  # every link alike: the cluster's own (make_mesh as before)
        return Mesh(shape, (own[0],) * len(shape), (own[1],) * len(shape))
    for d in ids.tolist():
        cluster.device_memory(d)  # refuses an id the cluster does not have
    grid = ids.reshape(shape) if shape else ids
    group_of = np.empty(cluster.devices, dtype=np.int64)
    for gi, members in enumerate(cluster.groups):
        group_of[list(members)] = gi
    bws, lats = [], []
    for axis, size in enumerate(shape):
        if size == 1:
            bws.append(own[0])
            lats.append(own[1])
            continue
        # every pair (j, k) of positions along the axis, at every position of the other axes
        j, k = np.triu_indices(size, 1)
        src = np.take(grid, j, axis=axis).ravel()
        dst = np.take(grid, k, axis=axis).ravel()
        bw1, lat1 = cluster.link_arrays(src, dst)
        bw2, lat2 = cluster.link_arrays(dst, src)
        same = group_of[src] == group_of[dst]
        if len(shape) > 1 and same.any() and not same.all():
            raise MtppError(mesh_misfit(cluster, shape, axis))
        bws.append(float(min(bw1.min(), bw2.min())))
        lats.append(float(max(lat1.max(), lat2.max())))
    return Mesh(shape, tuple(bws), tuple(lats))


def mesh_misfit(cluster, shape: tuple[int, ...], axis: int) -> str:
    """The one-line refusal of a multi-axis mesh whose ``axis`` joins some devices inside a
    group and some across groups: its collectives would run at two speeds at once, which the
    alpha-beta model of one link per axis cannot price. A 1-D mesh over several groups is
    allowed (priced at its slowest link: the default for all devices), and so is an axis inside
    groups whose links differ (priced at the slowest)."""
    sizes = sorted({len(g) for g in cluster.groups})
    fit = (
        f"e.g. {len(cluster.groups)}x{sizes[0]} (groups x devices per group)"
        if len(sizes) == 1 and len(cluster.groups) * sizes[0] == math.prod(shape)
        else "one axis inside the groups and one across them"
    )
    return (
        f"mesh {'x'.join(map(str, shape))} does not fit the groups of cluster {cluster.name!r}: "
        f"axis {axis} joins some devices inside a group and some across groups; use a mesh "
        f"whose every axis stays inside the groups or only crosses them, {fit}"
    )


@dataclass(frozen=True)
class Layout:
    """How one tensor of global ``shape`` lies on the devices of ``device_matrix``.

    ``dims[d]``: device-matrix axes (left-indexed, major first) splitting tensor dim ``d``;
    ``partial``: axes over which the devices hold partial sums (the value is their sum).
    """

    shape: tuple[int, ...]
    device_matrix: tuple[int, ...]
    dims: tuple[tuple[int, ...], ...]
    partial: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        used = [a for axes in self.dims for a in axes] + list(self.partial)
        if len(used) != len(set(used)) or any(not 0 <= a < len(self.device_matrix) for a in used):
            raise ValueError(f"bad layout {self}")
        if len(self.dims) != len(self.shape):
            raise ValueError(f"layout rank {len(self.dims)} != tensor rank {len(self.shape)}")
        for s, n in zip(self.shape, self._splits, strict=True):
            if s % n:
                raise ValueError(f"{self.shape} not divisible by the splits {self._splits}")

    @cached_property
    def _splits(self) -> tuple[int, ...]:
        dm = self.device_matrix
        return tuple(math.prod(dm[a] for a in axes) for axes in self.dims)

    @cached_property
    def _hash(self) -> int:
        return hash((self.shape, self.device_matrix, self.dims, self.partial))

    def __hash__(self) -> int:
        return self._hash

    @property
    def devices(self) -> int:
        return math.prod(self.device_matrix)

    def splits(self, d: int) -> int:
        return self._splits[d]

    @property
    def tensor_map(self) -> list:
        """The seed's tensor map: per tensor dim the device-matrix axis counted from the right
        (the last axis is 0), -1 when not split; a list when several axes split one dim."""
        m = len(self.device_matrix)
        out: list = []
        for axes in self.dims:
            if not axes:
                out.append(-1)
            elif len(axes) == 1:
                out.append(m - 1 - axes[0])
            else:
                out.append([m - 1 - a for a in axes])
        return out

    @cached_property
    def local_shape(self) -> tuple[int, ...]:
        return tuple(s // n for s, n in zip(self.shape, self._splits, strict=True))

    def coords(self, rank: int) -> tuple[int, ...]:
        return tuple(int(c) for c in np.unravel_index(rank, self.device_matrix))

    def block(self, rank: int) -> tuple[slice, ...]:
        """The global index ranges device ``rank`` holds."""
        c = self.coords(rank)
        out = []
        for d, axes in enumerate(self.dims):
            idx = 0
            for a in axes:
                idx = idx * self.device_matrix[a] + c[a]
            size = self.shape[d] // self.splits(d)
            out.append(slice(idx * size, (idx + 1) * size))
        return tuple(out)

    def to_dict(self) -> dict:
        return {
            "shape": list(self.shape),
            "device_matrix": list(self.device_matrix),
            "tensor_map": self.tensor_map,
            "partial": [len(self.device_matrix) - 1 - a for a in self.partial],
        }

    def describe(self) -> str:
        tm = ",".join(str(x) for x in self.tensor_map)
        p = f" partial{[len(self.device_matrix) - 1 - a for a in self.partial]}" * bool(
            self.partial
        )
        return f"dm{list(self.device_matrix)} map[{tm}]{p}"


def replicated(shape: tuple[int, ...], devices: int) -> Layout:
    """The whole tensor on every device."""
    return Layout(tuple(shape), (devices,), tuple(() for _ in shape))


# ---------------------------------------------------------------------- canonical forms
@lru_cache(maxsize=65536)
def canonical(lay: Layout) -> Layout:
    """The same placement with size-1 axes dropped and axes that always travel together merged.

    Two layouts place every element identically iff their canonical forms are equal.
    """
    dm = lay.device_matrix
    keep = [a for a in range(len(dm)) if dm[a] > 1]
    role = {}
    for d, axes in enumerate(lay.dims):
        for i, a in enumerate(axes):
            role[a] = ("d", d, i)
    for a in lay.partial:
        role[a] = ("p",)
    # merge runs of adjacent kept axes with the same role continuing in order
    groups: list[list[int]] = []
    for a in keep:
        if groups:
            b = groups[-1][-1]
            rb, ra = role.get(b, ("r",)), role.get(a, ("r",))
            same = rb[0] == ra[0] and (
                rb[0] in ("p", "r") or (rb[1] == ra[1] and _next_in_dim(lay.dims[ra[1]], b, a, dm))
            )
            if same:
                groups[-1].append(a)
                continue
        groups.append([a])
    new_of = {a: i for i, g in enumerate(groups) for a in g}
    new_dm = tuple(math.prod(dm[a] for a in g) for g in groups)
    dims = tuple(tuple(dict.fromkeys(new_of[a] for a in axes if dm[a] > 1)) for axes in lay.dims)
    partial = tuple(sorted({new_of[a] for a in lay.partial if dm[a] > 1}))
    if not new_dm:
        new_dm = (1,)
    return Layout(lay.shape, new_dm, dims, partial)


def _next_in_dim(axes: tuple[int, ...], b: int, a: int, dm) -> bool:
    """True when ``a`` follows ``b`` in ``axes`` with only size-1 axes between them."""
    if b not in axes or a not in axes:
        return False
    i, j = axes.index(b), axes.index(a)
    return j > i and all(dm[x] == 1 for x in axes[i + 1 : j])


def same_placement(x: Layout, y: Layout) -> bool:
    return x.shape == y.shape and canonical(x) == canonical(y)


def _cuts(dm: tuple[int, ...]) -> list[int]:
    out, p = [], 1
    for s in reversed(dm):
        p *= s
        out.append(p)
    return out


def common_matrix(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The coarsest device matrix refining both (row-major numbering kept), or None."""
    cuts = sorted(set(_cuts(a)) | set(_cuts(b)) | {1})
    for x, y in zip(cuts, cuts[1:], strict=False):
        if y % x:
            return None
    return tuple(reversed([y // x for x, y in zip(cuts, cuts[1:], strict=False)]))


def refine(lay: Layout, fine: tuple[int, ...]) -> Layout:
    """Express ``lay`` on the finer device matrix ``fine`` (same devices, same numbering)."""
    runs: list[list[int]] = []
    j = len(fine)
    for s in reversed(lay.device_matrix):
        run, p = [], 1
        while p < s:
            j -= 1
            run.append(j)
            p *= fine[j]
        if p != s:
            raise ValueError(f"{fine} does not refine {lay.device_matrix}")
        runs.append(sorted(run))
    runs.reverse()
    dims = tuple(tuple(x for a in axes for x in runs[a]) for axes in lay.dims)
    partial = tuple(sorted(x for a in lay.partial for x in runs[a]))
    return Layout(lay.shape, tuple(fine), dims, partial)
