"""A joint plan as files, and the numeric proof that its chain of sharded stages computes the
model (``mtpp export MODEL --plan joint.json --out DIR [--verify]``).

Folder layout (written to a temporary folder beside ``DIR`` and renamed into place):

- ``stage_{s}/annotated.onnx``: the stage's sub-model
  (:func:`solver.joint.stages.stage_model`), cut from the model by tensor names (inputs =
  ``stage.inputs``, outputs = ``stage.outputs``), every node carrying its strategy in
  ``metadata_props`` (``mtpp shard`` reads it back); weights stored outside the model are
  copied by byte range into ``annotated.onnx.data`` beside it, never read into Python;
- ``stage_{s}/strategies.yaml`` and ``stage_{s}/plan.json``: what ``mtpp shard --out`` writes
  for that stage on its mesh (the sharded program, its collectives and memory);
- ``plan.json`` (the joint plan as given) and ``manifest.json`` (stages, devices, files).

``--verify`` feeds seeded random inputs through the chain: each stage runs on its emulated
devices with its strategies (:func:`solver.backends.spmd_execute.run_sharded`) and hands its outputs
to the next stages; every boundary tensor and every model output is compared with onnxruntime
on the whole model (:func:`solver.backends.verify.verify_chain`). The first tensor beyond
tolerance names its stage.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from solver.backends.export import DataFiles, write_model
from solver.backends.verify import verify_chain, verify_memory
from solver.core.files import check_output_dir, json_safe
from solver.core.outdir import replace_dir, temp_dir_beside
from solver.frontends.onnx.ort import check_memory
from solver.joint.stages import StageProgram, stage_model, stage_programs
from solver.joint.submesh import sub_cluster
from solver.spmd.config import annotate, dump_yaml, from_attributes
from solver.spmd.model import ShardModel, load_model
from solver.spmd.program import Planner, evaluate
from solver.spmd.report import plan_dict
from solver.spmd.strategy import ATTRIBUTE, attributes_to_metadata

STAGE_DIR = "stage_{}"


# ---------------------------------------------------------------------- export
def _written_programs(plan, folder: Path) -> list[StageProgram]:
    """The stages as written: each ``stage_{s}/annotated.onnx`` loaded back (weights from its
    own data file) with the strategies its nodes carry, priced on the stage's mesh."""
    out = []
    for st in plan.stages:
        sub = load_model(folder / STAGE_DIR.format(st.index) / "annotated.onnx")
        planner = Planner(sub, st.mesh, sub_cluster(plan.cluster, st.devices))
        out.append(StageProgram(st, sub, planner, evaluate(planner, from_attributes(sub))))
    return out


def _fix_scalar_annotations(m, strategies: dict) -> None:
    """Rewrite the annotation of a node whose only data input is a scalar (an If's condition):
    the seed notation ``(())`` reads back as no input at all, ``((),)`` reads back right."""
    for node in m.graph.node:
        if strategies.get(node.name) == ((),):
            for e in node.metadata_props:
                if e.key == ATTRIBUTE:
                    e.value = "((),)"


@dataclass
class _StageFiles:
    """The files of one stage folder and the weight bytes copied into them."""

    files: list[str]
    weight_bytes: int


def _write_stage(
    model, sm: ShardModel, p: StageProgram, src_dir: Path, folder: Path, status
) -> _StageFiles:
    """``annotated.onnx`` (+ its data file), ``strategies.yaml`` and ``plan.json`` of one
    stage."""
    st = p.stage
    folder.mkdir()
    strategies = {op.name: p.program.shardings[op.index].strategy for op in p.sm.ops}
    m = stage_model(model, sm, st)
    annotate(m, strategies, {n.name: i for i, n in enumerate(m.graph.node) if n.name})
    _fix_scalar_annotations(m, strategies)
    data = DataFiles(src_dir, folder)
    try:
        write_model(m, folder / "annotated.onnx", data, reuse=False)
        files = ["annotated.onnx", *sorted(data.dst)]
    finally:
        data.close()
    (folder / "strategies.yaml").write_text(dump_yaml(strategies))
    shard = plan_dict(p.planner, p.program, "joint", status)
    shard.update(stage=st.index, devices=[int(d) for d in st.devices])
    _write_json(folder / "plan.json", shard)
    return _StageFiles([*files, "strategies.yaml", "plan.json"], data.copied)


@dataclass
class _StagesWritten:
    """Every stage folder written: the manifest's rows and the weight bytes copied."""

    rows: list[dict]
    weight_bytes: int


def _write_stages(
    model, sm: ShardModel, programs: list[StageProgram], src_dir: Path, tmp: Path, status
) -> _StagesWritten:
    """One folder per stage in ``tmp`` (:func:`_write_stage`), each described by a manifest row."""
    rows, copied = [], 0
    for p in programs:
        st = p.stage
        name = STAGE_DIR.format(st.index)
        written = _write_stage(model, sm, p, src_dir, tmp / name, status)
        copied += written.weight_bytes
        rows.append(
            {
                "stage": st.index,
                "folder": name,
                "files": written.files,
                "devices": [int(d) for d in st.devices],
                "mesh": list(st.mesh.shape),
                "ops": len(st.ops),
                "inputs": list(st.inputs),
                "outputs": list(st.outputs),
                "program_time": p.program.objective,
                "collectives": p.program.collectives(),
                "memory_per_device": p.program.memory_per_device,
            }
        )
    return _StagesWritten(rows, copied)


