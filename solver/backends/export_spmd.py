"""A sharded plan as files (``mtpp shard --out DIR``): ``strategies.yaml`` (loads back with
``--config``), ``plan.json`` (the JSON object of ``mtpp shard``,
:func:`solver.spmd.report.plan_dict`) and ``annotated.onnx`` (every node's strategy in its
``metadata_props``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from solver.core.files import json_safe
from solver.core.outdir import replace_dir, temp_dir_beside
from solver.spmd.config import annotate, dump_yaml
from solver.spmd.model import ShardModel

EXTERNAL_DATA_BYTES = 1_500_000_000  # an annotated model above this keeps its weights beside it


def write_out(out_dir: str | Path, sm: ShardModel, strategies: dict, plan: dict) -> None:
    """Write the three files into a temporary folder beside ``out_dir``, then rename it into
    place (:func:`solver.core.outdir.replace_dir`; check ``out_dir`` first with
    :func:`solver.core.files.check_output_dir`)."""
    import onnx  # heavy: onnx

    out_dir = Path(out_dir)
    tmp = temp_dir_beside(out_dir)
    try:
        (tmp / "strategies.yaml").write_text(dump_yaml(strategies))
        # as on stdout (print_json): numpy values plain, NaN and infinities as null
        text = json.dumps(json_safe(plan), indent=1, allow_nan=False)
        (tmp / "plan.json").write_text(text + "\n")
        model = onnx.ModelProto.FromString(sm.source.SerializeToString())
        annotate(model, strategies, {op.name: op.node_index for op in sm.ops})
        big = model.ByteSize() > EXTERNAL_DATA_BYTES
        onnx.save_model(
            model,
            str(tmp / "annotated.onnx"),
            save_as_external_data=big,
            location="annotated.onnx.data",
        )
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
