"""Which device runs which block: the placement of a plan's blocks on a heterogeneous cluster.

A plan's blocks are found first (by any method); this module then chooses ``placement[b]``,
the distinct device of block b, minimising the bottleneck of :func:`solver.core.cost.evaluate`
under every device's capacity. Devices with equal (fast memory, capacity, compute, group)
are interchangeable (every cost of docs/clusters.md depends on a device only through these
and a link only through the two groups), so the search is over *classes*: a sequence of
class labels, one per block, using each class at most as often as it has devices.

- :func:`best_placement` is exact (branch and bound over class sequences, pruned by each
  block's device-only cost plus its io at the fastest link) while the number of partial
  sequences stays below ``exact_limit``, and otherwise a local search (pairwise swaps and
  moves to spare devices) from the identity, a consecutive-in-one-group and a
  heavy-on-big-device start. It says which (``Placement.exact``).
- :func:`planning_cluster` is the flat cluster the heuristics plan their blocks on.
- :func:`candidate_sequences` are the device sequences the device-aware heuristics plan
  against directly (block b on device b of the sequence).
- :func:`group_clusters` are the distinct groups of a cluster, each as a cluster of its own,
  on which the pipeline methods also plan (a plan inside one group never pays the link
  between groups); :func:`full_placement` maps such a plan's blocks back.

Pure functions; on a homogeneous cluster the identity is optimal and is returned at once.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from solver.core.cluster import Cluster, Topology
from solver.core.cost import evaluate
from solver.core.graph import Graph

EXACT_LIMIT = 100_000  # partial class sequences the exact search may hold at one level
LOCAL_ROUNDS = 200  # improvement rounds of the local search
CAP_TOL = 1e-12  # the relative capacity tolerance of solver.core.cost.validate


@dataclass(frozen=True)
class DeviceClasses:
    """Devices grouped by (fast memory, capacity, compute, group): ``devices[c]`` are the ids
    of class c (ascending), the arrays hold each class's values."""

    devices: tuple[tuple[int, ...], ...]
    memory: np.ndarray
    capacity: np.ndarray  # inf: no hard limit
    compute: np.ndarray
    group: np.ndarray

    @property
    def count(self) -> np.ndarray:
        return np.array([len(d) for d in self.devices], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.devices)


def device_classes(cluster: Cluster) -> DeviceClasses:
    """The classes of interchangeable devices of ``cluster`` (in order of first device)."""
    memory, capacity, compute = cluster.device_arrays()
    group = np.zeros(cluster.devices, dtype=np.int64)
    for i, members in enumerate(cluster.groups):
        group[list(members)] = i
    keys: dict[tuple, list[int]] = {}
    for d in range(cluster.devices):
        key = (float(memory[d]), float(capacity[d]), float(compute[d]), int(group[d]))
        keys.setdefault(key, []).append(d)
    ks = list(keys)
    return DeviceClasses(
        devices=tuple(tuple(keys[k]) for k in ks),
        memory=np.array([k[0] for k in ks]),
        capacity=np.array([k[1] for k in ks]),
        compute=np.array([k[2] for k in ks]),
        group=np.array([k[3] for k in ks], dtype=np.int64),
    )


