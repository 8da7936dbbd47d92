"""PopRT auto-sharding (Graphcore PopRT ``tools/auto_sharding.py``; seed 000), as documented.

1. Candidate sharding nodes: nodes with two or more inputs produced by other operators (not
   model inputs, not constants); if none qualifies, every node is a candidate.
2. Each candidate, in topological order, claims its subgraph by walking back toward the inputs
   over unclaimed nodes; a subgraph records its parameter bytes and FLOPs. Candidates whose
   subgraph is below the average bytes OR below the average FLOPs are dropped and their nodes
   left to the next accepted candidate's walk; unclaimed nodes form a final subgraph.
3. First split: walk the subgraph list accumulating bytes and close a group when the running
   sum reaches total / k (memory balance).
4. Traversal: a group that does not fit (the hard capacity, or else the fast memory M) tries
   to move its boundary subgraphs into a neighbouring group that consumes or produces them, or
   into a parallel group (no ancestor relation), preferring the least loaded target. With
   ``optimal_perf`` the group with the most FLOPs then moves subgraphs to groups with fewer
   FLOPs when that narrows the gap, keeping the 3 groupings with the lowest FLOP standard
   deviation per step and the 5 best feasible groupings, until no new grouping appears; the
   best objective wins. Without it, the first feasible grouping is returned.
5. When every grouping is out of memory, the one with the smallest excess is retried with less
   usable memory for activations (PopRT lowers ``available_memory_proportion`` to 0.3, then
   0.1; here: only that share of each op's working set counts against the memory limit).

On a device sequence of a heterogeneous cluster (``devices``: group j runs on devices[j])
the first split gives each group bytes in proportion to its device's capacity (else fast
memory), each group's memory limit is its own device's, FLOPs are balanced per unit of device
speed, and groupings are priced with that placement.

Where the published code deviates from its documentation, the documented intent is followed:
parallel subgraphs are those with no ancestor relation at any depth (the code looks one level
up only, because a set-union result is discarded).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate
from solver.core.graph import Graph


@dataclass
class PoprtOptions:
    optimal_perf: bool = False
    keep_per_step: int = 3  # groupings kept per balancing step (lowest FLOP std deviation)
    keep_best: int = 5  # best feasible groupings kept overall
    memory_proportions: tuple[float, ...] = (1.0, 0.3, 0.1)
    max_groupings: int = 5000
    time_limit: float = 60.0


@dataclass
class Subgraphs:
    """The unit of PopRT's search: node sets in topological order, with their costs."""

    nodes: list[np.ndarray]
    candidate: list[int | None]  # candidate node of each subgraph (None: the remained one)
    bytes: np.ndarray
    flops: np.ndarray
    of_node: np.ndarray  # subgraph index of every node
    parents: list[set[int]] = field(default_factory=list)
    children: list[set[int]] = field(default_factory=list)
    # ancestors and descendants as bitsets (Python ints: bit t set = subgraph t); sets of
    # ints took gigabytes on 100,000-node graphs
    ancestors: list[int] = field(default_factory=list)
    descendants: list[int] = field(default_factory=list)


def candidate_nodes(g: Graph) -> list[int]:
    """Nodes (topological order) with two or more inputs from other operators."""
    inputs = set()
    if g.op_types is not None:
        inputs = {i for i, op in enumerate(g.op_types) if op == "Input"}
    src, dst = g.data_edges
    count = np.zeros(g.n, dtype=np.int64)
    keep = ~np.isin(src, list(inputs)) if inputs else np.ones(len(src), bool)
    np.add.at(count, dst[keep], 1)
    cands = [int(v) for v in g.topo_order if count[v] >= 2]
    return cands or [int(v) for v in g.topo_order]


def _walk(g: Graph, start: int, claimed: np.ndarray, label: int) -> list[int]:
    """Claim ``start`` and every unclaimed node reachable backwards through unclaimed nodes."""
    ptr, idx = g.pred
    out, stack = [], [start]
    if claimed[start] >= 0:
        return out
    claimed[start] = label
    while stack:
        v = stack.pop()
        out.append(v)
        for u in idx[ptr[v] : ptr[v + 1]].tolist():
            if claimed[u] < 0:
                claimed[u] = label
                stack.append(u)
    return out


