"""The model builders in models/: valid, runnable, and imported with exact parameter counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from models import build
from solver.frontends import load_graph
from solver.frontends.onnx.profile import random_inputs

ROOT = Path(__file__).resolve().parents[3]


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


VIT_SMALL = dict(image=32, patch=8, layers=2, hidden=64, heads=4, classes=10)


def test_vit_runs_and_imports_exactly(tmp_path):
    model, n_params = build.BUILDERS["vit"](**VIT_SMALL)
    path = tmp_path / "vit.onnx"
    build.save(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, random_inputs(onnx.load(str(path))))
    assert logits.shape == (1, 10) and np.all(np.isfinite(logits))
    assert load_graph(path).param_bytes_total == 4 * n_params
    assert build.estimate_size("vit", VIT_SMALL).weight_floats == n_params


@pytest.mark.parametrize("kind", ["transformer", "decoder"])
def test_transformer_weight_estimate_is_exact(kind):
    _, n_params = build.BUILDERS[kind](**build.SMALL[kind])
    buffers = 16 * 16 if kind == "decoder" else 0
    assert build.estimate_size(kind, build.SMALL[kind]).weight_floats == n_params + buffers


def test_external_weights_stream_the_same_model(tmp_path):
    kw = dict(layers=2, hidden=64, heads=4, seq=16, vocab=256)
    in_memory, n_params = build.BUILDERS["transformer"](**kw)
    path = tmp_path / "enc.onnx"
    assert build.main(["transformer", *_flags(kw), "--out", str(path), "--external-weights"]) == 0
    data = tmp_path / "enc.onnx.data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc.onnx", "enc.onnx.data"]
    proto = onnx.load(str(path), load_external_data=False)
    streamed_bytes = [
        4 * int(np.prod(t.dims))
        for t in proto.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    ]
    assert data.stat().st_size == sum(streamed_bytes) > 0.9 * 4 * n_params  # biases stay inline
    assert path.stat().st_size < 0.1 * data.stat().st_size
    streamed = onnx.load(str(path))  # reads the external data back
    assert streamed.graph.node == in_memory.graph.node
    assert streamed.graph.value_info == in_memory.graph.value_info
    for a, b in zip(streamed.graph.initializer, in_memory.graph.initializer, strict=True):
        assert a.name == b.name
        assert np.array_equal(onnx.numpy_helper.to_array(a), onnx.numpy_helper.to_array(b))
    assert load_graph(path).param_bytes_total == 4 * n_params


def test_a_failed_streaming_build_leaves_no_file(tmp_path, monkeypatch):
    def broken_save(model, path, external=None):
        raise OSError("disk full")

    monkeypatch.setattr(build, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        build.main(
            [
                "transformer",
                "--layers",
                "1",
                "--out",
                str(tmp_path / "m.onnx"),
                "--external-weights",
            ]
        )
    assert list(tmp_path.iterdir()) == []


BERT_LARGE = ["--layers", "24", "--hidden", "1024", "--heads", "16", "--seq", "128"]


def test_bert_large_is_refused_only_where_it_does_not_fit(tmp_path, monkeypatch, capsys):
    kw = dict(layers=24, hidden=1024, heads=16, seq=128)
    size = build.estimate_size("transformer", kw)
    assert size.weight_floats == 304_516_096  # the builder's exact count (vocab 1000)
    assert size.memory(external=False) < 8 * 2**30
    assert size.memory(external=True) < 400 * 2**20  # one tensor at a time
    monkeypatch.setattr("solver.frontends.onnx.modelgen.available_memory", lambda: 2 * 2**30)
    out = tmp_path / "bert.onnx"
    assert build.main(["transformer", *BERT_LARGE, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("build.py: error: transformer: building these parameters needs about")
    assert "more than the 2 GiB available" in err and "--external-weights" in err
    assert list(tmp_path.iterdir()) == []
    build.check_params("transformer", kw, external=True)  # streaming fits in 2 GiB


def test_bad_sizes_are_one_line_exit_2(tmp_path, capsys):
    for argv in (["--layers", "0"], ["--hidden", "100", "--heads", "3"], ["--layers", str(10**9)]):
        assert build.main(["transformer", *argv, "--out", str(tmp_path / "m.onnx")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("build.py: error: transformer:")
    assert list(tmp_path.iterdir()) == []


def _flags(kw: dict) -> list[str]:
    return [x for k, v in kw.items() for x in (f"--{k}", str(v))]


@pytest.mark.parametrize("kind", ["resnet", "inception", "unet"])
def test_cnn_weight_estimate_is_an_upper_bound(kind):
    _, n_params = build.BUILDERS[kind](**build.SMALL[kind])
    size = build.estimate_size(kind, build.SMALL[kind])
    assert n_params <= size.weight_floats < 20 * n_params