def _write_json(path: Path, data: dict) -> None:
    """``data`` as strict JSON (numpy values plain, NaN and infinities as null)."""
    path.write_text(json.dumps(json_safe(data), indent=1, allow_nan=False) + "\n")


def export_joint(
    plan,
    model_path: str | Path,
    out_dir: str | Path,
    *,
    plan_path: str | Path | None = None,
    dims: dict[str, int] | None = None,
    verify: bool = False,
    tolerance: float | None = None,
    seed: int = 0,
    force: bool = False,
    inputs: list[str | Path] = (),
    verify_memory_ok: bool = False,
) -> dict:
    """Write one folder per stage, ``plan.json`` and ``manifest.json`` into ``out_dir`` (see
    the module docstring); with ``verify`` run the chain from the written files, refused
    before anything is written when :func:`solver.backends.verify.verify_memory` exceeds the
    memory available (unless ``verify_memory_ok``). Returns the manifest (with ``verify``).
    ``out_dir`` is refused as :func:`check_output_dir` says."""
    import onnx  # heavy: onnx

    model_path, out_dir = Path(model_path), Path(out_dir)
    given = [model_path, *([plan_path] if plan_path else []), *inputs]
    check_output_dir(out_dir, given, force=force, what="export")
    sm = load_model(model_path, dims)
    programs = stage_programs(plan, sm)
    needed = verify_memory(sm, programs) if verify else 0.0
    if verify and not verify_memory_ok:
        _check_verify_memory(needed)
    model = onnx.load(str(model_path), load_external_data=False)  # weights by reference
    attributes_to_metadata(model)
    tmp = temp_dir_beside(out_dir)
    try:
        written = _write_stages(model, sm, programs, model_path.parent, tmp, plan.status)
        if plan_path is not None:
            shutil.copyfile(plan_path, tmp / "plan.json")
        else:
            _write_json(tmp / "plan.json", plan.to_dict())
        manifest = {
            "format": "mtpp-joint-export",
            "model": str(model_path),
            "plan": "plan.json",
            "cluster": plan.cluster.name,
            "stages": written.rows,
            "model_outputs": list(sm.outputs),
            "weight_bytes_copied": written.weight_bytes,
        }
        if plan.training is not None:
            add_training(manifest, plan.training)
        if verify:
            stages = _written_programs(plan, tmp)
            manifest["verify"] = verify_chain(plan, sm, stages, seed=seed, tolerance=tolerance)
            manifest["verify"]["memory_estimate"] = needed
        _write_json(tmp / "manifest.json", manifest)
        (tmp / "README.txt").write_text(readme(manifest))
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def add_training(manifest: dict, training) -> None:
    """A joint training plan's settings in its export: the schedule, microbatches, optimizer
    state and T (``manifest["training"]``, the plan file's section) and each stage's training
    terms beside its row (``stages[i]["training"]``: F, B, t, sync, in flight, memory)."""
    manifest["training"] = training.to_dict()
    for row, terms in zip(manifest["stages"], training.stages, strict=True):
        row["training"] = terms.to_dict()


def _check_verify_memory(needed: float) -> None:
    """Refuse (one line) a ``--verify`` that needs more memory than is available."""
    check_memory(
        needed,
        "--verify (the whole model in onnxruntime, then each stage on its emulated devices)",
        "estimated",
        "pass --verify-memory-ok to run it anyway, or export without --verify",
    )


def readme(manifest: dict) -> str:
    """The folder in words: which stage runs where, reading and sending what."""
    lines = [
        f"Joint plan of {manifest['model']} on {manifest['cluster']}: "
        f"{len(manifest['stages'])} pipeline stages, each an SPMD program on its devices.",
        "plan.json: the joint plan; manifest.json: this summary as data.",
        *training_readme(manifest.get("training")),
        "",
    ]
    for st in manifest["stages"]:
        lines += [
            f"{st['folder']}/: devices {st['devices']} (mesh {st['mesh']}), {st['ops']} operators",
            f"  receives {', '.join(st['inputs']) or 'nothing'}",
            f"  sends {', '.join(st['outputs']) or 'nothing'}",
            "  annotated.onnx (strategies in metadata_props: mtpp shard reads them), "
            "strategies.yaml, plan.json (the sharded program)",
        ]
    return "\n".join(lines) + "\n"


def training_readme(training: dict | None) -> list[str]:
    """The README lines of a joint training plan's export (none for an inference plan)."""
    if training is None:
        return []
    return [
        f"Trained with {training['schedule']}, m = {training['microbatches']} microbatches, "
        f"optimizer state x{training['optimizer_state']:g}: iteration time T = "
        f"{training['iteration_time']:.6g} s (manifest.json: training; per stage: F, B, sync, "
        "in flight, memory).",
        "Each stage folder holds the stage's forward graph with its strategies; its backward "
        "(the same shardings, the gradient sync over the stage's data axis once per iteration) "
        "is derived by the training framework, not exported.",
    ]