def _label_costs(g: Graph, labels: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Parameter bytes and FLOPs of the node sets ``labels == j`` for j < L (-1: no set), all
    at once: a weight counts once per set that uses it."""
    keep = labels >= 0
    flops_of = g.flops if g.flops is not None else g.work
    flops = np.bincount(labels[keep], weights=flops_of[keep], minlength=L)
    weight = np.zeros(L)
    if g.num_params:
        lab = labels[g.p_users]
        ok = lab >= 0
        keys = np.unique(lab[ok] * g.num_params + g.pair_param[ok])
        weight = np.bincount(
            keys // g.num_params, weights=g.p_size[keys % g.num_params], minlength=L
        )
    return weight, flops


def build_subgraphs(g: Graph) -> Subgraphs:
    """Candidates, walks, merging of small candidates, the remained subgraph, relations."""
    cands = candidate_nodes(g)
    claimed = np.full(g.n, -1, dtype=np.int64)
    first = [(c, _walk(g, c, claimed, j)) for j, c in enumerate(cands)]
    w1, f1 = _label_costs(g, claimed, len(cands))
    nonempty = np.array([bool(m) for _, m in first], dtype=bool)
    avg_b = float(w1[nonempty].mean()) if nonempty.any() else 0.0
    avg_f = float(f1[nonempty].mean()) if nonempty.any() else 0.0
    # below either average: merged into the next one
    accepted = [c for j, (c, m) in enumerate(first) if m and w1[j] >= avg_b and f1[j] >= avg_f]
    claimed[:] = -1
    nodes, cand = [], []
    for c in accepted:
        m = _walk(g, c, claimed, len(nodes))
        if m:
            nodes.append(np.array(sorted(m), dtype=np.int64))
            cand.append(c)
    rest = np.flatnonzero(claimed < 0)
    if len(rest):
        claimed[rest] = len(nodes)
        nodes.append(rest)
        cand.append(None)
    weight, flops = _label_costs(g, claimed, len(nodes))
    sg = Subgraphs(nodes, cand, weight, flops, claimed)
    S = len(nodes)
    sg.parents = [set() for _ in range(S)]
    sg.children = [set() for _ in range(S)]
    a, b = claimed[g.e_src], claimed[g.e_dst]
    for x, y in set(zip(a.tolist(), b.tolist(), strict=True)):
        if x != y:
            sg.parents[y].add(x)
            sg.children[x].add(y)
    sg.ancestors = [0] * S
    for s in range(S):  # subgraph list order is topological (each walk claims its ancestors)
        for p in sg.parents[s]:
            sg.ancestors[s] |= sg.ancestors[p] | (1 << p)
    sg.descendants = [0] * S
    for s in range(S - 1, -1, -1):
        for c in sg.children[s]:
            sg.descendants[s] |= sg.descendants[c] | (1 << c)
    return sg


def _bitset(mask: np.ndarray) -> int:
    """A bool array as a Python-int bitset (bit i = mask[i])."""
    return int.from_bytes(np.packbits(mask, bitorder="little").tobytes(), "little")


def first_split(
    sg: Subgraphs, k: int, memory: np.ndarray | None = None, speed: np.ndarray | None = None
) -> tuple[int, ...]:
    """Group of every subgraph: close a group when the running bytes reach total / k (with
    per-group ``memory``: their share of the total up to that group; without parameters,
    FLOPs the same way, with per-group ``speed``)."""
    if memory is not None or speed is not None:
        return _proportional_split(sg, k, memory, speed)
    total = float(sg.bytes.sum())
    target = total / k if total > 0 else 0.0
    groups, grp, run = [], 0, 0.0
    for s in range(len(sg.nodes)):
        groups.append(grp)
        run += sg.bytes[s]
        if grp < k - 1 and target > 0 and run >= target * (grp + 1):
            grp += 1
    if total == 0:  # no parameters at all: balance FLOPs instead
        f = np.cumsum(sg.flops)
        groups = [min(k - 1, int(x * k / max(f[-1], 1e-300))) for x in f - sg.flops]
    return tuple(groups)


def _proportional_split(
    sg: Subgraphs, k: int, memory: np.ndarray | None, speed: np.ndarray | None
) -> tuple[int, ...]:
    """:func:`first_split` with group j's share proportional to memory[j] (or speed[j])."""
    weights, share = sg.bytes, memory
    if float(sg.bytes.sum()) == 0:
        weights, share = sg.flops, speed
    share = np.ones(k) if share is None else np.asarray(share, dtype=np.float64)
    total = float(weights.sum())
    ends = total * np.cumsum(share) / share.sum()  # running sum at which group j closes
    groups, grp, run = [], 0, 0.0
    for s in range(len(sg.nodes)):
        groups.append(grp)
        run += float(weights[s])
        while grp < k - 1 and total > 0 and run >= ends[grp] * (1 - 1e-12):
            grp += 1
    return tuple(groups)


class _Search:
    def __init__(
        self,
        g: Graph,
        cluster: Cluster,
        sg: Subgraphs,
        opts: PoprtOptions,
        devices: np.ndarray | None = None,
    ):
        self.g, self.cluster, self.sg, self.opts = g, cluster, sg, opts
        self.k = cluster.devices
        self.limit = cluster.capacity if cluster.capacity is not None else cluster.fast_memory
        self.devices, self.speed, self.share = None, None, None
        if devices is not None and not cluster.homogeneous:
            self.devices = np.asarray(devices, dtype=np.int64)
            self.k = len(self.devices)
            memory, capacity, compute = cluster.device_arrays()
            cap = capacity[self.devices]
            self.limit = np.where(np.isfinite(cap), cap, memory[self.devices])
            self.speed = compute[self.devices] / cluster.compute
            finite = self.limit[np.isfinite(self.limit)]
            if len(finite):
                self.share = np.where(np.isfinite(self.limit), self.limit, finite.max())
        self.t0 = time.perf_counter()

    def objective(self, grouping: tuple[int, ...]) -> float:
        a = self.assignment(grouping)
        return evaluate(self.g, self.cluster, a, self.k, placement=self.devices).objective

    def out_of_time(self) -> bool:
        return time.perf_counter() - self.t0 > self.opts.time_limit

    def assignment(self, grouping: tuple[int, ...]) -> np.ndarray:
        return np.asarray(grouping, dtype=np.int64)[self.sg.of_node]

    def valid(self, grouping: tuple[int, ...]) -> bool:
        a = self.assignment(grouping)
        return bool(np.all(a[self.g.e_src] <= a[self.g.e_dst]))

    def memory(self, grouping, share: float) -> np.ndarray:
        a = self.assignment(grouping)
        ev = evaluate(self.g, self.cluster, a, self.k, placement=self.devices)
        return ev.params + share * ev.peak

    def group_flops(self, grouping) -> np.ndarray:
        """FLOPs of every group (per unit of device speed on a device sequence)."""
        fl = np.bincount(np.asarray(grouping), weights=self.sg.flops, minlength=self.k)
        return fl if self.speed is None else fl / self.speed

    def moves(self, grouping, src: int, load: np.ndarray, balance: bool) -> list[tuple[int, ...]]:
        """One move per boundary subgraph of group ``src``, to its least loaded allowed target."""
        sg = self.sg
        members = [s for s, gr in enumerate(grouping) if gr == src]
        garr = np.asarray(grouping)
        in_group = {gr: _bitset(garr == gr) for gr in range(self.k) if gr != src}
        out = []
        for i, s in enumerate(members):
            if i % 64 == 0 and self.out_of_time():
                break
            targets = set()
            if not any(grouping[c] == src for c in sg.children[s]):  # most downstream
                targets |= {grouping[c] for c in sg.children[s] if grouping[c] > src}
            if not any(grouping[p] == src for p in sg.parents[s]):  # no parent inside
                targets |= {grouping[p] for p in sg.parents[s] if grouping[p] < src}
            related = sg.ancestors[s] | sg.descendants[s]
            # a group holding a parallel subgraph (no ancestor relation either way)
            targets |= {gr for gr, bits in in_group.items() if bits & ~related}
            targets.discard(src)
            if balance:
                gap = load[src] - load
                targets = {t for t in targets if abs(gap[t] - 2 * sg.flops[s]) < gap[t]}
            if not targets:
                continue
            tgt = min(targets, key=lambda t: (load[t], t))
            # the grouping is valid, so only the edges of s can break: check them alone
            if all(grouping[p] <= tgt for p in sg.parents[s]) and all(
                tgt <= grouping[c] for c in sg.children[s]
            ):
                new = list(grouping)
                new[s] = tgt
                out.append(tuple(new))
        return out

    def run(self, share: float) -> tuple[tuple[int, ...] | None, tuple[int, ...], dict]:
        """(best feasible grouping or None, grouping with the smallest excess, stats)."""
        opts = self.opts
        if self.devices is None:
            start = first_split(self.sg, self.k)
        else:
            start = first_split(self.sg, self.k, self.share, self.speed)
        queue, seen = [start], {start}
        feasible: list[tuple[float, tuple[int, ...]]] = []
        least_excess = (math.inf, start)
        explored = 0
        while queue and explored < opts.max_groupings:
            if self.out_of_time():
                break
            grouping = queue.pop(0)
            explored += 1
            mem = self.memory(grouping, share)
            excess = np.maximum(0.0, mem - self.limit)
            children: list[tuple[int, ...]] = []
            if excess.sum() > 0:
                if excess.sum() < least_excess[0]:
                    least_excess = (float(excess.sum()), grouping)
                bytes_load = np.bincount(
                    np.asarray(grouping), weights=self.sg.bytes, minlength=self.k
                )
                for src in np.flatnonzero(excess > 0):
                    children += self.moves(grouping, int(src), bytes_load, balance=False)
            else:
                obj = self.objective(grouping)
                feasible.append((obj, grouping))
                feasible.sort()
                del feasible[opts.keep_best :]
                if not opts.optimal_perf:
                    break
                fl = self.group_flops(grouping)
                children = self.moves(grouping, int(np.argmax(fl)), fl, balance=True)
                children.sort(key=lambda c: float(np.std(self.group_flops(c))))
                children = children[: opts.keep_per_step]
            for c in children:
                if c not in seen:
                    seen.add(c)
                    queue.append(c)
        stats = {"groupings_explored": explored, "activation_share": share}
        return (feasible[0][1] if feasible else None), least_excess[1], stats


def poprt(
    g: Graph, cluster: Cluster, opts: PoprtOptions | None = None, devices: np.ndarray | None = None
):
    """PopRT auto-sharding on graph ``g``: (assignment, info) where info has the sharding
    nodes per device, the memory share that was needed, and search statistics. With
    ``devices`` (a device sequence of a heterogeneous cluster) group j is planned for
    ``devices[j]`` (module docstring)."""
    opts = opts or PoprtOptions()
    t0 = time.perf_counter()
    sg = build_subgraphs(g)
    search = _Search(g, cluster, sg, opts, devices)
    search.t0 = t0  # the time limit covers building the subgraphs too
    grouping, stats = None, {}
    fallback = None
    for share in opts.memory_proportions:
        grouping, least, stats = search.run(share)
        if grouping is not None:
            break
        fallback = least
    if grouping is None:
        grouping = fallback
        stats["out_of_memory"] = True
    a = search.assignment(grouping)
    info = {
        "subgraphs": len(sg.nodes),
        "candidates": sum(c is not None for c in sg.candidate),
        "sharding_nodes": sharding_nodes(g, sg, grouping, search.k),
        **stats,
    }
    return a, info


def sharding_nodes(g: Graph, sg: Subgraphs, grouping, k: int) -> dict[int, list[str]]:
    """Per device but the last: candidate nodes of the group's most-downstream subgraphs."""
    out: dict[int, list[str]] = {}
    for d in range(k - 1):
        names = []
        for s, gr in enumerate(grouping):
            if gr != d or sg.candidate[s] is None:
                continue
            if not any(grouping[c] == d for c in sg.children[s]):
                names.append(g.names[sg.candidate[s]])
        if names:
            out[d] = names
    return out


def format_sharding(nodes: dict[int, list[str]]) -> str:
    """PopRT's message: ``Sharding nodes: Device 0 - ['Add_938']``."""
    parts = [f"Device {d} - {names}" for d, names in sorted(nodes.items())]
    return "Sharding nodes: " + ("; ".join(parts) if parts else "(one device)")
