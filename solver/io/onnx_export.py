"""Write a plan as a sharded ONNX model, and prove it computes what the original did.

Output folder (written to a temporary folder beside it and renamed into place, so an
interrupted export leaves nothing half-written; an existing non-empty folder is replaced only
with ``force``, and only after the new one is complete):

- ``annotated.onnx``: the full model with the int attributes ``__ipu_number`` (device) and
  ``__pipeline_stage`` (stage) on every node, as PopART and PopRT expect;
- ``stage{s}.onnx``: one model per non-empty stage with explicit boundary tensors. Inputs are
  tensors from earlier stages or model inputs; outputs are what later stages or the model's
  outputs need. Constant subgraphs are replicated into every stage that reads them; weights
  stay external (``stage{s}.onnx.data``) when the original kept them external;
- ``sharding.yaml``: the plan as PopRT-style manual sharding points, which ``--method manual``
  reads back to the same plan;
- ``stages.json``: stage inputs/outputs and, with ``verify``, the check result.

``verify`` runs the original model and the chained stage models in onnxruntime on seeded
random inputs, checks that every model output has the original's shape and kind of dtype, and
reports the largest absolute difference; a NaN in either output fails the check.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np

from solver.errors import MtppError
from solver.graph import Graph


def onnx_placement(model, g: Graph, assignment: np.ndarray) -> tuple[list[int], set[int]]:
    """Device of every ONNX node, and the indices of the static (replicable) ones.

    Operators and views take the block of the cost node they were folded into; static
    (constant) nodes take the smallest device among their readers, so the annotated model
    never sends a tensor backwards.
    """
    from solver.io.onnx_common import node_names as _node_names

    names = _node_names(model)
    members = g.hints.get("members")
    if members is None:
        raise MtppError(
            "export needs a graph imported from ONNX (the plan's graph has no ONNX node mapping)"
        )
    static_names = set(g.hints.get("static_nodes", []))
    device_of = {}
    for cost_name, onnx_names in members.items():
        d = int(assignment[g.index[cost_name]])
        for nm in onnx_names:
            if nm not in static_names:
                device_of[nm] = d
    static = {i for i, nm in enumerate(names) if nm in static_names or nm not in device_of}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(model.graph.node):
        for x in node.input:
            if x:
                readers.setdefault(x, []).append(i)
    dev = [device_of.get(nm, -1) for nm in names]
    for i in reversed(range(len(names))):  # statics: the earliest device that reads them
        if i in static:
            ds = [
                dev[j]
                for o in model.graph.node[i].output
                for j in readers.get(o, [])
                if dev[j] >= 0
            ]
            dev[i] = min(ds) if ds else 0
    return dev, static


def _value_info(name: str, shapes) -> object:
    from onnx import helper

    shape, et = shapes.get(name, (None, 1))
    return helper.make_tensor_value_info(name, et or 1, list(shape) if shape is not None else None)


def stage_models(model, dev: list[int], static: set[int], shapes, k: int) -> list[dict]:
    """For every stage: the node indices (statics replicated), inputs, outputs, initializers."""
    from solver.io.onnx_common import CONTROL_FLOW
    from solver.io.onnx_common import subgraph_inputs as _subgraph_inputs

    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    inits = {t.name for t in g.initializer}
    graph_inputs = {i.name for i in g.input if i.name not in inits}
    graph_outputs = [o.name for o in g.output]

    def reads(i: int) -> list[str]:
        node = g.node[i]
        xs = [x for x in node.input if x]
        if node.op_type in CONTROL_FLOW:
            xs += [x for x in _subgraph_inputs(node) if x not in xs]
        return xs

    need_later: dict[str, set[int]] = {}
    for i, node in enumerate(g.node):
        if i in static:
            continue
        for x in reads(i):
            p = producer.get(x)
            if p is not None and p not in static and dev[p] != dev[i]:
                if dev[p] > dev[i]:
                    raise MtppError(
                        f"node {node.name or i!r} on device {dev[i]} reads {x!r} from the "
                        f"later device {dev[p]}: the plan does not respect the graph order"
                    )
                need_later.setdefault(x, set()).add(dev[i])
    stages = []
    for s in range(k):
        own = [i for i in range(len(g.node)) if i not in static and dev[i] == s]
        if not own:
            stages.append({"stage": s, "nodes": [], "inputs": [], "outputs": [], "inits": []})
            continue
        take, todo = set(own), list(own)
        inputs, used_inits = [], set()
        while todo:
            i = todo.pop()
            for x in reads(i):
                p = producer.get(x)
                if x in inits:
                    used_inits.add(x)
                elif p is not None and p in static:
                    if p not in take:
                        take.add(p)
                        todo.append(p)
                elif x not in inputs and (
                    (p is None and x in graph_inputs) or (p is not None and dev[p] != s)
                ):
                    inputs.append(x)
        produced = {o for i in own for o in g.node[i].output if o}
        outputs = [x for x in produced if need_later.get(x) or x in graph_outputs]
        outputs.sort(key=lambda x: (x not in graph_outputs, x))
        stages.append(
            {
                "stage": s,
                "nodes": sorted(take),
                "inputs": inputs,
                "outputs": outputs,
                "inits": sorted(used_inits),
            }
        )
    return stages


def _build_stage(model, st: dict, shapes):
    import onnx
    from onnx import helper

    g = model.graph
    init_by_name = {t.name: t for t in g.initializer}
    graph = helper.make_graph(
        [g.node[i] for i in st["nodes"]],
        f"{g.name or 'model'}_stage{st['stage']}",
        [_value_info(x, shapes) for x in st["inputs"]],
        [_value_info(x, shapes) for x in st["outputs"]],
        initializer=[init_by_name[x] for x in st["inits"]],
    )
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = max(model.ir_version, 4)  # IR < 4 needs every initializer as an input
    m.functions.extend(model.functions)
    onnx.checker.check_model(m)
    return m


def _save(m, path: Path, external: bool) -> None:
    import onnx

    if external:
        onnx.save(
            m,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save(m, str(path))


def export_plan(
    model_path: str | Path,
    g: Graph,
    assignment: np.ndarray,
    out_dir: str | Path,
    dims: dict[str, int] | None = None,
    stage: np.ndarray | None = None,
    verify: bool = False,
    tolerance: float = 1e-4,
    seed: int = 0,
    force: bool = False,
    inputs: list[str | Path] = (),
) -> dict:
    """Write the annotated model, the stage models and the sharding YAML; return a report.

    ``out_dir`` is checked first (:func:`solver.files.check_output_dir` with the model and
    ``inputs``): an existing non-empty folder is replaced only with ``force``.
    """
    import onnx
    from onnx import TensorProto, helper

    from solver.files import check_output_dir
    from solver.io.onnx_load import check_external_paths
    from solver.io.onnx_shapes import complete_shapes, fix_dims
    from solver.io.sharding_yaml import to_sharding_yaml

    model_path, out_dir = Path(model_path), Path(out_dir)
    check_output_dir(out_dir, [model_path, *inputs], force=force, what="export")
    a = np.asarray(assignment, dtype=np.int64)
    stage = a if stage is None else np.asarray(stage)
    k = int(a.max()) + 1
    model = onnx.load(str(model_path), load_external_data=False)
    check_external_paths(model, model_path.parent)
    external = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(model, str(model_path.parent))
    fix_dims(model, dict(dims or {}))
    shapes = complete_shapes(model, model_path.parent)[0]
    dev, static = onnx_placement(model, g, a)
    stage_of_device = {int(d): int(s) for d, s in zip(a.tolist(), stage.tolist(), strict=True)}
    stages = stage_models(model, dev, static, shapes, k)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the folder gets the usual mode
        annotated = onnx.ModelProto()
        annotated.CopyFrom(model)
        for node, d in zip(annotated.graph.node, dev, strict=True):
            keep = [x for x in node.attribute if x.name not in ("__ipu_number", "__pipeline_stage")]
            del node.attribute[:]
            node.attribute.extend(keep)
            node.attribute.append(helper.make_attribute("__ipu_number", int(d)))
            node.attribute.append(
                helper.make_attribute("__pipeline_stage", stage_of_device.get(int(d), int(d)))
            )
        onnx.checker.check_model(annotated)
        _save(annotated, tmp / "annotated.onnx", external)
        files = []
        for st in stages:
            if not st["nodes"]:
                continue
            m = _build_stage(model, st, shapes)
            name = f"stage{st['stage']}.onnx"
            _save(m, tmp / name, external)
            files.append(name)
        (tmp / "sharding.yaml").write_text(to_sharding_yaml(g, a, stage))
        report = {
            "model": str(model_path),
            "devices": k,
            "stages": [
                {
                    "stage": st["stage"],
                    "file": f"stage{st['stage']}.onnx" if st["nodes"] else None,
                    "onnx_nodes": len(st["nodes"]),
                    "inputs": st["inputs"],
                    "outputs": st["outputs"],
                }
                for st in stages
            ],
            "graph_outputs": [o.name for o in model.graph.output],
        }
        if verify:
            report["verify"] = verify_stages(model_path, model, tmp, report, tolerance, seed)
        (tmp / "stages.json").write_text(json.dumps(report, indent=1))
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Rename the complete folder ``tmp`` to ``out_dir``.

    An existing ``out_dir`` (already allowed by :func:`solver.files.check_output_dir`) is
    renamed aside first and deleted only once the new folder is in place; if that rename
    fails, the old folder is put back.
    """
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except BaseException:
        os.replace(old, out_dir)
        raise
    if old.is_symlink():  # the user named a link to a folder: drop the link, not its target
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)


