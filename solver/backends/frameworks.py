"""A layer-granular plan in the form each PyTorch framework takes, with a README showing the call.

``mtpp export MODEL PLAN --format F --out DIR`` writes, for the stages of a plan that cuts only
between modules (:mod:`solver.pipeline.granularity`):

- ``torch``: ``torch_pipeline.json``, ``split_spec`` (module path -> ``"BEGINNING"``, the
  ``SplitPoint`` name: each stage after the first begins at its first module) and ``stages``
  (the module paths of each stage), paths relative to the module the user exported;
- ``torchtitan``: ``torchtitan_pipeline.json``, ``module_fqns_per_model_part``;
- ``megatron``: ``megatron_layout.txt``, whose last line is the
  ``--pipeline-model-parallel-layout`` string (``E`` embedding, ``t`` block, ``L`` head, ``|``
  between stages); ``--decoder-first/last-pipeline-num-layers`` where the middle stages are
  uniform; the modules around the blocks that the plan puts on another stage than Megatron
  (and vLLM) keep them are listed;
- ``deepspeed``: ``deepspeed_partition.json``, ``parts`` (the layer boundaries
  ``PipelineModule`` keeps in ``self.parts``) over ``layers`` (the modules in program order);
- ``vllm``: ``vllm_pp_layer_partition.txt``, the ``VLLM_PP_LAYER_PARTITION`` value.

Empty blocks of the plan are no stages. The folder is written whole (:mod:`solver.core.outdir`).

An operator-sharding plan of ``mtpp shard`` goes out with ``--format dtensor``:
``dtensor_plan.json``, the ``parallelize_plan`` of ``torch.distributed.tensor.parallel``
(module path -> ``ColwiseParallel`` / ``RowwiseParallel`` / ``SequenceParallel``) for the
modules whose strategies are one of those styles (:func:`dtensor_plan`), the modules whose
weights every rank holds whole (``replicate``), the sharded modules no style expresses
(``not_mapped``, with the reason) and the sharded modules without parameters, which in torch run
on whatever their inputs are (``follows``). A joint plan goes out as its (data, tensor,
pipeline) layout with both forms: the ``split_spec`` of its stages and each stage's
``parallelize_plan`` (:func:`joint_files`).
"""

from __future__ import annotations

import ast
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solver.core.errors import MtppError
from solver.core.files import check_output_dir
from solver.core.graph import Graph
from solver.core.outdir import replace_dir, temp_dir_beside
from solver.frontends.onnx.common import SHAPE_INPUTS
from solver.frontends.onnx.load import load_proto
from solver.frontends.onnx.modules import (
    NAME_SCOPES_KEY,
    ModuleLayout,
    onnx_node_modules,
    read_layout,
)

FORMATS = ("torch", "torchtitan", "megatron", "deepspeed", "vllm")  # of a pipeline plan
DTENSOR = "dtensor"  # of an operator-sharding plan (and, with the above, of a joint plan)
SHARD_PLAN_FORMAT = "mtpp-shard-plan"  # plan.json of mtpp shard (solver.spmd.report)
CLASS_KEY = "pkg.torch.onnx.class_hierarchy"  # the dynamo exporter's module classes per scope
LINEAR, EMBEDDING = "torch.nn.modules.linear.Linear", "torch.nn.modules.sparse.Embedding"
NORM_SUFFIXES = ("LayerNorm", "RMSNorm")
README = "README.md"


@dataclass(frozen=True)
class ModuleStages:
    """The units of each non-empty block of a plan, in pipeline order."""

    stages: tuple[tuple[str, ...], ...]
    layout: ModuleLayout

    @property
    def block_counts(self) -> list[int]:
        """Number of repeated blocks (decoder layers) per stage."""
        blocks = set(self.layout.blocks)
        return [sum(u in blocks for u in stage) for stage in self.stages]

    @property
    def split_spec(self) -> dict[str, str]:
        """Each stage after the first begins at its first module."""
        return {stage[0]: "BEGINNING" for stage in self.stages[1:]}


@dataclass(frozen=True)
class FrameworkFiles:
    """What :func:`write_framework` wrote: the format, the folder and the file names."""

    format: str
    out_dir: Path
    files: tuple[str, ...]


