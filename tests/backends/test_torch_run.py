"""mtpp run --backend torch on small Hugging Face models with random weights (torch extra):

- a GPT-2 (4 layers, width 32) exported by torch's dynamo exporter, planned with
  ``--granularity layer -k 4``, runs as 4 gloo processes with pipeline() and GPipe and matches
  the unsplit module (1e-4), printing measured against simulated time per microbatch;
- a 2-stage training step (1F1B) of the same model matches the unsplit gradients, the tied
  embedding / head weight included;
- the Megatron sharding of a Llama (2 layers) from ``mtpp shard --method megatron -k 4``, in
  its DTensor form, runs with parallelize_module on 4 processes and matches (outputs and
  gradients).

The comparisons are checked on tensors made to differ (the refusals, torch missing included,
are in tests/cli/test_frameworks.py). Processes and models stay tiny: the CI budget is 2 cores.
"""

from __future__ import annotations

import json
import re

import pytest

from solver.backends.torch_run import Reference, compare_grads, compare_outputs
from solver.cli import main
from tests.badinput import assert_refused

torch = pytest.importorskip("torch", reason='needs the torch extra: pip install "mtpp[torch]"')
pytest.importorskip("transformers", reason="needs transformers (the test extra)")
pytest.importorskip("onnxscript", reason="needs onnxscript (the torch extra): dynamo export")

pytestmark = pytest.mark.slow

GPT2_FACTORY = """import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build():
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=4, n_embd=32, n_head=2, n_positions=16, vocab_size=64, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )
    return GPT2LMHeadModel(config)
"""
LLAMA_FACTORY = """import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=64, max_position_embeddings=16, use_cache=False,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    return LlamaForCausalLM(config)
"""
# links fast enough that every layer-granular split pays off (tests/cli/test_frameworks.py)
FAST_CLUSTER = """name: fast
devices: 4
fast_memory: 900MB
compute: 250TFLOPS
memory_bandwidth: 47.5TB/s
link_bandwidth: 10TB/s
slow_memory_bandwidth: 20GB/s
"""


def export_model(folder, source: str, shape: tuple[int, int]):
    """The factory file and its module exported by the dynamo exporter (random ids)."""
    factory = folder / "factory.py"
    factory.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(factory), "exec"), namespace)  # the user's file, as mtpp loads it
    model = namespace["build"]().eval()
    ids = torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(0))
    path = folder / "model.onnx"
    torch.onnx.export(model, (ids,), str(path), dynamo=True, input_names=["input_ids"])
    return factory, path