def verify_stages(
    model_path: Path, model, folder: Path, report: dict, tolerance: float, seed: int
) -> dict:
    """Run the original and the chained stages on the same random inputs; compare outputs."""
    import onnxruntime as ort

    from solver.io.onnx_ort import random_inputs

    so = ort.SessionOptions()
    so.log_severity_level = 3
    feeds = random_inputs(model, seed=seed)
    full = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in full.get_outputs()], full.run(None, feeds), strict=True))
    env = dict(feeds)
    for st in report["stages"]:
        if not st["file"]:
            continue
        sess = ort.InferenceSession(
            str(folder / st["file"]), so, providers=["CPUExecutionProvider"]
        )
        outs = sess.run(st["outputs"], {x: env[x] for x in st["inputs"]})
        env.update(zip(st["outputs"], outs, strict=True))
    diffs: dict[str, float | None] = {}
    problems: list[str] = []
    for name, ref in want.items():
        if name not in env:
            raise MtppError(f"verify: no stage produces the model output {name!r}")
        diffs[name], problem = compare_output(name, np.asarray(ref), np.asarray(env[name]))
        if problem:
            problems.append(problem)
    compared = [d for d in diffs.values() if d is not None]
    worst = max(compared) if compared else None  # None: no output could be compared
    return {
        "max_abs_diff": worst,
        "per_output": diffs,
        "problems": problems,
        "tolerance": tolerance,
        "ok": not problems and (worst or 0.0) <= tolerance,
        "seed": seed,
    }


