"""Loading an ONNX model: the protobuf without its weight bytes, with external data checked.

External data is checked by path and by ``stat`` only: every location must stay inside the
model's folder (a model naming ``/etc/passwd`` or ``../../secret`` would make a loader read, or
an exporter overwrite, files outside the model: a known attack), and every file must exist and
hold ``offset + length`` bytes. Weights are never read to find out.
"""

from __future__ import annotations

import os
from pathlib import Path

from solver.core.errors import MtppError, first_line
from solver.frontends.onnx.common import dense_bytes, external_info, model_tensors
from solver.frontends.onnx.flops import numel

LIGHT_LIMIT = 4096  # initializers with more elements are handed to checker/inference as inputs


def read_model(path: str | Path):
    """Load an ONNX model without external weight bytes; refuse unsafe or broken external
    data; run the ONNX checker on a light copy."""
    model = load_proto(path)
    check_model(model, str(path))
    return model


def load_proto(path: str | Path):
    """The ONNX protobuf of ``path`` without external weight bytes, its external data checked
    (:func:`check_external_paths`); not yet checked by the ONNX checker."""
    import onnx  # heavy: onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, TypeError) as e:
        raise MtppError(
            f"{path}: not a valid ONNX model (truncated or not protobuf: {e})"
        ) from None
    except OSError as e:
        raise MtppError(f"{path}: cannot read ({e})") from None
    if not model.graph.node or model.ir_version <= 0:
        raise MtppError(f"{path}: not a valid ONNX model (no graph nodes or no IR version)")
    check_external_paths(model, path.parent)
    return model


def check_model(model, where: str) -> None:
    """Run the ONNX checker on a light copy of ``model``; refuse it in one line naming
    ``where`` (the file, or the sub-model) when the checker does."""
    import onnx  # heavy: onnx

    try:
        onnx.checker.check_model(light_copy(model))
    except onnx.checker.ValidationError as e:
        first = first_line(e, "invalid model")
        raise MtppError(f"{where}: the ONNX checker rejects the model: {first}") from None


def light_copy(model):
    """The model without its big weights: every initializer over ``LIGHT_LIMIT`` elements (or
    stored externally), and every sparse initializer, becomes a typed graph input. The checker
    and shape inference serialise the whole model, so this turns seconds into milliseconds on a
    400 MB export; small initializers (shape vectors) stay, so data propagation still works.
    Constant nodes holding such weights become typed inputs too."""
    import onnx  # heavy: onnx
    from onnx import TensorProto, helper

    light = onnx.ModelProto()
    for fld in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, fld, getattr(model, fld))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    src, dst = model.graph, light.graph
    dst.name = src.name
    declared = {i.name for i in src.input}
    for node in src.node:
        t = _big_constant(node)
        if t is None:
            dst.node.append(node)
        elif node.output[0] not in declared:
            dst.input.append(helper.make_tensor_value_info(node.output[0], t.data_type, t.dims))
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    dst.value_info.extend(src.value_info)
    for t in src.initializer:
        if numel(t.dims) > LIGHT_LIMIT or t.data_location == TensorProto.EXTERNAL:
            if t.name not in declared:
                dst.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            dst.initializer.append(t)
    for s in src.sparse_initializer:
        if s.values.name not in declared:
            dst.input.append(
                helper.make_tensor_value_info(s.values.name, s.values.data_type, list(s.dims))
            )
    return light


def _big_constant(node):
    """The value of a Constant node that holds a weight (external or over ``LIGHT_LIMIT``
    elements), else None."""
    from onnx import TensorProto  # heavy: onnx

    if node.op_type != "Constant" or len(node.output) != 1:
        return None
    for a in node.attribute:
        if a.name == "value" and a.HasField("t"):
            t = a.t
            if t.data_location == TensorProto.EXTERNAL or numel(t.dims) > LIGHT_LIMIT:
                return t
    return None


def check_external_paths(model, base: Path) -> None:
    """Refuse external data that leaves the model's folder, is missing, or is shorter than
    the tensor it holds (in initializers, sparse initializers, node attributes, subgraphs and
    model functions). Only ``stat`` is used: the weights are never read."""
    from onnx import TensorProto  # heavy: onnx

    base = Path(base).resolve()
    sizes: dict[Path, int | None] = {}
    for t in model_tensors(model):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = external_info(t)
        loc = info.get("location", "")
        target = (base / loc).resolve()
        if not loc or os.path.isabs(loc) or (base != target and base not in target.parents):
            raise MtppError(
                f"tensor {t.name!r} keeps its data at {loc!r}, outside the model's folder; "
                "refusing to follow it (external data must live beside the model)"
            )
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else dense_bytes(t)
        except ValueError:
            raise MtppError(
                f"tensor {t.name!r}: external data offset/length are not integers "
                f"({info.get('offset')!r}, {info.get('length')!r}); the model file is damaged"
            ) from None
        if offset < 0 or length < 0:
            raise MtppError(
                f"tensor {t.name!r}: external data offset {offset} or length {length} is "
                "negative; the model file is damaged"
            )
        if target not in sizes:
            sizes[target] = target.stat().st_size if target.is_file() else None
        size = sizes[target]
        if size is None:
            raise MtppError(
                f"tensor {t.name!r}: its external data file {loc!r} is missing (expected "
                f"beside the model in {base}); copy the weights file there"
            )
        if offset > size:
            raise MtppError(
                f"tensor {t.name!r}: external data offset {offset} is past the end of {loc!r} "
                f"({size} bytes); the weights file is truncated or belongs to another model"
            )
        if offset + length > size:
            raise MtppError(
                f"tensor {t.name!r}: external data file {loc!r} is too short ({size} bytes, "
                f"the tensor needs bytes {offset}..{offset + length}); the weights file is "
                "truncated or belongs to another model"
            )