def module_stages(layout: ModuleLayout, assignment: np.ndarray, where: str) -> ModuleStages:
    """The stages of ``assignment`` (the block of every cost-graph node) as runs of units;
    refuses, naming ``where``, a plan that cuts inside a unit or runs units out of program
    order."""
    unit_blocks: list[set[int]] = [set() for _ in layout.units]
    for node, unit in enumerate(layout.node_unit):
        unit_blocks[unit].add(int(assignment[node]))
    for unit, blocks in zip(layout.units, unit_blocks, strict=True):
        if len(blocks) > 1:
            shown = " and ".join(str(b) for b in sorted(blocks)[:2])
            raise MtppError(
                f"{where}: the plan cuts inside module {unit} (blocks {shown}); solve with "
                "--granularity layer for a plan a framework can run"
            )
    block_of = [min(b) for b in unit_blocks]
    for i in range(1, len(block_of)):
        if block_of[i] < block_of[i - 1]:
            raise MtppError(
                f"{where}: the plan runs module {layout.units[i]} (block {block_of[i]}) before "
                f"{layout.units[i - 1]} (block {block_of[i - 1]}), against program order; a "
                "split point cannot express it"
            )
    stages: list[list[str]] = []
    for i, unit in enumerate(layout.units):
        if i == 0 or block_of[i] != block_of[i - 1]:
            stages.append([])
        stages[-1].append(unit)
    return ModuleStages(tuple(tuple(s) for s in stages), layout)


# ---------------------------------------------------------------------- the formats
def torch_files(st: ModuleStages) -> dict[str, str]:
    spec = {"split_spec": st.split_spec, "stages": [list(s) for s in st.stages]}
    readme = f"""# torch.distributed.pipelining: {len(st.stages)} stages

```python
import json
from torch.distributed.pipelining import SplitPoint, pipeline

plan = json.load(open("torch_pipeline.json"))
split_spec = {{path: SplitPoint[point] for path, point in plan["split_spec"].items()}}
pipe = pipeline(model, mb_args=(example_microbatch,), split_spec=split_spec)
assert pipe.num_stages == {len(st.stages)}
stage = pipe.build_stage(rank, device)  # then ScheduleGPipe(stage, n_microbatches)
```

`model` is the module you exported to ONNX (module paths are relative to it).
"""
    return {"torch_pipeline.json": _json(spec), README: readme}


def torchtitan_files(st: ModuleStages) -> dict[str, str]:
    fqns = [list(s) for s in st.stages]
    toml = json.dumps(fqns)
    readme = f"""# torchtitan: {len(st.stages)} pipeline stages

In the job's TOML file:

```toml
[parallelism]
pipeline_parallel_degree = {len(st.stages)}
module_fqns_per_model_part = {toml}
```

or `--parallelism.module_fqns_per_model_part` with the JSON of `torchtitan_pipeline.json`.
"""
    return {"torchtitan_pipeline.json": _json({"module_fqns_per_model_part": fqns}), README: readme}


def megatron_layout(st: ModuleStages, where: str) -> str:
    """The ``--pipeline-model-parallel-layout`` string: ``E`` in the first stage, the blocks
    as ``t``, ``L`` in the last stage (the modules around the blocks that the plan puts
    elsewhere are listed by :func:`placed_by_framework`)."""
    if not st.layout.blocks:
        raise MtppError(
            f"{where}: the model has no repeated blocks (a module list of layers), and "
            "Megatron's layout counts decoder layers; use --format torch"
        )
    parts = []
    for i, count in enumerate(st.block_counts):
        text = "t" if count == 1 else (f"t*{count}" if count else "")
        parts.append(("E" if i == 0 else "") + text + ("L" if i == len(st.stages) - 1 else ""))
    return "|".join(parts)


def placed_by_framework(st: ModuleStages) -> list[str]:
    """The modules before the blocks that the plan runs after the first stage, and those
    after the blocks that it runs before the last: layer-count formats (Megatron, vLLM) keep
    the embedding on the first stage and the head on the last, so these move."""
    last = len(st.stages) - 1
    before, after = set(st.layout.before_blocks), set(st.layout.after_blocks)
    return [
        f"{unit} (the plan: stage {i})"
        for i, stage in enumerate(st.stages)
        for unit in stage
        if (unit in before and i > 0) or (unit in after and i < last)
    ]


def _moved_note(st: ModuleStages, where: str) -> str:
    moved = placed_by_framework(st)
    if not moved:
        return ""
    return f"{where} places these where it keeps them, unlike the plan: {', '.join(moved)}"


