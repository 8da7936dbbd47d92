"""The model builders in models/: valid, runnable, and imported with exact parameter counts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from solver.io import load_graph
from solver.io.onnx_profile import random_inputs

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mtpp_models_build", ROOT / "models" / "build.py")
build = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = build  # dataclasses look their module up there
spec.loader.exec_module(build)


@pytest.mark.parametrize("kind", list(build.SMALL))
def test_builder_models_run_and_import_exactly(kind, tmp_path):
    b_model, n_params = build.BUILDERS[kind](**build.SMALL[kind])
    path = tmp_path / f"{kind}.onnx"
    build.save(b_model, path)
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, random_inputs(onnx.load(str(path)))
    )
    assert np.all(np.isfinite(out[0]))
    g = load_graph(path)
    buffers = 16 * 16 if kind == "decoder" else 0  # the stored causal mask
    assert g.param_bytes_total == 4 * (n_params + buffers)
    assert g.flops.sum() > 0


@pytest.mark.parametrize("kind", list(build.SMALL))
def test_checked_in_small_models_match_the_builder(kind):
    path = ROOT / "models" / "small" / f"{kind}.onnx"
    assert path.stat().st_size < 5 * 2**20
    _, n_params = build.BUILDERS[kind](**build.SMALL[kind])
    buffers = 16 * 16 if kind == "decoder" else 0
    assert load_graph(path).param_bytes_total == 4 * (n_params + buffers)


def test_decoder_ties_lm_head_to_embedding():
    """The LM head reads Transpose(token embedding): the same weight, counted once."""
    g = load_graph(ROOT / "models" / "small" / "decoder.onnx")
    emb = [p for p in range(g.num_params) if g.p_names[p].startswith("tok_emb")]
    assert len(emb) == 1
    users = {g.op_types[u] for u in g.p_users[g.p_ptr[emb[0]] : g.p_ptr[emb[0] + 1]]}
    assert users == {"Gather", "MatMul"}


def test_unet_has_long_skips():
    g = load_graph(ROOT / "models" / "small" / "unet.onnx")
    rank = g.topo_rank
    span = max(int(rank[v] - rank[u]) for u, v in zip(*g.data_edges, strict=True))
    assert span > g.n // 2  # the first encoder level feeds the last decoder level
