"""The one evaluator of block costs f(S), plan validation, and a universal lower bound.

Every number a solver reports is recomputed here (DESIGN.md, "The problem"):

    io_in(S)    = (1/B) * bytes of tensors produced outside S with a consumer in S (each once)
    io_out(S)   = (1/B) * bytes of tensors produced in S with a consumer outside S (each once)
    peak(S)     = max over nodes v in S of act(v)     (largest single-op working set)
    overflow(S) = max(0, params(S) + peak(S) - M) / B_mem
    f(S)        = io_in(S) + work(S) + overflow(S) + io_out(S);  objective = max_S f(S)

Everything is vectorised over nodes, tensors and parameters (one ``np.unique`` per term), so a
100,000-node plan evaluates in well under a second (``benchmarks/bench_evaluate.py``).

On a cluster with a topology that is not homogeneous (docs/clusters.md), block b runs on device
``placement[b]`` (default b) and every term uses that device and its links:

    work(S)     = sum of work(v) * compute / compute_d   (work is seconds on the reference device)
    overflow(S) = max(0, params(S) + peak(S) - M_d) / B_mem;   valid when params + peak <= C_d
    io_in(S)    = sum over received tensors t of size(t) / bandwidth(link(sender of t, d))
    io_out(S)   = sum over sent tensors t and over the distinct link classes (bandwidth,
                  latency) that lead from d to t's consumers of size(t) / bandwidth(class)

A multicast tensor is sent once per distinct link class, not once per consumer and not once
at the slowest rate: consumers behind the same kind of link share one send, as on a uniform
cluster (where this is exactly the rule above), while a copy that leaves the host goes out on
a different wire (NIC, gateway) and is paid separately at that wire's rate. Homogeneous
clusters take the original code path, so their numbers are bit-for-bit those of a cluster
without topology.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view


@dataclass(frozen=True)
class Evaluation:
    """Per-block costs of one plan (arrays of length k, seconds or bytes) and the objective."""

    k: int
    io_in: np.ndarray
    work: np.ndarray
    overflow: np.ndarray
    io_out: np.ndarray
    f: np.ndarray
    peak: np.ndarray
    params: np.ndarray
    bytes_in: np.ndarray
    bytes_out: np.ndarray
    nodes: np.ndarray
    placement: np.ndarray | None = None  # device of each block, when one was given

    @property
    def objective(self) -> float:
        """The bottleneck max f(S): the pipeline period (seconds per request)."""
        return float(self.f.max())

    @property
    def throughput(self) -> float:
        """Requests per second in steady state: 1 / objective."""
        obj = self.objective
        return math.inf if obj == 0 else 1.0 / obj

    @property
    def latency(self) -> float:
        """One request through the whole pipeline: the sum of the block costs."""
        return float(self.f.sum())

    @property
    def bottleneck(self) -> int:
        return int(np.argmax(self.f))

    def blocks(self) -> list[dict]:
        """Per-block rows for tables and JSON."""
        return [
            {
                "block": b,
                "nodes": int(self.nodes[b]),
                "work": float(self.work[b]),
                "io_in": float(self.io_in[b]),
                "io_out": float(self.io_out[b]),
                "overflow": float(self.overflow[b]),
                "f": float(self.f[b]),
                "param_bytes": float(self.params[b]),
                "peak_bytes": float(self.peak[b]),
                "bytes_in": float(self.bytes_in[b]),
                "bytes_out": float(self.bytes_out[b]),
            }
            | ({} if self.placement is None else {"device": int(self.placement[b])})
            for b in range(self.k)
        ]


def check_assignment(g: Graph, assignment: np.ndarray, k: int) -> np.ndarray:
    """Coerce ``assignment`` to an int array of length n with values in 0..k-1, or raise."""
    a = np.asarray(assignment)
    if a.shape != (g.n,):
        raise MtppError(f"the plan assigns {a.size} nodes but graph {g.name!r} has {g.n}")
    if not np.issubdtype(a.dtype, np.integer):
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise MtppError("block numbers in a plan must be whole numbers")
        a = a.astype(np.int64)
    bad = (a < 0) | (a >= k)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise MtppError(
            f"node {g.names[i]!r} is assigned to block {int(a[i])}, but blocks are 0..{k - 1}"
        )
    return a.astype(np.int64, copy=False)


def check_placement(cluster: Cluster, k: int, placement: object = None) -> np.ndarray | None:
    """The device of each of the k blocks as an int array, or raise :class:`MtppError`.

    ``placement[b]`` is the device running block b: distinct devices of the cluster. None
    means block b on device b; it returns None for a homogeneous cluster (any k works, as
    before), and refuses more blocks than devices on a heterogeneous one.
    """
    if placement is None:
        if cluster.homogeneous:
            return None
        if k > cluster.devices:
            raise MtppError(
                f"the plan has {k} blocks but cluster {cluster.name!r} has {cluster.devices} "
                "devices with their own memory, compute or links; use at most that many blocks"
            )
        return np.arange(k)
    p = np.asarray(placement)
    if p.shape != (k,) or not (np.issubdtype(p.dtype, np.integer) or p.size == 0):
        raise MtppError(f"a placement must list one whole device number per block ({k} blocks)")
    p = p.astype(np.int64)
    bad = (p < 0) | (p >= cluster.devices)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise MtppError(
            f"placement puts block {b} on device {int(p[b])}, but devices are "
            f"0..{cluster.devices - 1}"
        )
    if len(np.unique(p)) != k:
        raise MtppError("placement puts two blocks on the same device; give each its own")
    return p


def evaluate(
    g: Graph,
    cluster: Cluster,
    assignment: np.ndarray,
    k: int | None = None,
    placement: object = None,
) -> Evaluation:
    """Block costs of a plan (``assignment[v]`` = block of node v, blocks 0..k-1).

    ``placement[b]`` is the device running block b (default b; see :func:`check_placement`);
    it matters only on a cluster that is not homogeneous. Does not check precedence or
    capacity; see :func:`validate`.

    >>> from solver.core.graph import Graph, coarse_view
    >>> from solver.core.cluster import Cluster
    >>> g = Graph.build(["a", "b"], [1.0, 2.0], [4.0, 0.0], [(0, 1)])
    >>> ev = evaluate(g, Cluster("c", 2, link_bandwidth=2.0), [0, 1])
    >>> ev.f.tolist()   # a sends 4 bytes at 2 B/s; b receives them
    [3.0, 4.0]
    """
    k = cluster.devices if k is None else k
    a = check_assignment(g, assignment, k)
    dev = check_placement(cluster, k, placement)
    if not cluster.homogeneous:
        return _evaluate_on_topology(g, cluster, a, k, dev)
    B = cluster.link_bandwidth

    work = np.bincount(a, weights=g.work, minlength=k)
    nodes = np.bincount(a, minlength=k)

    # io: (tensor, consumer block) pairs that cross from the producer's block
    pt = g.pair_tensor
    prod_block = a[g.t_producer]
    cb = a[g.t_cons]
    cross = cb != prod_block[pt]
    bytes_in = np.zeros(k)
    bytes_out = np.zeros(k)
    if cross.any():
        keys = np.unique(pt[cross] * k + cb[cross])
        t_in, b_in = keys // k, keys % k
        bytes_in = np.bincount(b_in, weights=g.t_size[t_in], minlength=k)
        sent = np.unique(pt[cross])
        bytes_out = np.bincount(prod_block[sent], weights=g.t_size[sent], minlength=k)

    params, peak = _memory_terms(g, a, k)
    over = overflow(params, peak, cluster)
    io_in = bytes_in / B
    io_out = bytes_out / B
    f = io_in + work + over + io_out
    return Evaluation(
        k, io_in, work, over, io_out, f, peak, params, bytes_in, bytes_out, nodes, dev
    )


def _evaluate_on_topology(
    g: Graph, cluster: Cluster, a: np.ndarray, k: int, dev: np.ndarray
) -> Evaluation:
    """:func:`evaluate` on a heterogeneous cluster (the rules of the module docstring)."""
    memory, _, compute = cluster.device_arrays()
    nodes = np.bincount(a, minlength=k)
    work = np.bincount(a, weights=g.work, minlength=k) * (cluster.compute / compute[dev])

    pt = g.pair_tensor
    prod_block = a[g.t_producer]
    cb = a[g.t_cons]
    cross = cb != prod_block[pt]
    bytes_in, bytes_out, io_in, io_out = (np.zeros(k) for _ in range(4))
    if cross.any():
        keys = np.unique(pt[cross] * k + cb[cross])  # (tensor, receiving block), each once
        t_in, b_in = keys // k, keys % k
        bw, lat = cluster.link_arrays(dev[prod_block[t_in]], dev[b_in])
        size = g.t_size[t_in]
        bytes_in = np.bincount(b_in, weights=size, minlength=k)
        io_in = np.bincount(b_in, weights=size / bw, minlength=k)
        # one send per (tensor, link class): consumers behind alike links share it
        classes, cls = np.unique(np.stack([bw, lat], axis=1), axis=0, return_inverse=True)
        sends = np.unique(t_in * len(classes) + cls.reshape(-1))
        t_s, c_s = sends // len(classes), sends % len(classes)
        src = prod_block[t_s]
        bytes_out = np.bincount(src, weights=g.t_size[t_s], minlength=k)
        io_out = np.bincount(src, weights=g.t_size[t_s] / classes[c_s, 0], minlength=k)

    params, peak = _memory_terms(g, a, k)
    over = np.maximum(0.0, params + peak - memory[dev]) / cluster.slow_memory_bandwidth
    f = io_in + work + over + io_out
    return Evaluation(
        k, io_in, work, over, io_out, f, peak, params, bytes_in, bytes_out, nodes, dev
    )


def _memory_terms(g: Graph, a: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block: bytes of the parameters it stores (once per block that uses them) and its
    activation peak (the largest single-op working set)."""
    params = np.zeros(k)
    if g.num_params:
        keys = np.unique(g.pair_param * k + a[g.p_users])
        params = np.bincount(keys % k, weights=g.p_size[keys // k], minlength=k)
    peak = np.zeros(k)
    np.maximum.at(peak, a, g.act)
    return params, peak


def overflow(params: np.ndarray, peak: np.ndarray, cluster: Cluster) -> np.ndarray:
    """overflow(S) of blocks (or node sets) holding ``params`` weight bytes and ``peak``
    activation bytes: the bytes past fast memory, streamed at the slow-memory bandwidth."""
    if math.isinf(cluster.fast_memory):
        return np.zeros_like(params)
    return np.maximum(0.0, params + peak - cluster.fast_memory) / cluster.slow_memory_bandwidth


@dataclass(frozen=True)
class Violation:
    """One reason a plan is invalid, naming the nodes and blocks involved."""

    kind: str  # "order", "colocation", "capacity"
    message: str

    def __str__(self) -> str:
        return self.message


def validate(
    g: Graph,
    cluster: Cluster,
    assignment: np.ndarray,
    k: int | None = None,
    limit: int = 20,
    placement: object = None,
) -> list[Violation]:
    """Every reason (up to ``limit`` per kind) why a plan is invalid; empty when valid.

    Checks: each order edge goes to the same or a later block (acyclic quotient), co-location
    groups share a block, and params + peak <= capacity C when the cluster has one (on a
    heterogeneous cluster: the capacity of the device running the block, see ``placement``).
    """
    k = cluster.devices if k is None else k
    a = check_assignment(g, assignment, k)
    dev = check_placement(cluster, k, placement)
    out: list[Violation] = []
    back = np.flatnonzero(a[g.e_src] > a[g.e_dst])
    for j in back[:limit]:
        u, v = int(g.e_src[j]), int(g.e_dst[j])
        out.append(
            Violation(
                "order",
                f"edge {g.names[u]!r} -> {g.names[v]!r} goes from block {a[u]} back to block "
                f"{a[v]} (blocks must form an acyclic pipeline)",
            )
        )
    if len(back) > limit:
        out.append(Violation("order", f"... and {len(back) - limit} more backward edges"))
    bad_groups = [m for m in g.groups if len(np.unique(a[m])) > 1]
    for m in bad_groups[:limit]:
        where = ", ".join(f"{g.names[v]!r}: block {a[v]}" for v in m[:4])
        more = ", ..." if len(m) > 4 else ""
        out.append(
            Violation("colocation", f"co-location group split across blocks ({where}{more})")
        )
    if not cluster.homogeneous:
        out += _capacity_violations(g, cluster, a, k, dev)
    elif cluster.capacity is not None:
        ev = evaluate(g, cluster, a, k)
        used = ev.params + ev.peak
        for b in np.flatnonzero(used > cluster.capacity * (1 + 1e-12)):
            out.append(
                Violation(
                    "capacity",
                    f"block {b} needs {used[b]:.6g} bytes (params {ev.params[b]:.6g} + peak "
                    f"{ev.peak[b]:.6g}) but the device capacity is {cluster.capacity:.6g} bytes",
                )
            )
    return out


def _capacity_violations(
    g: Graph, cluster: Cluster, a: np.ndarray, k: int, dev: np.ndarray
) -> list[Violation]:
    """params + peak <= C of the device running each block (heterogeneous clusters)."""
    _, capacity, _ = cluster.device_arrays()
    ev = evaluate(g, cluster, a, k, dev)
    used = ev.params + ev.peak
    cap = capacity[dev]
    return [
        Violation(
            "capacity",
            f"block {b} on device {int(dev[b])} needs {used[b]:.6g} bytes (params "
            f"{ev.params[b]:.6g} + peak {ev.peak[b]:.6g}) but that device's capacity is "
            f"{cap[b]:.6g} bytes",
        )
        for b in np.flatnonzero(used > cap * (1 + 1e-12))
    ]


def lower_bound(g: Graph, cluster: Cluster, k: int | None = None) -> float:
    """A bound no plan with k blocks can beat, from averages and from each node's neighbourhood.

    - Sum over blocks of f >= total work + max(0, all params + largest act - k*M) / B_mem
      (overflow is convex and every parameter is stored at least once), so max f >= that / k.
    - The block S holding a node v pays work(v) and v's own overflow, and for every producer p
      of v's inputs either work(p) (p in S) or the io of what v reads from p (p outside); and
      for v's outputs either the work of all their consumers (inside) or the io of sending
      them. Each neighbour's work is credited once, so the sum of these minima is a valid
      bound. It is computed on the coarse view (co-location groups merged), where it is
      stronger and still holds for every valid plan.
    """
    k = cluster.devices if k is None else k
    if not cluster.homogeneous:
        return _lower_bound_on_topology(g, cluster, k)
    Bm = cluster.slow_memory_bandwidth
    M = cluster.fast_memory
    total = float(g.work.sum())
    if not math.isinf(M):
        total += max(0.0, g.param_bytes_total + float(g.act.max()) - k * M) / Bm
    cg, _ = coarse_view(g)
    return max(total / k, float(node_bounds(cg, cluster).max()))


def _lower_bound_on_topology(g: Graph, cluster: Cluster, k: int) -> float:
    """:func:`lower_bound` on a heterogeneous cluster, valid for every placement of the k
    blocks on k distinct devices.

    - With speeds s_d = compute_d / compute, block b costs f_b >= work_b / s_b + over_b, so
      sum_b s_b f_b >= total work + s_min * sum_b over_b, and max f >= that / (sum of the k
      largest speeds); sum_b over_b >= max(0, all params + largest act - sum of the k
      largest memories) / B_mem.
    - The neighbourhood bound of every node on the most favourable device and link: work
      divided by the largest speed, the largest fast memory, the fastest link.
    """
    memory, _, compute = cluster.device_arrays()
    if k > cluster.devices:
        raise MtppError(
            f"{k} blocks but cluster {cluster.name!r} has {cluster.devices} devices with their "
            "own memory, compute or links; use at most that many blocks"
        )
    speed = np.sort(compute / cluster.compute)[::-1]
    top_memory = float(np.sort(memory)[::-1][:k].sum())
    total = float(g.work.sum())
    if not math.isinf(top_memory):
        excess = max(0.0, g.param_bytes_total + float(g.act.max()) - top_memory)
        total += float(speed[-1]) * excess / cluster.slow_memory_bandwidth
    fastest, speedup = cluster.relaxation()
    cg, _ = coarse_view(g)
    per_node = node_bounds(cg, fastest, speedup=speedup)
    return max(total / float(speed[:k].sum()), float(per_node.max()))


def own_param_bytes(g: Graph) -> np.ndarray:
    """Bytes of the parameters each node uses (a shared weight counts for every user)."""
    own = np.zeros(g.n)
    if g.num_params:
        np.add.at(own, g.p_users, g.p_size[g.pair_param])
    return own


def node_bounds(g: Graph, cluster: Cluster, speedup: float = 1.0) -> np.ndarray:
    """For every node v, a lower bound on f of any block containing v (see lower_bound);
    ``speedup`` divides every work (a device that many times faster than the reference)."""
    n = g.n
    B, M, Bm = cluster.link_bandwidth, cluster.fast_memory, cluster.slow_memory_bandwidth
    work = g.work if speedup == 1.0 else g.work / speedup
    lb = work.copy()
    if not math.isinf(M):
        lb += np.maximum(0.0, own_param_bytes(g) + g.act - M) / Bm
    io = g.t_size / B
    pt = g.pair_tensor
    prod = g.t_producer[pt]
    cons = g.t_cons
    # inputs: per (consumer v, producer p): min(work(p), io of the tensors v reads from p)
    if len(pt):
        keys, inv = np.unique(cons * n + prod, return_inverse=True)
        io_sum = np.bincount(inv, weights=io[pt], minlength=len(keys))
        v, p = keys // n, keys % n
        np.add.at(lb, v, np.minimum(work[p], io_sum))
        # outputs: per tensor, min(io, work of its consumers that are not also producers of
        # the same node's inputs); a node with several tensors gets the largest (no consumer
        # is credited twice)
        # consumer c of v's tensor is also a producer of v's inputs when (v, c) is a pair above
        pred_keys = np.unique(keys)
        is_pred = np.isin(prod * n + cons, pred_keys)
        w_out = np.bincount(pt, weights=np.where(is_pred, 0.0, work[cons]), minlength=g.num_tensors)
        per_tensor = np.minimum(io, w_out)
        best = np.zeros(n)
        np.maximum.at(best, g.t_producer, per_tensor)
        lb += best
    return lb
