"""The sharded program and its cost: strategy per operator -> layouts -> redistribution per edge
-> time, bytes and memory per device.

Everything here is a pure function of (model, mesh, cluster, strategies); :class:`Planner` only
caches. An exact optimiser can enumerate ``planner.candidates(i)`` per operator and
``planner.edge_cost(u, su, v, sv)`` per edge, and price memory with ``weight_bytes``.

Cost model (forward inference, one synchronous SPMD program; docs/sharding.md; with a
:class:`~solver.spmd.training.TrainingSpec` the backward, the gradient synchronisation and the
training memory are added as solver/spmd/training.py describes):
- compute of an operator: roofline on its local shard, max(FLOPs / compute, bytes touched /
  memory bandwidth), the same formula as the pipeline work;
- communication: every redistribution's ring-formula time (redistribute.py);
- total = sum over operators of compute + the redistributions of its inputs, plus the reduction
  of any model output left as partial sums. Model inputs and weights lie on every device in the
  layout their consumer wants at no cost; outputs may stay split.
- memory per device: local weight shards (once per distinct layout) + the peak, along the
  topological order, of live local activations, redistributed input copies and outputs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from solver.spmd.mesh import Layout, Mesh, canonical
from solver.spmd.model import ShardModel
from solver.spmd.redistribute import Redistribution, local_bytes, plan_redistribution
from solver.spmd.rules import (
    OpSharding,
    Spec,
    StrategyError,
    candidates,
    op_spec,
    shard,
    strategy_of,
)
from solver.spmd.strategy import Strategy
from solver.spmd.training import (
    InputClass,
    TrainingCosts,
    TrainingSpec,
    WeightClass,
    WeightSync,
    backward_factor,
    gradient_flow,
    gradient_layout,
    group_size,
    without_partial,
)

__all__ = ["EdgeCost", "Planner", "Program", "evaluate"]


@dataclass(frozen=True)
class EdgeCost:
    """An edge's cost for one pair of layout classes: its time (forward redistribution, and in
    training its re-run in the backward and the gradient's redistribution) and the bytes of
    the consumer's redistributed copy (0 when the layouts agree)."""

    time: float
    copy_bytes: float