def megatron_files(st: ModuleStages, where: str) -> dict[str, str]:
    layout = megatron_layout(st, where)
    counts = st.block_counts
    lines = [
        f"# {len(st.stages)} pipeline stages, {sum(counts)} decoder layers {counts}",
        f"# --pipeline-model-parallel-size {len(st.stages)}",
    ]
    middle = counts[1:-1]
    # the first/last-stage flags take at least one layer each
    if len(counts) >= 2 and len(set(middle)) <= 1 and min(counts[0], counts[-1]) >= 1:
        lines.append(
            f"# the same split: --decoder-first-pipeline-num-layers {counts[0]} "
            f"--decoder-last-pipeline-num-layers {counts[-1]}"
        )
    note = _moved_note(st, "Megatron")
    lines += [f"# {note}"] if note else []
    lines.append(layout)
    readme = f"""# Megatron-LM: {len(st.stages)} pipeline stages

```
--pipeline-model-parallel-size {len(st.stages)} --pipeline-model-parallel-layout "{layout}"
```

(`tail -1 megatron_layout.txt` is the layout string.) {note}
"""
    return {"megatron_layout.txt": "\n".join(lines) + "\n", README: readme}


def deepspeed_files(st: ModuleStages) -> dict[str, str]:
    layers = [u for s in st.stages for u in s]
    parts = [0]
    for s in st.stages:
        parts.append(parts[-1] + len(s))
    readme = f"""# DeepSpeed PipelineModule: {len(st.stages)} stages

`layers` lists the modules in the order of your `PipelineModule` layer list; `parts` are the
stage boundaries (stage i runs layers `parts[i]:parts[i+1]`). DeepSpeed has no argument for an
explicit partition, so set it where `PipelineModule` computes `self.parts`:

```python
import json
from deepspeed.pipe import PipelineModule

PARTS = json.load(open("deepspeed_partition.json"))["parts"]

class PlannedPipelineModule(PipelineModule):
    def _partition_layers(self, method="uniform"):
        self.parts = PARTS
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

model = PlannedPipelineModule(layers=layer_specs, num_stages={len(st.stages)})
```
"""
    return {"deepspeed_partition.json": _json({"layers": layers, "parts": parts}), README: readme}


def vllm_files(st: ModuleStages, where: str) -> dict[str, str]:
    if not st.layout.blocks:
        raise MtppError(
            f"{where}: the model has no repeated blocks (a module list of layers), and "
            "VLLM_PP_LAYER_PARTITION counts decoder layers; use --format torch"
        )
    value = ",".join(str(c) for c in st.block_counts)
    readme = f"""# vLLM: {len(st.stages)} pipeline stages

```
VLLM_PP_LAYER_PARTITION={value} vllm serve MODEL --pipeline-parallel-size {len(st.stages)}
```

vLLM places the embedding on the first stage and the head on the last.
{_moved_note(st, "vLLM")}
"""
    return {"vllm_pp_layer_partition.txt": value + "\n", README: readme}


# ---------------------------------------------------------------------- DTensor
@dataclass(frozen=True)
class ShardedOp:
    """An operator of a sharding plan as the DTensor mapping reads it: its module (path and
    class, from the dynamo exporter's metadata), its data inputs in the strategy's order and
    which of them are weights (initializers)."""

    name: str
    op_type: str
    module: str | None
    module_class: str | None
    inputs: tuple[str, ...]
    weights: tuple[bool, ...]
    strategy: tuple[tuple[int, ...], ...]
    output: str
    trans_b: bool  # Gemm with transB = 1: the weight is [out, in]

    def sharded(self, data: int = 1) -> bool:
        """Split otherwise than by data parallelism (activations split ``data`` ways on
        their first dim, weights whole)."""
        for split, weight in zip(self.strategy, self.weights, strict=False):
            if not split:
                continue
            if weight or split[0] not in (1, data):
                if any(n > 1 for n in split):
                    return True
            elif any(n > 1 for n in split[1:]):
                return True
        return False


@dataclass(frozen=True)
class ModuleNote:
    """A module of the plan and why it is listed (not mapped, or following its inputs)."""

    module: str
    reason: str


@dataclass(frozen=True)
class ModuleStyle:
    """The style of one module and the layouts it needs other than the style's defaults."""

    style: str
    input_layout: str | None = None
    output_layout: str | None = None


@dataclass(frozen=True)
class DTensorPlan:
    """A sharding plan in DTensor's terms (``parallelize_module`` on a 1-D mesh of all ranks)."""

    mesh: tuple[int, ...]
    parallelize_plan: dict[str, str]
    input_layouts: dict[str, str]
    output_layouts: dict[str, str]
    replicate: tuple[str, ...]
    not_mapped: tuple[ModuleNote, ...]
    follows: tuple[ModuleNote, ...]

    @property
    def ranks(self) -> int:
        return int(np.prod(self.mesh))

    def to_dict(self) -> dict:
        return {
            "mesh": list(self.mesh),
            "ranks": self.ranks,
            "parallelize_plan": dict(self.parallelize_plan),
            "input_layouts": dict(self.input_layouts),
            "output_layouts": dict(self.output_layouts),
            "replicate": list(self.replicate),
            "not_mapped": [{"module": n.module, "reason": n.reason} for n in self.not_mapped],
            "follows": [{"module": n.module, "reason": n.reason} for n in self.follows],
        }


