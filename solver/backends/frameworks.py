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
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solver.core.errors import MtppError
from solver.core.files import check_output_dir
from solver.core.graph import Graph
from solver.core.outdir import replace_dir, temp_dir_beside
from solver.frontends.onnx.modules import ModuleLayout, read_layout

FORMATS = ("torch", "torchtitan", "megatron", "deepspeed", "vllm")
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
    out_dir = Path(out_dir)
    check_output_dir(out_dir, list(inputs), force=force, what="export")
    files = framework_files(fmt, st, where)
    tmp = temp_dir_beside(out_dir)
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FrameworkFiles(fmt, out_dir, tuple(files))


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


def _json(data: object) -> str:
    return json.dumps(data, indent=1) + "\n"


__all__ = [
    "FORMATS",
    "FrameworkFiles",
    "export_framework",
    "ModuleStages",
    "framework_files",
    "megatron_layout",
    "module_stages",
    "write_framework",
]