class Planner:
    """Specs, candidate shardings and redistributions of one model on one mesh (cached)."""

    def __init__(
        self, sm: ShardModel, mesh: Mesh, cluster, training: TrainingSpec | None = None
    ) -> None:
        self.sm, self.mesh, self.cluster = sm, mesh, cluster
        self.training = training
        self.flow = gradient_flow(sm) if training is not None else None
        self._syncs: dict = {}
        self.devices = mesh.devices
        self.specs: list[Spec] = [op_spec(op, sm) for op in sm.ops]
        self._cache: dict = {}
        self._cands: dict[int, list[OpSharding]] = {}
        self._time: dict = {}
        # operators with the same type, attributes and shapes share shardings (repeated layers)
        self.signature = [self._signature(op) for op in sm.ops]
        self.in_edges: list[list[tuple[int, int, int]]] = [[] for _ in sm.ops]
        self.out_edges: list[list[tuple[int, int, int]]] = [[] for _ in sm.ops]
        for v, op in enumerate(sm.ops):
            for k, t in enumerate(op.data_inputs):
                u = sm.producer.get(t)
                if u is not None:
                    pos = sm.ops[u].outputs.index(t)
                    self.in_edges[v].append((u, pos, k))
                    self.out_edges[u].append((v, pos, k))

    def share_caches(self, source: Planner) -> None:
        """Use ``source``'s shardings, candidates and compute times: they are keyed by
        operator signature and strategy, so they are equal for any model on the same mesh and
        cluster (a segment of a model, the same model priced for inference or training)."""
        self._cache, self._cands, self._time = source._cache, source._cands, source._time

    @property
    def replicated_ops(self) -> list[str]:
        """Operator types with no sharding rule (they run replicated)."""
        return sorted(
            {
                op.op_type
                for op, s in zip(self.sm.ops, self.specs, strict=True)
                if s.kind == "replicated"
            }
        )

    def _signature(self, op) -> tuple:
        sm = self.sm
        shapes = tuple(
            (sm.shapes.get(t), str(sm.dtypes.get(t)), t in sm.consts and k not in op.data)
            for k, t in enumerate(op.node.input)
        )
        consts = tuple(
            np.asarray(sm.consts[t]).tobytes() if k not in op.data and t in sm.consts else b""
            for k, t in enumerate(op.node.input)
        )
        outs = tuple(sm.shapes.get(t) for t in op.outputs)
        attrs = tuple(a.SerializeToString() for a in op.node.attribute)
        return (op.op_type, op.node.domain, tuple(op.data), shapes, consts, outs, attrs)

    def sharding(self, i: int, strategy: Strategy) -> OpSharding:
        key = (self.signature[i], strategy)
        sh = self._cache.get(key)
        if sh is None:
            sh = self._cache[key] = shard(
                self.sm.ops[i], self.sm, self.specs[i], strategy, self.devices
            )
        return sh

    def candidates(self, i: int) -> list[OpSharding]:
        """Every valid sharding of operator ``i`` on this mesh (replicated first)."""
        i = self.signature[i]
        if i not in self._cands:
            out = []
            first = next(j for j, s in enumerate(self.signature) if s == i)
            spec = self.specs[first]
            for splits in candidates(spec, self.devices):
                try:
                    out.append(self.sharding(first, strategy_of(spec, splits)))
                except StrategyError:
                    continue
            self._cands[i] = out
        return self._cands[i]

    def redistribution(self, src: Layout, dst: Layout, tensor: str) -> Redistribution:
        return plan_redistribution(src, dst, self.sm.itemsize(tensor), self.mesh)

    def edge_cost(self, u: int, su: OpSharding, v: int, sv: OpSharding) -> Redistribution:
        """The redistribution on the edge u -> v when u runs ``su`` and v runs ``sv``."""
        for w, pos, k in self.out_edges[u]:
            if w == v:
                t = self.sm.ops[u].outputs[pos]
                return self.redistribution(su.out_layouts[pos], sv.in_layouts[k], t)
        raise ValueError(f"no edge {u} -> {v}")

    def compute_time(self, i: int, sh: OpSharding) -> float:
        key = (self.signature[i], sh.strategy)
        if key not in self._time:
            self._time[key] = self._compute_time(i, sh)
        return self._time[key]

    def _compute_time(self, i: int, sh: OpSharding) -> float:
        op = self.sm.ops[i]
        moved = sum(
            local_bytes(lay, self.sm.itemsize(t))
            for t, lay in zip(
                [*op.data_inputs, *op.outputs], [*sh.in_layouts, *sh.out_layouts], strict=True
            )
        )
        return max(sh.local_flops / self.cluster.compute, moved / self.cluster.memory_bandwidth)

    def weight_bytes(self, i: int, sh: OpSharding) -> float:
        """Bytes of the weight shards operator ``i`` keeps on each device under ``sh`` (in
        training with their gradients and optimizer state)."""
        op = self.sm.ops[i]
        return sum(
            self.weight_class_bytes(self.weight_class(i, k, sh), t)
            for k, t in enumerate(op.data_inputs)
            if t in self.sm.consts
        )

    def output_bytes(self, i: int, sh: OpSharding) -> float:
        """Bytes of operator ``i``'s local outputs on each device under ``sh``."""
        op = self.sm.ops[i]
        return sum(
            local_bytes(lay, self.sm.itemsize(t))
            for t, lay in zip(op.outputs, sh.out_layouts, strict=True)
        )

    # ------------------------------------------------------------------ the terms optimisers read
    def unary_time(self, i: int, sh: OpSharding) -> float:
        """Operator ``i``'s own time under ``sh``: its compute, and in training its backward
        compute and the gradient synchronisation of its weights."""
        t = self.compute_time(i, sh)
        if self.training is None:
            return t
        return (
            t
            + self.backward_compute(i, sh)
            + sum(s.time for s in self.weight_syncs(i, sh).values())
        )

    def backward_compute(self, i: int, sh: OpSharding) -> float:
        if not self.flow.has_backward[i]:
            return 0.0
        return backward_factor(self.sm.ops[i], self.flow.needs_grad) * self.compute_time(i, sh)

    def weight_syncs(self, i: int, sh: OpSharding) -> dict[int, WeightSync]:
        """Data input k -> the gradient synchronisation of that trainable weight under ``sh``
        (only weights whose gradient holds partial sums; its time scaled by the training
        spec's ``sync_weight``)."""
        key = (i, sh.strategy)
        if key not in self._syncs:
            out = {}
            for k, t in enumerate(self.sm.ops[i].data_inputs):
                if t not in self.flow.trainable:
                    continue
                grad = gradient_layout(sh, k)
                if grad.partial:
                    r = self.redistribution(grad, without_partial(grad), t)
                    time = r.time * self.training.sync_weight
                    out[k] = WeightSync(t, group_size(grad), time, r.bytes_per_device)
            self._syncs[key] = out
        return self._syncs[key]

    def choice_key(self, i: int, sh: OpSharding) -> tuple:
        """Two shardings of operator ``i`` with equal keys cost and place alike (one choice)."""
        key = tuple(canonical(x) for x in sh.in_layouts) + tuple(
            canonical(x) for x in sh.out_layouts
        )
        if self.training is None:
            return key
        grads = tuple(canonical(gradient_layout(sh, k)) for k in range(len(sh.in_layouts)))
        return key + grads

    def out_class(self, u: int, pos: int, sh: OpSharding):
        """The producer's end of an edge, as its cost depends on it."""
        return canonical(sh.out_layouts[pos])

    def in_class(self, v: int, k: int, sh: OpSharding):
        """The consumer's end of an edge, as its cost depends on it (a layout; in training an
        :class:`InputClass`)."""
        lay = canonical(sh.in_layouts[k])
        if self.training is None:
            return lay
        t = self.sm.ops[v].data_inputs[k]
        backward = self.flow.has_backward[v]
        grad = canonical(gradient_layout(sh, k)) if backward and t in self.flow.needs_grad else None
        return InputClass(lay, grad, backward)

    def class_edge_cost(self, a, b, tensor: str) -> EdgeCost:
        """The cost of an edge whose producer's end is class ``a`` and consumer's ``b``."""
        lay = b if self.training is None else b.layout
        fwd = self.redistribution(a, lay, tensor)
        copy = local_bytes(lay, self.sm.itemsize(tensor)) if fwd.steps else 0.0
        if self.training is None:
            return EdgeCost(fwd.time, copy)
        return EdgeCost(fwd.time + self.backward_edge_time(a, b, tensor, fwd), copy)

    def backward_edge_time(self, a, b: InputClass, tensor: str, fwd: Redistribution) -> float:
        """The backward's part of an edge: the input's redistribution run again when the
        consumer has a backward, and the gradient's way back to the producer's layout."""
        time = fwd.time if b.backward else 0.0
        if b.gradient is not None:
            time += self.redistribution(b.gradient, without_partial(a), tensor).time
        return time

    def weight_class(self, v: int, k: int, sh: OpSharding):
        """A weight's copy as memory counts it (a layout; in training a :class:`WeightClass`)."""
        lay = canonical(sh.in_layouts[k])
        if self.training is None:
            return lay
        sync = self.weight_syncs(v, sh).get(k)
        return WeightClass(lay, sync.group if sync is not None else 1)

    def weight_class_bytes(self, cls, tensor: str) -> float:
        """Bytes per device of one weight copy (in training with its gradient and optimizer
        state, ZeRO-1 sharding that state over the gradient's synchronisation group)."""
        if self.training is None:
            return local_bytes(cls, self.sm.itemsize(tensor))
        nbytes = local_bytes(cls.layout, self.sm.itemsize(tensor))
        if tensor not in self.flow.trainable:
            return nbytes
        return nbytes * self.training.state_factor(cls.group)

    def output_reduction(self, lay: Layout, tensor: str) -> Redistribution | None:
        """A model output left as partial sums: the cheapest all-reduce or reduce-scatter."""
        if not lay.partial:
            return None
        options = [Layout(lay.shape, lay.device_matrix, lay.dims)]
        for d in range(len(lay.dims)):
            dims = list(lay.dims)
            dims[d] = dims[d] + lay.partial
            try:
                options.append(Layout(lay.shape, lay.device_matrix, tuple(dims)))
            except ValueError:
                continue
        plans = [self.redistribution(lay, o, tensor) for o in options]
        return min(plans, key=lambda r: (self.output_time(r, lay, tensor), r.bytes_per_device))

    def output_time(self, r: Redistribution | None, lay: Layout, tensor: str) -> float:
        """The time of a model output's reduction ``r`` from ``lay`` (None: none), in training
        with its transpose: the output's gradient, in the reduced layout, back to ``lay``'s
        placement (an AllGather after a ReduceScatter, nothing after an AllReduce)."""
        if r is None:
            return 0.0
        if self.training is None:
            return r.time
        return r.time + self.redistribution(r.dst, without_partial(lay), tensor).time