@dataclass(frozen=True)
class TensorPlacement:
    """How a tensor arrives, in the plan's layouts: the dims split over every device."""

    whole: bool  # not split, not partial
    split_dims: tuple[int, ...]  # dims split over all the devices (a 1-D layout)


def _module_class(props: dict) -> str | None:
    """The class of the innermost module the dynamo exporter recorded (None: unknown)."""
    try:
        classes = ast.literal_eval(props.get(CLASS_KEY, ""))
    except (ValueError, SyntaxError):
        return None
    ok = isinstance(classes, list) and len(classes) >= 2
    return classes[-2] if ok and isinstance(classes[-2], str) else None


def sharded_ops(model, strategies: dict, where: str) -> list[ShardedOp]:
    """The operators of ``model`` (an ONNX ModelProto) with a strategy in ``strategies``
    (node name -> one split list per data input), in program order."""
    inits = {t.name for t in model.graph.initializer}
    modules = onnx_node_modules(model)
    ops = []
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"  # as solver.spmd.model names operators
        if name not in strategies:
            continue
        skip = SHAPE_INPUTS.get(node.op_type, set())
        data = [t for k, t in enumerate(node.input) if t and k not in skip]
        props = {p.key: p.value for p in node.metadata_props}
        trans_b = any(a.name == "transB" and a.i == 1 for a in node.attribute)
        strategy = tuple(tuple(int(n) for n in split) for split in strategies[name])
        ops.append(
            ShardedOp(
                name=name,
                op_type=node.op_type,
                module=modules.get(name) if NAME_SCOPES_KEY in props else None,
                module_class=_module_class(props),
                inputs=tuple(data),
                weights=tuple(t in inits for t in data),
                strategy=strategy,
                output=node.output[0] if node.output else "",
                trans_b=trans_b,
            )
        )
    if not ops:
        raise MtppError(f"{where}: no operator of the plan is a node of the model")
    return ops


def placement_of(layout: dict | None, devices: int) -> TensorPlacement | None:
    """How a tensor with this layout (``layouts`` of a plan.json) lies; None: unknown."""
    if not isinstance(layout, dict):
        return None
    dm, tm = layout.get("device_matrix", []), layout.get("tensor_map", [])
    splits = [dm[len(dm) - 1 - t] if t >= 0 else 1 for t in tm]
    whole = all(n == 1 for n in splits) and not layout.get("partial")
    return TensorPlacement(whole, tuple(d for d, n in enumerate(splits) if n == devices > 1))


def _arrival(p: TensorPlacement | None, rank: int) -> str:
    """``whole``, ``last`` (its last dim split), ``seq`` (dim 1 split), ``other``, or
    ``unknown`` (no layout: the style's default is assumed)."""
    if p is None:
        return "unknown"
    if p.whole:
        return "whole"
    if p.split_dims == (rank - 1,):
        return "last"
    return "seq" if p.split_dims == (1,) else "other"


@dataclass(frozen=True)
class _Layouts:
    """What the mapping reads of a plan besides the strategies."""

    devices: int  # the tensor-parallel degree: the styles shard over this many ranks
    layouts: dict
    graph_outputs: frozenset
    gathered: dict  # tensor -> arrival of the layout a consumer redistributes it to
    data: int = 1  # the data-parallel degree: a batch split by this much is data parallel


def _plan_layouts(data: dict, devices: int, graph_outputs) -> _Layouts:
    gathered = {}
    for r in data.get("redistributions") or []:
        if isinstance(r, dict) and r.get("tensor"):
            to = r.get("to") or {}
            rank = len(to.get("shape", [])) or 1
            gathered[r["tensor"]] = _arrival(placement_of(to, devices), rank)
    return _Layouts(devices, dict(data.get("layouts") or {}), frozenset(graph_outputs), gathered)


def _output_layout(out: str, lay: _Layouts, default: str) -> str | None:
    """The layout a module's output must leave in (None: the style's default)."""
    if out in lay.graph_outputs:
        return None if default == "Replicate" else "Replicate"
    wanted = lay.gathered.get(out)
    if wanted == "seq":
        return "Shard(1)"
    if wanted == "whole" and default != "Replicate":
        return "Replicate"
    return None