def group_links(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth, link-class id) of the link from a device of group i to another device of
    group j, as two (groups x groups) arrays; link classes are distinct (bandwidth, latency)."""
    t = cluster.topology
    n = len(cluster.groups)
    if t is None:
        return np.full((1, 1), cluster.link_bandwidth), np.zeros((1, 1), dtype=np.int64)
    between = t.between or (math.inf, 0.0)
    links = [[t.links[i] if i == j else between for j in range(n)] for i in range(n)]
    ids: dict[tuple[float, float], int] = {}
    cls = np.array([[ids.setdefault(lk, len(ids)) for lk in row] for row in links])
    bw = np.array([[lk[0] for lk in row] for row in links], dtype=float)
    return bw, cls.astype(np.int64)


@dataclass(frozen=True)
class Placement:
    """The chosen device of each block (None when no placement fits the capacities), its
    re-evaluated objective (inf when none fits) and whether the search proved it optimal
    for these blocks."""

    devices: np.ndarray | None
    objective: float
    exact: bool


class _Costs:
    """Block costs of one assignment for many class sequences at once (rows x k)."""

    def __init__(self, g: Graph, cluster: Cluster, a: np.ndarray, k: int):
        self.k, self.cl = k, device_classes(cluster)
        self.bw, self.lcls = group_links(cluster)
        ref = evaluate(g, _flat(cluster), a, k)  # reference-device work, bytes, memory
        need = ref.params + ref.peak
        cl = self.cl
        speed = cl.compute / cluster.compute
        over = np.maximum(0.0, need[:, None] - cl.memory[None, :]) / cluster.slow_memory_bandwidth
        dev = ref.work[:, None] / speed[None, :] + over
        fits = need[:, None] <= cl.capacity[None, :] * (1 + CAP_TOL)
        self.device = np.where(fits, dev, math.inf)  # (k, classes)
        self.need = need
        # the transfers: (tensor, receiving block) pairs and each sent tensor's readers
        pt = g.pair_tensor
        pb = a[g.t_producer]
        cb = a[g.t_cons]
        cross = cb != pb[pt]
        keys = np.unique(pt[cross] * k + cb[cross]) if cross.any() else np.zeros(0, np.int64)
        self.recv = [
            (int(t), int(pb[t]), int(b), float(g.t_size[t]))
            for t, b in zip((keys // k).tolist(), (keys % k).tolist(), strict=True)
        ]
        readers: dict[int, list[int]] = {}
        for t, _, b, _ in self.recv:
            readers.setdefault(t, []).append(b)
        self.send = [(int(pb[t]), rs, float(g.t_size[t])) for t, rs in readers.items()]
        fastest = float(self.bw.max())
        io_min = np.zeros(k)
        for _, _p, b, s in self.recv:
            io_min[b] += s / fastest
        for p, _, s in self.send:
            io_min[p] += s / fastest
        self.bound = self.device + io_min[:, None]  # a lower bound of f_b on each class

    def f(self, P: np.ndarray) -> np.ndarray:
        """Block costs (rows x k) of class sequences ``P`` (rows x k); inf over capacity."""
        f = self.device[np.arange(self.k)[None, :], P].copy()
        grp = self.cl.group[P]
        for _, p, b, s in self.recv:
            f[:, b] += s / self.bw[grp[:, p], grp[:, b]]
        n_cls = int(self.lcls.max()) + 1
        bw_of = np.zeros(n_cls)
        bw_of[self.lcls.reshape(-1)] = self.bw.reshape(-1)
        for p, rs, s in self.send:
            lc = self.lcls[grp[:, [p]], grp[:, rs]]  # rows x readers
            for c in range(n_cls):
                f[:, p] += np.where((lc == c).any(axis=1), s / bw_of[c], 0.0)
        return f


def _flat(cluster: Cluster) -> Cluster:
    """The cluster without topology (reference device): the evaluator's per-block sums."""
    return replace(cluster, topology=None, fast_memory=math.inf, capacity=None)


def _devices_of(cl: DeviceClasses, seq: np.ndarray) -> np.ndarray:
    """Device ids of a class sequence: each class's devices in block order."""
    nxt = [0] * len(cl)
    out = np.empty(len(seq), dtype=np.int64)
    for b, c in enumerate(seq.tolist()):
        out[b] = cl.devices[c][nxt[c]]
        nxt[c] += 1
    return out


def _classes_of(cl: DeviceClasses, devices: np.ndarray) -> np.ndarray:
    where = {d: c for c, ds in enumerate(cl.devices) for d in ds}
    return np.array([where[int(d)] for d in devices], dtype=np.int64)


def best_placement(
    g: Graph,
    cluster: Cluster,
    a: np.ndarray,
    k: int | None = None,
    exact_limit: int = EXACT_LIMIT,
) -> Placement:
    """The placement of the k blocks of assignment ``a`` with the least bottleneck.

    >>> from solver.core.cluster import Cluster, Topology
    >>> g = Graph.build(["a", "b"], [1.0, 4.0], [2.0, 0.0], [(0, 1)])
    >>> topo = Topology(((0, 1),), ("h",), ((1.0, 0.0),), compute=(1.0, 2.0))
    >>> c = Cluster("c", 2, compute=1.0, link_bandwidth=1.0, topology=topo)
    >>> p = best_placement(g, c, np.array([0, 1]))
    >>> p.devices.tolist(), p.objective, p.exact   # the heavy block on the fast device
    ([0, 1], 4.0, True)
    >>> best_placement(g, c, np.array([1, 0])).devices.tolist()
    [1, 0]
    """
    k = cluster.devices if k is None else k
    a = np.asarray(a, dtype=np.int64)
    if cluster.homogeneous:
        dev = np.arange(k)
        return Placement(dev, evaluate(g, cluster, a, k).objective, True)
    costs = _Costs(g, cluster, a, k)
    seq, val = _local_search(costs, _starts(costs))
    exact = _branch_and_bound(costs, val, exact_limit)
    if exact is not None:
        if exact[0] is not None:
            seq, val = exact
        elif not math.isfinite(val):
            return Placement(None, math.inf, True)
    if seq is None or not math.isfinite(val):
        return Placement(None, math.inf, exact is not None)
    dev = _devices_of(costs.cl, seq)
    return Placement(dev, evaluate(g, cluster, a, k, placement=dev).objective, exact is not None)