@dataclass
class Program:
    """A sharded program with its costs; ``redists[(v, k)]`` feeds data input k of op v;
    ``training``: the backward's terms (None for inference)."""

    mesh: Mesh
    names: list[str]
    shardings: list[OpSharding]
    redists: dict[tuple[int, int], Redistribution]
    output_redists: dict[str, Redistribution]
    compute: list[float]
    comm: list[float]
    layouts: dict[str, Layout]
    weight_memory: float
    peak_activation_memory: float
    output_layouts: dict[str, Layout] = field(default_factory=dict)
    training: TrainingCosts | None = None

    @property
    def objective(self) -> float:
        total = sum(self.compute) + sum(self.comm) + self.output_comm
        return total + (self.training.total if self.training is not None else 0.0)

    @property
    def output_comm(self) -> float:
        return sum(r.time for r in self.output_redists.values())

    @property
    def memory_per_device(self) -> float:
        return self.weight_memory + self.peak_activation_memory

    def time_per_op(self) -> np.ndarray:
        """Each operator's time: compute and input communication, in training its backward
        compute and communication and its weights' gradient synchronisation."""
        t = np.add(self.compute, self.comm)
        if self.training is not None:
            tr = self.training
            t = t + np.add(np.add(tr.backward_compute, tr.backward_comm), tr.sync_time)
        return t

    def all_redists(self) -> list[tuple[str, Redistribution]]:
        """(consumer op or 'output', redistribution) for every non-empty redistribution."""
        out = []
        for (v, _k), r in sorted(self.redists.items()):
            if r.steps:
                out.append((self.names[v], r))
        out += [("output", r) for r in self.output_redists.values() if r.steps]
        return out

    @property
    def comm_bytes_per_device(self) -> float:
        return sum(r.bytes_per_device for _, r in self.all_redists())

    def collectives(self) -> dict[str, int]:
        c = Counter(k for _, r in self.all_redists() for k in r.collectives)
        return dict(sorted(c.items()))