def _linear_style(ops: list[ShardedOp], lay: _Layouts) -> ModuleStyle | str:
    """Colwise or rowwise for the matrix product of an nn.Linear, or why not."""
    mm = [o for o in ops if o.op_type in ("MatMul", "Gemm") and len(o.weights) > 1 and o.weights[1]]
    if len(mm) != 1:
        return "no single matrix product with a weight in its operators"
    op, k = mm[0], lay.devices
    x, w = op.strategy[0], op.strategy[1]
    w_in, w_out = (w[1], w[0]) if op.trans_b else (w[0], w[1])
    if int(np.prod(x[:-1])) not in (1, lay.data) or any(n > 1 for n in x[1:-1]):
        return f"its input is split {list(x)} (batch or sequence): no module style shards that"
    rank = len(x)
    arrives = _arrival(placement_of(lay.layouts.get(op.inputs[0]), k), rank)
    out = ops[-1].output
    if (w_in, w_out) == (1, k):
        layouts = {"whole": None, "unknown": None, "last": "Shard(-1)", "seq": "Shard(1)"}
        if arrives not in layouts:
            return f"its input arrives split otherwise ({op.inputs[0]})"
        return ModuleStyle("ColwiseParallel", layouts[arrives], _output_layout(out, lay, "Shard"))
    if (w_in, w_out) == (k, 1):
        layouts = {"whole": "Replicate", "unknown": None, "last": None}
        if arrives not in layouts:
            return f"its input arrives split otherwise ({op.inputs[0]})"
        output = _output_layout(out, lay, "Replicate")
        return ModuleStyle("RowwiseParallel", layouts[arrives], output)
    return f"its weight is split {list(w)} over {k} devices: neither by columns nor by rows"


def _embedding_style(ops: list[ShardedOp], lay: _Layouts) -> ModuleStyle | str:
    """Rowwise (vocabulary split) or colwise (embedding dim split) for an nn.Embedding."""
    gather = [o for o in ops if o.op_type == "Gather" and o.weights and o.weights[0]]
    if len(gather) != 1:
        return "no single lookup of a weight in its operators"
    op, k = gather[0], lay.devices
    w, ids = op.strategy[0], op.strategy[1] if len(op.strategy) > 1 else ()
    if int(np.prod(ids)) not in (1, lay.data) or any(n > 1 for n in ids[1:]):
        return f"its indices are split {list(ids)} (batch or sequence): no module style shards that"
    if tuple(w) == (k, 1):  # its indices come whole (RowwiseParallel's default: Shard(-1))
        output = _output_layout(op.output, lay, "Replicate")
        return ModuleStyle("RowwiseParallel", "Replicate", output)
    if tuple(w) == (1, k):
        return ModuleStyle("ColwiseParallel", None, _output_layout(op.output, lay, "Shard"))
    return f"its table is split {list(w)} over {k} devices: neither by rows nor by columns"


def _norm_style(ops: list[ShardedOp], lay: _Layouts) -> ModuleStyle | str:
    """SequenceParallel when every operator splits its activation on dim 1 only."""
    k = lay.devices
    for op in ops:
        first = op.strategy[0] if op.strategy else ()
        seq = len(first) > 1 and first[1] == k and sum(n > 1 for n in first) == 1
        rest_whole = all(n == 1 for split in op.strategy[1:] for n in split if len(split) > 1)
        if not (seq and rest_whole):
            return (
                f"operator {op.name} is split {[list(s) for s in op.strategy]}, not on the "
                "sequence dim only (SequenceParallel)"
            )
    return ModuleStyle("SequenceParallel")


def _has_weights(ops: list[ShardedOp]) -> bool:
    return any(
        o.op_type in ("MatMul", "Gemm", "Gather", "Conv", "ConvTranspose") and any(o.weights)
        for o in ops
    )


def _by_module(ops: list[ShardedOp]) -> dict[str | None, list[ShardedOp]]:
    groups: dict[str | None, list[ShardedOp]] = {}
    for op in ops:
        groups.setdefault(op.module, []).append(op)
    return groups