def compare_output(name: str, ref: np.ndarray, got: np.ndarray) -> tuple[float | None, str | None]:
    """Largest absolute difference of one model output, or None and the reason it cannot pass.

    Shapes and kinds of dtype (float, int, bool, ...) must agree before values are compared
    (broadcasting would hide a wrong shape), and a NaN on either side is a failure, never a
    pass: NaN compares unequal to everything, so a max over differences would drop it.
    """
    if ref.shape != got.shape:
        return None, f"{name}: shape {list(got.shape)} from the stages, {list(ref.shape)} expected"
    if ref.dtype.kind != got.dtype.kind:
        return None, f"{name}: dtype {got.dtype} from the stages, {ref.dtype} expected"
    if ref.dtype.kind in "fc":
        for side, x in (("original model", ref), ("stages", got)):
            if np.isnan(x).any():
                return None, f"{name}: the {side} output has NaN"
        if not np.array_equal(np.isinf(ref), np.isinf(got)) or not np.array_equal(
            ref[np.isinf(ref)], got[np.isinf(got)]
        ):
            return None, f"{name}: infinities differ between the original and the stages"
        fin = np.isfinite(ref)
        diff = np.abs(got[fin].astype(np.float64) - ref[fin].astype(np.float64))
        return (float(diff.max()) if diff.size else 0.0), None
    if ref.dtype.kind in "iub":
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        return (float(diff.max()) if diff.size else 0.0), None
    if np.array_equal(ref, got):
        return 0.0, None
    return None, f"{name}: values differ"