def evaluate(planner: Planner, strategies: dict[str, Strategy]) -> Program:
    """Cost every operator, edge and output of the program given a strategy per operator
    (in training with the backward and the gradient synchronisation, docs/training.md)."""
    sm = planner.sm
    shs = [planner.sharding(i, strategies[op.name]) for i, op in enumerate(sm.ops)]
    redists: dict[tuple[int, int], Redistribution] = {}
    compute, comm = [], []
    layouts: dict[str, Layout] = {}
    for v, op in enumerate(sm.ops):
        sh = shs[v]
        c = 0.0
        for k, t in enumerate(op.data_inputs):
            u = sm.producer.get(t)
            if u is None:
                layouts.setdefault(t, sh.in_layouts[k])
                continue
            src = shs[u].out_layouts[sm.ops[u].outputs.index(t)]
            r = planner.redistribution(src, sh.in_layouts[k], t)
            redists[(v, k)] = r
            c += r.time
        for t, lay in zip(op.outputs, sh.out_layouts, strict=True):
            layouts[t] = lay
        compute.append(planner.compute_time(v, sh))
        comm.append(c)
    outputs = {}
    out_layouts = {}
    for t in sm.outputs:
        if t not in layouts:
            continue
        r = planner.output_reduction(layouts[t], t)
        if r is not None:
            outputs[t] = r
        out_layouts[t] = r.dst if r is not None else layouts[t]
    weights, peak = _memory(planner, shs, redists)
    training = None
    if planner.training is not None:
        training = _training_costs(planner, shs, redists)
        training.output_backward = sum(
            planner.output_time(r, layouts[t], t) - r.time for t, r in outputs.items()
        )
    return Program(
        planner.mesh,
        [op.name for op in sm.ops],
        shs,
        redists,
        outputs,
        compute,
        comm,
        layouts,
        weights,
        peak,
        out_layouts,
        training,
    )