def map_to_dtensor(ops: list[ShardedOp], mesh: tuple[int, ...], lay: _Layouts) -> DTensorPlan:
    """The styles of the modules whose strategies are one, and the lists of the others."""
    styles: dict[str, ModuleStyle] = {}
    replicate, not_mapped, follows = [], [], []
    for module, members in _by_module(ops).items():
        cls = next((o.module_class for o in members if o.module_class), None)
        where = module if module else "(the root module)"
        if module is None:
            if any(o.sharded(lay.data) for o in members):
                not_mapped.append(ModuleNote("(no module recorded)", _NO_MODULE))
            continue
        if cls in (LINEAR, EMBEDDING) or (cls or "").endswith(NORM_SUFFIXES):
            if not any(o.sharded(lay.data) for o in members):
                replicate.append(module)
                continue
            rule = _linear_style if cls == LINEAR else _embedding_style
            rule = _norm_style if cls not in (LINEAR, EMBEDDING) else rule
            got = rule(members, lay)
            if isinstance(got, ModuleStyle):
                styles[module] = got
            else:
                not_mapped.append(ModuleNote(module, f"{cls.rsplit('.', 1)[-1]}: {got}"))
        elif any(o.sharded(lay.data) for o in members):
            if _has_weights(members):
                name = (cls or "unknown class").rsplit(".", 1)[-1]
                not_mapped.append(ModuleNote(where, f"{name}: {_CLASS_NOT_MAPPED}"))
            else:
                n = sum(o.sharded(lay.data) for o in members)
                plural = "s" if n > 1 else ""
                follows.append(ModuleNote(where, f"{n} sharded operator{plural} without weights"))
    return DTensorPlan(
        mesh=tuple(mesh),
        parallelize_plan={m: s.style for m, s in styles.items()},
        input_layouts={m: s.input_layout for m, s in styles.items() if s.input_layout},
        output_layouts={m: s.output_layout for m, s in styles.items() if s.output_layout},
        replicate=tuple(replicate),
        not_mapped=tuple(not_mapped),
        follows=tuple(follows),
    )


_NO_MODULE = (
    "sharded operators without a module path (the dynamo exporter's name scopes); export the "
    "model with torch.onnx.export(..., dynamo=True)"
)
_CLASS_NOT_MAPPED = (
    "sharded, and DTensor's module styles shard nn.Linear and nn.Embedding (SequenceParallel: "
    "norms)"
)


def dtensor_plan(model_path: str | Path, data: dict, where: str) -> DTensorPlan:
    """The DTensor form of a ``mtpp shard`` plan (its ``plan.json`` content) for the ONNX
    model it was made for."""
    if not isinstance(data, dict) or data.get("format") != SHARD_PLAN_FORMAT:
        raise MtppError(
            f"{where}: --format {DTENSOR} takes an operator-sharding plan (mtpp shard MODEL "
            f"--out DIR writes DIR/plan.json, format {SHARD_PLAN_FORMAT!r}) or a joint plan"
        )
    mesh = tuple(int(n) for n in (data.get("mesh") or {}).get("shape", []))
    strategies = data.get("strategies")
    if not mesh or not isinstance(strategies, dict):
        raise MtppError(f"{where}: the sharding plan has no mesh or no strategies")
    model = load_proto(model_path)
    ops = sharded_ops(model, strategies, where)
    devices = int(np.prod(mesh))
    lay = _plan_layouts(data, devices, [o.name for o in model.graph.output])
    return map_to_dtensor(ops, mesh, lay)


def dtensor_files(plan: DTensorPlan) -> dict[str, str]:
    """``dtensor_plan.json`` and the README with the ``parallelize_module`` call."""
    notes = "".join(f"- `{n.module}`: {n.reason}\n" for n in plan.not_mapped) or "- none\n"
    follows = "".join(f"- `{n.module}`: {n.reason}\n" for n in plan.follows) or "- none\n"
    readme = f"""# DTensor: parallelize_module on {plan.ranks} ranks

```python
import json
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module)

plan = json.load(open("dtensor_plan.json"))
STYLES = {{"ColwiseParallel": ColwiseParallel, "RowwiseParallel": RowwiseParallel,
          "SequenceParallel": SequenceParallel}}
LAYOUTS = {{"Replicate": Replicate(), "Shard(-1)": Shard(-1), "Shard(1)": Shard(1)}}

def style(path, name):
    options = {{}}
    if path in plan["input_layouts"]:
        options["input_layouts"] = LAYOUTS[plan["input_layouts"][path]]
    if path in plan["output_layouts"]:
        options["output_layouts"] = LAYOUTS[plan["output_layouts"][path]]
    return STYLES[name](**options)

mesh = init_device_mesh("cuda", ({plan.ranks},))  # "cpu" with gloo
model = parallelize_module(
    model, mesh, {{path: style(path, name) for path, name in plan["parallelize_plan"].items()}})
```

`model` is the module you exported to ONNX (module paths are relative to it). The plan's mesh
is {list(plan.mesh)}; the styles shard over all {plan.ranks} ranks. Modules in `replicate` keep
their weights whole on every rank (parallelize_module leaves them alone). RowwiseParallel
returns its output whole (an all-reduce) unless `output_layouts` says otherwise.

Sharded modules no style expresses (they run replicated in torch):
{notes}
Sharded operators without weights (in torch they run on whatever their inputs are, such as the
local shards a ColwiseParallel leaves):
{follows}"""
    return {"dtensor_plan.json": _json(plan.to_dict()), README: readme}