def run_json(capsys, argv) -> dict:
    capsys.readouterr()
    code = main([str(a) for a in [*argv, "--json"]])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The GPT-2, its layer-granular plans over 4 and 2 devices and the torch export of the
    4-stage one."""
    d = tmp_path_factory.mktemp("gpt2")
    factory, model = export_model(d, GPT2_FACTORY, (1, 8))
    (d / "fast.yaml").write_text(FAST_CLUSTER)
    for k in (4, 2):
        argv = ["solve", model, "--granularity", "layer", "-k", k, "--cluster", d / "fast.yaml"]
        argv += ["--time-limit", "10", "--out", d / f"plan{k}.json"]
        assert main([str(a) for a in argv]) == 0
    argv = ["export", model, d / "plan4.json", "--format", "torch", "--out", d / "torch4"]
    assert main([str(a) for a in argv]) == 0
    return d, factory, model


def test_gpt2_four_stages_match_the_unsplit_module(gpt2, capsys):
    d, factory, model = gpt2
    argv = ["run", "--backend", "torch", "--module", f"{factory}:build", model, d / "plan4.json"]
    rec = run_json(capsys, argv)
    written = json.loads((d / "torch4" / "torch_pipeline.json").read_text())
    assert rec["ranks"] == 4 == len(written["stages"])
    assert rec["stages"] == written["stages"]  # the run used the split export writes
    assert rec["kind"] == "pipeline" and rec["training"] is None and rec["gradients"] is None
    assert rec["outputs"]["ok"] and rec["outputs"]["max_abs_diff"] <= 1e-4
    assert rec["ok"]
    assert rec["inputs"] == {"input_ids": [1, 8]}
    assert rec["measured"]["per_microbatch"] > 0 and rec["simulated"]["per_microbatch"] > 0
    assert rec["measured"]["step_seconds"] == pytest.approx(4 * rec["measured"]["per_microbatch"])
    assert rec["link_bandwidth"] > 0


def test_gpt2_training_step_on_two_stages_matches_the_unsplit_gradients(gpt2, capsys):
    d, factory, model = gpt2
    argv = ["run", "--backend", "torch", "--module", f"{factory}:build", model, d / "plan2.json"]
    capsys.readouterr()
    assert main([str(a) for a in [*argv, "--schedule", "1f1b", "--microbatches", "2"]]) == 0
    out = capsys.readouterr().out
    text = " ".join(out.split())
    assert "2 stage processes" in text and "one training step (1f1b)" in text
    assert re.search(r"outputs: max \|split - unsplit\| \S+ \(output 0\), tolerance \S+: OK", text)
    assert re.search(r"gradients: max \|split - unsplit\| (\S+) \(gradient of \S+\), tol", text)
    assert float(re.search(r"gradients: max \|split - unsplit\| (\S+)", text).group(1)) <= 1e-4
    assert re.search(
        r"time per microbatch: measured \S+ ms \(step \S+ ms\), simulated \S+ ms", text
    )


def test_megatron_sharding_runs_with_parallelize_module_on_four_ranks(tmp_path, capsys):
    factory, model = export_model(tmp_path, LLAMA_FACTORY, (2, 8))
    shard = tmp_path / "shard"
    assert main(["shard", str(model), "-k", "4", "--method", "megatron", "--out", str(shard)]) == 0
    assert main(["export", str(model), str(shard / "plan.json"), "--format", "dtensor",
                 "--out", str(tmp_path / "dt")]) == 0  # fmt: skip
    plan = json.loads((tmp_path / "dt" / "dtensor_plan.json").read_text())
    styles = plan["parallelize_plan"]
    for layer in (0, 1):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.up_proj"):
            assert styles[f"model.layers.{layer}.{name}"] == "ColwiseParallel"
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            assert styles[f"model.layers.{layer}.{name}"] == "RowwiseParallel"
    assert styles["model.embed_tokens"] == "RowwiseParallel"
    assert plan["input_layouts"] == {"model.embed_tokens": "Replicate"}
    assert plan["output_layouts"] == {"lm_head": "Replicate"}  # the logits leave whole
    argv = ["run", "--backend", "torch", "--module", f"{factory}:build", model, shard / "plan.json"]
    rec = run_json(capsys, [*argv, "--schedule", "gpipe", "--microbatches", "2"])
    assert rec["kind"] == "tensor-parallel" and rec["ranks"] == 4
    assert rec["outputs"]["ok"] and rec["gradients"]["ok"] and rec["ok"]
    assert rec["outputs"]["max_abs_diff"] <= 1e-4 and rec["gradients"]["max_abs_diff"] <= 1e-4


def test_comparisons_fail_on_tensors_that_differ():
    gen = torch.Generator().manual_seed(3)
    want = [torch.randn(2, 3, generator=gen)]
    assert compare_outputs([want[0].clone()], want).ok
    off = compare_outputs([want[0] + 1e-3], want)
    assert not off.ok and off.where == "output 0"
    assert off.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert not compare_outputs([want[0][:1]], want).ok  # a shape that differs
    # a tied weight held by two stages: its gradient is the sum of both shares
    g = torch.randn(4, generator=gen)
    ref = Reference(
        [],
        [],
        [],
        [],
        {"wte.weight": g},
        {"wte.weight": "wte.weight", "lm_head.weight": "wte.weight"},
    )
    assert compare_grads([{"wte.weight": 0.25 * g}, {"lm_head.weight": 0.75 * g}], ref).ok
    assert not compare_grads([{"wte.weight": 0.25 * g}], ref).ok
    assert compare_grads([{}], ref).where == "gradient of wte.weight missing"


def test_a_factory_that_builds_another_module_is_refused(gpt2, tmp_path, capsys):
    d, factory, model = gpt2
    other = tmp_path / "other.py"
    other.write_text("import torch\n\n\ndef build():\n    return torch.nn.Linear(2, 2)\n")
    argv = ["run", "--backend", "torch", model, d / "plan4.json", "--module"]
    line = assert_refused(capsys, [*argv, f"{other}:build"], ".", watch=[d, tmp_path])
    assert line == (
        f"mtpp: error: --module {other}:build: the module has no submodule transformer.wte (the "
        "plan's module paths come from the model that was exported to ONNX; build the same model)"
    )
    none = tmp_path / "none.py"
    line = assert_refused(capsys, [*argv, f"{none}:build"], ".", watch=d)
    assert line == f"mtpp: error: --module {none}:build: {none} does not exist"
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\n\ndef build():\n    raise RuntimeError('no weights')\n")
    line = assert_refused(capsys, [*argv, f"{broken}:build"], ".", watch=d)
    assert line == (
        f"mtpp: error: --module {broken}:build: the factory failed: RuntimeError: no weights"
    )