def _key(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lexicographic score of rows of block costs: bottleneck, then the sum."""
    return f.max(axis=1), np.where(np.isfinite(f), f, 0.0).sum(axis=1)


def _starts(costs: _Costs) -> list[np.ndarray]:
    """Starting class sequences: identity (devices 0..k-1), consecutive blocks kept inside
    one group (largest groups first), and the heaviest blocks on the fastest/biggest class."""
    cl, k = costs.cl, costs.k
    starts = []
    order = list(itertools.chain.from_iterable(cl.devices))
    ident = _classes_of(cl, np.array(sorted(order)[:k]))
    starts.append(ident)
    by_group = sorted(
        range(len(cl)),
        key=lambda c: (
            -int(cl.count[cl.group == cl.group[c]].sum()),
            int(cl.group[c]),
            -cl.compute[c],
        ),
    )
    seq = [c for c in by_group for _ in range(int(cl.count[c]))][:k]
    starts.append(np.array(seq, dtype=np.int64))
    # greedy: blocks by memory need then work, each on the class with the least device cost
    left = cl.count.copy()
    greedy = np.zeros(k, dtype=np.int64)
    for b in np.lexsort((-costs.device.min(axis=1), -costs.need)).tolist():
        opts = [c for c in range(len(cl)) if left[c] > 0]
        c = min(opts, key=lambda c: (costs.device[b, c], -cl.capacity[c], -cl.compute[c]))
        greedy[b] = c
        left[c] -= 1
    starts.append(greedy)
    return starts


def _local_search(costs: _Costs, starts: list[np.ndarray]) -> tuple[np.ndarray | None, float]:
    """Best of pairwise-swap and move-to-spare-class descent from each start."""
    best, best_key = None, (math.inf, math.inf)
    cl, k = costs.cl, costs.k
    pairs = np.array(list(itertools.combinations(range(k), 2)), dtype=np.int64).reshape(-1, 2)
    for seq in starts:
        seq = seq.copy()
        f = costs.f(seq[None, :])
        cur = (float(f.max()), float(_key(f)[1][0]))
        for _ in range(LOCAL_ROUNDS):
            cands = np.repeat(seq[None, :], len(pairs), axis=0)
            r = np.arange(len(pairs))
            cands[r, pairs[:, 0]], cands[r, pairs[:, 1]] = seq[pairs[:, 1]], seq[pairs[:, 0]]
            spare = cl.count - np.bincount(seq, minlength=len(cl))
            moves = [(b, c) for b in range(k) for c in np.flatnonzero(spare > 0).tolist()]
            if moves:
                mv = np.repeat(seq[None, :], len(moves), axis=0)
                mv[np.arange(len(moves)), [b for b, _ in moves]] = [c for _, c in moves]
                cands = np.concatenate([cands, mv])
            if not len(cands):
                break
            mx, sm = _key(costs.f(cands))
            i = int(np.lexsort((sm, mx))[0])
            if (float(mx[i]), float(sm[i])) < cur:
                seq, cur = cands[i], (float(mx[i]), float(sm[i]))
            else:
                break
        if cur < best_key:
            best, best_key = seq, cur
    return best, best_key[0]


def _branch_and_bound(
    costs: _Costs, upper: float, limit: int
) -> tuple[np.ndarray | None, float] | None:
    """The optimal class sequence, or (None, inf) when none beats ``upper`` (or, with an
    infinite ``upper``, none fits); None when the partial sequences exceed ``limit``.

    Level by level over the blocks: a partial sequence is kept only while every placed
    block's lower bound (device cost + its io at the fastest link) is below the incumbent,
    so nothing better than ``upper`` is ever pruned."""
    cl, k = costs.cl, costs.k
    rows = np.zeros((1, 0), dtype=np.int64)
    used = np.zeros((1, len(cl)), dtype=np.int64)
    for b in range(k):
        ok = (used < cl.count[None, :]) & (costs.bound[b][None, :] < upper)
        r, c = np.nonzero(ok)
        if len(r) > limit:
            return None
        rows = np.concatenate([rows[r], c[:, None]], axis=1)
        used = used[r]
        used[np.arange(len(r)), c] += 1
        if not len(rows):
            return (None, math.inf)
    best, best_val = None, upper
    for i in range(0, len(rows), 4096):
        chunk = rows[i : i + 4096]
        mx, sm = _key(costs.f(chunk))
        j = int(np.lexsort((sm, mx))[0])
        if mx[j] < best_val:
            best, best_val = chunk[j], float(mx[j])
    return (best, best_val) if best is not None else (None, math.inf)


def planning_cluster(cluster: Cluster, biggest: bool = False) -> Cluster:
    """A homogeneous cluster the pipeline heuristics find blocks on before
    :func:`best_placement` places them: the reference compute, the cluster's link, and the
    smallest device's fast memory and capacity (every block then fits any device), or with
    ``biggest`` the largest (blocks that only the big devices hold)."""
    if cluster.homogeneous:
        return cluster
    memory, capacity, _ = cluster.device_arrays()
    pick = np.max if biggest else np.min
    cap = float(pick(capacity))
    return replace(
        cluster,
        topology=None,
        fast_memory=float(pick(memory)),
        capacity=None if math.isinf(cap) else cap,
    )


def candidate_sequences(cluster: Cluster, k: int, hints: list[np.ndarray] = ()) -> list[np.ndarray]:
    """Device sequences of length k for the heuristics that plan against devices: the group
    order (devices group by group, in id order), big and fast devices first (capacity, fast
    memory, compute; then group order), and ``hints`` (such as best_placement's devices for
    blocks found on a flat view); one sequence per distinct sequence of device classes."""
    memory, capacity, compute = cluster.device_arrays()
    grouped = [d for members in cluster.groups for d in members]
    rank = {d: i for i, d in enumerate(grouped)}
    big = sorted(grouped, key=lambda d: (-capacity[d], -memory[d], -compute[d], rank[d]))
    cl = device_classes(cluster)
    out, seen = [], set()
    for seq in [np.array(grouped[:k]), np.array(big[:k]), *hints]:
        seq = np.asarray(seq, dtype=np.int64)
        if len(seq) != k:
            continue
        key = tuple(_classes_of(cl, seq).tolist())
        if key not in seen:
            seen.add(key)
            out.append(seq)
    return out


@dataclass(frozen=True)
class GroupCluster:
    """One group of a cluster as a cluster of its own (its devices, its inside link):
    device i of ``cluster`` is device ``devices[i]`` of the whole cluster."""

    cluster: Cluster
    devices: np.ndarray


def group_clusters(cluster: Cluster) -> list[GroupCluster]:
    """Each distinct group of a cluster with two or more groups as a cluster of its own
    (empty otherwise): a plan inside one group never pays the link between groups, which can
    make it better than every plan that crosses. Groups with the same devices (fast memory,
    capacity, compute, as a multiset) and the same inside link give one cluster; its devices
    are sorted by those values (big and fast first, so that a prefix keeps the best ones),
    and a plan on it maps to either group alike."""
    t = cluster.topology
    if t is None or len(t.groups) < 2:
        return []
    memory, capacity, compute = cluster.device_arrays()
    out, seen = [], set()
    for name, members, link in zip(t.names, t.groups, t.links, strict=True):
        devs = sorted(members, key=lambda d: (-capacity[d], -memory[d], -compute[d], d))
        values = tuple((float(memory[d]), float(capacity[d]), float(compute[d])) for d in devs)
        key = (tuple(link), values)
        if key in seen:
            continue
        seen.add(key)
        out.append(GroupCluster(_one_group(cluster, name, link, values), np.array(devs)))
    return out


def _one_group(cluster: Cluster, name: str, link, values: tuple) -> Cluster:
    """A cluster of the devices ``values`` ((memory, capacity, compute) each) joined by
    ``link``; without topology when they are alike and at the reference compute (work(v)
    keeps its meaning: seconds on a device of ``cluster.compute``)."""
    m = len(values)
    mem, cap, comp = (tuple(v[i] for v in values) for i in range(3))
    alike = len(set(values)) == 1 and comp[0] == cluster.compute
    topo = None
    if not alike:
        topo = Topology(
            groups=(tuple(range(m)),),
            names=(name,),
            links=(tuple(link),),
            fast_memory=mem,
            capacity=tuple(None if math.isinf(c) else c for c in cap),
            compute=comp,
        )
    return replace(
        cluster,
        name=f"{cluster.name}/{name}",
        devices=m,
        fast_memory=mem[0],
        capacity=None if math.isinf(cap[0]) else cap[0],
        link_bandwidth=float(link[0]),
        link_latency=float(link[1]),
        topology=topo,
    )


def full_placement(cluster: Cluster, used: np.ndarray) -> np.ndarray:
    """A placement of all ``cluster.devices`` blocks whose first blocks run on ``used`` (in
    order) and whose remaining (empty) blocks take the other devices in id order."""
    used = np.asarray(used, dtype=np.int64)
    rest = np.setdiff1d(np.arange(cluster.devices), used)
    return np.concatenate([used, rest]).astype(np.int64)