def framework_files(fmt: str, st: ModuleStages, where: str) -> dict[str, str]:
    """The files of format ``fmt`` (name -> text)."""
    if fmt == "torch":
        return torch_files(st)
    if fmt == "torchtitan":
        return torchtitan_files(st)
    if fmt == "megatron":
        return megatron_files(st, where)
    if fmt == "deepspeed":
        return deepspeed_files(st)
    if fmt == "vllm":
        return vllm_files(st, where)
    raise MtppError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")


def write_framework(
    fmt: str,
    st: ModuleStages,
    out_dir: str | Path,
    where: str,
    inputs: list[str | Path] = (),
    force: bool = False,
) -> FrameworkFiles:
    """Write the files of ``fmt`` into ``out_dir`` whole (checked first: an existing
    non-empty folder is replaced only with ``force``)."""
    check_output_dir(Path(out_dir), list(inputs), force=force, what="export")
    return _write_files(fmt, framework_files(fmt, st, where), out_dir, list(inputs), force)


def export_framework(
    fmt: str,
    model_path: str | Path,
    g: Graph,
    assignment: np.ndarray,
    out_dir: str | Path,
    plan_path: str | Path,
    force: bool = False,
) -> FrameworkFiles:
    """``mtpp export MODEL PLAN --format FMT --out DIR``: the plan's stages as module runs of
    the ONNX model it was made for, written in the framework's form."""
    if fmt not in FORMATS:
        raise MtppError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    check_output_dir(Path(out_dir), [model_path, plan_path], force=force, what="export")
    stages = module_stages(read_layout(model_path, g), assignment, str(plan_path))
    return write_framework(fmt, stages, out_dir, str(plan_path), [model_path, plan_path], force)


# ---------------------------------------------------------------------- joint plans
@dataclass(frozen=True)
class JointStage:
    """A joint plan's stage in (data, tensor) terms with its DTensor plan."""

    stage: int
    devices: tuple[int, ...]
    mesh: tuple[int, ...]
    data: int
    tensor: int
    dtensor: DTensorPlan

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "devices": list(self.devices),
            "mesh": list(self.mesh),
            "data": self.data,
            "tensor": self.tensor,
        }


def tensor_degree(ops: list[ShardedOp]) -> int:
    """The most ranks one weight is split over (1: every weight whole)."""
    splits = [
        int(np.prod(split))
        for o in ops
        for split, weight in zip(o.strategy, o.weights, strict=False)
        if weight and len(split) > 1
    ]
    return max(splits, default=1)