def _training_costs(planner: Planner, shs: list[OpSharding], redists) -> TrainingCosts:
    """Per operator: backward compute, backward communication over its input edges (as
    :meth:`Planner.class_edge_cost` prices it), the gradient synchronisation of its weights."""
    sm = planner.sm
    backward, bcomm, sync_time, syncs = [], [], [], {}
    for v, op in enumerate(sm.ops):
        sh = shs[v]
        backward.append(planner.backward_compute(v, sh))
        c = 0.0
        for u, pos, k in planner.in_edges[v]:
            a = planner.out_class(u, pos, shs[u])
            b = planner.in_class(v, k, sh)
            c += planner.backward_edge_time(a, b, op.data_inputs[k], redists[(v, k)])
        bcomm.append(c)
        own = planner.weight_syncs(v, sh)
        sync_time.append(sum(s.time for s in own.values()))
        syncs.update({(v, k): s for k, s in own.items()})
    zero1 = frozenset(s.tensor for s in syncs.values()) if planner.training.sharded_share else ()
    return TrainingCosts(backward, bcomm, sync_time, syncs, frozenset(zero1))


def _memory(planner: Planner, shs: list[OpSharding], redists) -> tuple[float, float]:
    sm = planner.sm
    seen: set = set()
    weights = 0.0
    for v, op in enumerate(sm.ops):
        for k, t in enumerate(op.data_inputs):
            if t not in sm.consts:
                continue
            key = (t, planner.weight_class(v, k, shs[v]))
            if key not in seen:
                seen.add(key)
                weights += planner.weight_class_bytes(key[1], t)
    last = last_uses(planner)
    live: dict[str, float] = {}
    peak = 0.0
    for v, op in enumerate(sm.ops):
        sh = shs[v]
        extra = 0.0
        for k, t in enumerate(op.data_inputs):
            if t in sm.consts:
                continue
            r = redists.get((v, k))
            if r is None or r.steps:  # a model input's copy, or a redistributed copy
                extra += local_bytes(sh.in_layouts[k], sm.itemsize(t))
        for t, lay in zip(op.outputs, sh.out_layouts, strict=True):
            live[t] = local_bytes(lay, sm.itemsize(t))
        peak = max(peak, sum(live.values()) + extra)
        for t in [t for t in live if last.get(t, -1) <= v]:
            del live[t]
    return weights, peak


def last_uses(planner: Planner) -> dict[str, int]:
    """The step after which each tensor is freed: its last reader (the model's outputs and, in
    training, every operator output live to the end: the backward reads them)."""
    sm = planner.sm
    n = len(sm.ops)
    last: dict[str, int] = {}
    for v, op in enumerate(sm.ops):
        for t in op.data_inputs:
            last[t] = v
    for t in sm.outputs:
        last[t] = n
    if planner.training is not None:
        for op in sm.ops:
            for t in op.outputs:
                last[t] = n
    return last