def joint_stage(model, st: dict, i: int, graph_outputs, where: str) -> JointStage:
    """Stage ``i`` of a joint plan (its dict in the plan file)."""
    mesh = tuple(int(n) for n in (st.get("mesh") or {}).get("shape", []))
    devices = tuple(int(d) for d in st.get("devices", []))
    ops = sharded_ops(model, dict(st.get("strategies") or {}), f"{where} stage {i}")
    tensor = tensor_degree(ops)
    data = max(1, len(devices) // tensor)
    lay = _Layouts(tensor, {}, frozenset(graph_outputs), {}, data)
    return JointStage(i, devices, mesh, data, tensor, map_to_dtensor(ops, (tensor,), lay))


def joint_pipeline(layout: ModuleLayout, g: Graph, stages: list[dict], where: str):
    """The joint plan's stages as module runs (ModuleStages), or the reason they are none."""
    stage_of = {op: i for i, st in enumerate(stages) for op in st.get("ops", [])}
    a = np.array([stage_of.get(name, -1) for name in g.names], dtype=np.int64)
    unit = np.asarray(layout.node_unit)
    for node in np.flatnonzero(a < 0):  # graph inputs: the stage of their unit's operators
        known = a[(unit == unit[node]) & (a >= 0)]
        a[node] = int(known.min()) if len(known) else 0
    try:
        return module_stages(layout, a, where)
    except MtppError as e:
        return str(e)


def joint_files(model_path: str | Path, g: Graph, data: dict, where: str) -> dict[str, str]:
    """A joint plan's (data, tensor, pipeline) layout, its torch split_spec (when its stages
    cut between modules) and each stage's DTensor plan."""
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise MtppError(f"{where}: the joint plan has no stages")
    model = load_proto(model_path)
    outputs = [o.name for o in model.graph.output]
    parts = [joint_stage(model, st, i, outputs, where) for i, st in enumerate(stages)]
    pipeline = joint_pipeline(read_layout(model_path, g), g, stages, where)
    layout = {
        "pipeline": len(parts),
        "stages": [p.to_dict() for p in parts],
        "torch_pipeline": None if isinstance(pipeline, str) else "torch_pipeline.json",
        "torch_pipeline_refused": pipeline if isinstance(pipeline, str) else None,
    }
    files = {"joint_layout.json": _json(layout)}
    if not isinstance(pipeline, str):
        files["torch_pipeline.json"] = torch_files(pipeline)["torch_pipeline.json"]
    for p in parts:
        files[f"stage{p.stage}_dtensor_plan.json"] = _json(p.dtensor.to_dict())
    files[README] = _joint_readme(parts, pipeline)
    return files


def _joint_readme(parts: list[JointStage], pipeline) -> str:
    rows = "".join(
        f"| {p.stage} | {list(p.devices)} | {p.data} | {p.tensor} | "
        f"{len(p.dtensor.parallelize_plan)} | {len(p.dtensor.not_mapped)} |\n"
        for p in parts
    )
    split = (
        f"The stages cut between modules: `torch_pipeline.json` holds the `split_spec` "
        f"(`pipeline(model, mb_args, split_spec=...)`, {len(parts)} stages)."
        if not isinstance(pipeline, str)
        else f"No `split_spec`: {pipeline}."
    )
    return f"""# A joint plan: {len(parts)} pipeline stages, each data x tensor parallel

| stage | devices | data | tensor | modules styled | not mapped |
| --- | --- | --- | --- | --- | --- |
{rows}
{split}

Stage s runs `stage{{s}}_dtensor_plan.json` on its devices: a 2-D mesh per stage,
`init_device_mesh(device, (data, tensor), mesh_dim_names=("dp", "tp"))`, the styles applied
with `parallelize_module(stage_module, mesh["tp"], plan)` (the call is in the README of
`mtpp export MODEL SHARD_PLAN --format dtensor`), and data parallelism over `mesh["dp"]`
(e.g. `replicate` or FSDP). `joint_layout.json` holds the (data, tensor, pipeline) degrees;
stages of different sizes cannot share one torch DeviceMesh, so each stage builds its own.
"""


def export_joint_frameworks(
    model_path: str | Path,
    g: Graph,
    data: dict,
    out_dir: str | Path,
    plan_path: str | Path,
    force: bool = False,
) -> FrameworkFiles:
    """``mtpp export MODEL JOINT_PLAN --format dtensor --out DIR``: :func:`joint_files`."""
    check_output_dir(Path(out_dir), [model_path, plan_path], force=force, what="export")
    files = joint_files(model_path, g, data, str(plan_path))
    return _write_files(DTENSOR, files, out_dir, [model_path, plan_path], force)


def export_dtensor(
    model_path: str | Path,
    data: dict,
    out_dir: str | Path,
    plan_path: str | Path,
    force: bool = False,
) -> FrameworkFiles:
    """``mtpp export MODEL SHARD_PLAN --format dtensor --out DIR``: the DTensor form of an
    operator-sharding plan (``data``: its plan.json content)."""
    check_output_dir(Path(out_dir), [model_path, plan_path], force=force, what="export")
    files = dtensor_files(dtensor_plan(model_path, data, str(plan_path)))
    return _write_files(DTENSOR, files, out_dir, [model_path, plan_path], force)


def _write_files(
    fmt: str, files: dict[str, str], out_dir: str | Path, inputs: list, force: bool
) -> FrameworkFiles:
    """Write ``files`` (name -> text, a name may hold one folder level) into ``out_dir``
    whole."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir, list(inputs), force=force, what="export")
    tmp = temp_dir_beside(out_dir)
    try:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FrameworkFiles(fmt, out_dir, tuple(files))


def _json(data: object) -> str:
    return json.dumps(data, indent=1) + "\n"


__all__ = [
    "DTENSOR",
    "DTensorPlan",
    "FORMATS",
    "SHARD_PLAN_FORMAT",
    "dtensor_files",
    "dtensor_plan",
    "export_dtensor",
    "export_joint_frameworks",
    "joint_files",
    "FrameworkFiles",
    "export_framework",
    "ModuleStages",
    "framework_files",
    "megatron_layout",
    "module_stages",
    "write_framework",
]
