"""Framework outputs of a layer-granular plan: the exact files for a known split of a 4-layer
model (1/2/1 layers), refusals of plans no framework can run, and whole-folder writing."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from solver.backends.frameworks import (
    CLASS_KEY,
    FORMATS,
    SHARD_PLAN_FORMAT,
    dtensor_plan,
    export_dtensor,
    export_framework,
    framework_files,
    joint_files,
    megatron_layout,
    module_stages,
    write_framework,
)
from solver.core.errors import MtppError
from solver.frontends.onnx.load import read_model
from solver.frontends.onnx.modules import (
    ModuleLayout,
    cost_node_modules,
    module_layout,
    read_layout,
)
from solver.frontends.onnx.reader import load_onnx
from tests.pipeline.test_granularity import layered_model

UNITS = ("embed", "layers.0", "layers.1", "layers.2", "layers.3", "head")
BLOCK_OF_UNIT = {"embed": 0, "layers.0": 0, "layers.1": 1, "layers.2": 1, "layers.3": 2, "head": 2}


@pytest.fixture(scope="module")
def stages_121(tmp_path_factory):
    """The stages of a plan of the 4-layer model: embed + layers.0 | layers.1, layers.2 |
    layers.3 + head (the plan's blocks 0, 2, 3; block 1 empty)."""
    path = tmp_path_factory.mktemp("m") / "m.onnx"
    save(layered_model("dynamo"), str(path))
    g = load_onnx(path)
    layout = module_layout(cost_node_modules(read_model(path), g), "m.onnx")
    block = {0: 0, 1: 2, 2: 3}
    a = np.array([block[BLOCK_OF_UNIT[layout.unit_of(i)]] for i in range(g.n)])
    return module_stages(layout, a, "plan.json")


def test_stages_skip_empty_blocks(stages_121):
    assert stages_121.stages == (
        ("embed", "layers.0"),
        ("layers.1", "layers.2"),
        ("layers.3", "head"),
    )
    assert stages_121.block_counts == [1, 2, 1]


def test_torch_split_spec_and_stages(stages_121):
    files = framework_files("torch", stages_121, "plan.json")
    assert json.loads(files["torch_pipeline.json"]) == {
        "split_spec": {"layers.1": "BEGINNING", "layers.3": "BEGINNING"},
        "stages": [["embed", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "head"]],
    }
    assert "pipeline(model, mb_args=" in files["README.md"]
    assert "pipe.num_stages == 3" in files["README.md"]


def test_torchtitan_module_fqns(stages_121):
    files = framework_files("torchtitan", stages_121, "plan.json")
    fqns = [["embed", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "head"]]
    assert json.loads(files["torchtitan_pipeline.json"]) == {"module_fqns_per_model_part": fqns}
    assert f"module_fqns_per_model_part = {json.dumps(fqns)}" in files["README.md"]


def test_megatron_layout_is_the_last_line(stages_121):
    text = framework_files("megatron", stages_121, "plan.json")["megatron_layout.txt"]
    lines = text.splitlines()
    assert lines[-1] == "Et|t*2|tL"
    assert (
        "# the same split: --decoder-first-pipeline-num-layers 1 "
        "--decoder-last-pipeline-num-layers 1"
    ) in lines


def test_megatron_layout_parses_back_to_the_stages(stages_121):
    """Unroll the layout as Megatron's parser does (``x*n`` -> n xs, ``|`` between stages)."""
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), "Et|t*2|tL")
    assert [s.count("t") for s in text.split("|")] == stages_121.block_counts
    assert megatron_layout(stages_121, "plan.json") == "Et|t*2|tL"


def test_deepspeed_parts_and_vllm_partition(stages_121):
    ds = json.loads(framework_files("deepspeed", stages_121, "p")["deepspeed_partition.json"])
    assert ds == {"layers": list(UNITS), "parts": [0, 2, 4, 6]}
    vllm = framework_files("vllm", stages_121, "p")
    assert vllm["vllm_pp_layer_partition.txt"] == "1,2,1\n"
    assert (
        "VLLM_PP_LAYER_PARTITION=1,2,1 vllm serve MODEL --pipeline-parallel-size 3"
        in (vllm["README.md"])
    )


def _layout() -> ModuleLayout:
    """Two nodes per unit."""
    return ModuleLayout(UNITS, tuple(i // 2 for i in range(12)), UNITS[1:5], "layers")


def test_plan_cutting_inside_a_module_is_refused():
    a = np.array([0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2])  # layers.0 spans blocks 0 and 1
    with pytest.raises(MtppError) as e:
        module_stages(_layout(), a, "plan.json")
    assert str(e.value) == (
        "plan.json: the plan cuts inside module layers.0 (blocks 0 and 1); solve with "
        "--granularity layer for a plan a framework can run"
    )


def test_plan_against_program_order_is_refused():
    a = np.array([0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 2, 2])
    with pytest.raises(MtppError, match=r"runs module layers\.1 \(block 0\) before layers\.0"):
        module_stages(_layout(), a, "plan.json")


def test_megatron_layouts_of_uneven_splits():
    a = np.array([0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2])  # embed alone in stage 0
    st = module_stages(_layout(), a, "plan.json")
    assert framework_files("vllm", st, "p")["vllm_pp_layer_partition.txt"] == "0,3,1\n"
    assert megatron_layout(st, "p") == "E|t*3|tL"
    text = framework_files("megatron", st, "p")["megatron_layout.txt"]
    assert "--decoder-first-pipeline-num-layers" not in text  # 0 layers on the first stage
    b = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    st2 = module_stages(_layout(), b, "plan.json")
    assert megatron_layout(st2, "p") == "Et|t*3L"
    c = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2])
    st3 = module_stages(_layout(), c, "plan.json")
    assert megatron_layout(st3, "p") == "E|t*4|L"


def test_modules_the_layer_count_formats_move_are_listed():
    units = ("wte", "wpe", "h.0", "h.1", "ln_f", "lm_head")
    layout = ModuleLayout(units, (0, 1, 2, 3, 4, 5), units[2:4], "h")
    st = module_stages(layout, np.array([0, 1, 1, 1, 1, 2]), "plan.json")
    assert framework_files("vllm", st, "p")["vllm_pp_layer_partition.txt"] == "0,2,0\n"
    text = framework_files("megatron", st, "plan.json")["megatron_layout.txt"].splitlines()
    assert text[-1] == "E|t*2|L"
    note = (
        "Megatron places these where it keeps them, unlike the plan: wpe (the plan: stage 1), "
        "ln_f (the plan: stage 1)"
    )
    assert f"# {note}" in text
    assert "vLLM places these where it keeps them" in framework_files("vllm", st, "p")["README.md"]


def test_layer_count_formats_need_repeated_blocks():
    layout = ModuleLayout(("a", "b"), (0, 1), (), "")
    st = module_stages(layout, np.array([0, 1]), "plan.json")
    with pytest.raises(MtppError) as e:
        framework_files("megatron", st, "plan.json")
    assert str(e.value) == (
        "plan.json: the model has no repeated blocks (a module list of layers), and Megatron's "
        "layout counts decoder layers; use --format torch"
    )
    with pytest.raises(MtppError, match="VLLM_PP_LAYER_PARTITION counts decoder layers"):
        framework_files("vllm", st, "plan.json")
    assert json.loads(framework_files("torch", st, "p")["torch_pipeline.json"])["split_spec"] == {
        "b": "BEGINNING"
    }


def test_unknown_format_is_refused(stages_121):
    with pytest.raises(MtppError, match=r"--format 'onnx2': choose one of torch, torchtitan"):
        framework_files("onnx2", stages_121, "p")


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_framework_writes_the_folder_whole(tmp_path, stages_121, fmt):
    out = tmp_path / "out"
    rep = write_framework(fmt, stages_121, out, "plan.json")
    assert sorted(p.name for p in out.iterdir()) == sorted(rep.files)
    assert "README.md" in rep.files
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    (out / "keep.txt").write_text("mine")
    with pytest.raises(MtppError, match="folder exists and is not empty"):
        write_framework(fmt, stages_121, out, "plan.json")
    assert (out / "keep.txt").read_text() == "mine"
    write_framework(fmt, stages_121, out, "plan.json", force=True)
    assert not (out / "keep.txt").exists()


def test_export_framework_from_the_model_file(tmp_path):
    path = tmp_path / "m.onnx"
    save(layered_model("legacy"), str(path))
    g = load_onnx(path)
    layout = read_layout(path, g)
    a = np.array([BLOCK_OF_UNIT[layout.unit_of(i)] for i in range(g.n)])
    rep = export_framework("vllm", path, g, a, tmp_path / "out", tmp_path / "plan.json")
    assert rep.files == ("vllm_pp_layer_partition.txt", "README.md")
    assert (tmp_path / "out" / "vllm_pp_layer_partition.txt").read_text() == "1,2,1\n"
    with pytest.raises(MtppError, match="--format 'onnx': choose one of torch"):
        export_framework("onnx", path, g, a, tmp_path / "out2", tmp_path / "plan.json")
    assert not (tmp_path / "out2").exists()


# ---------------------------------------------------------------------- DTensor
LINEAR = "torch.nn.modules.linear.Linear"
# (op, inputs, output, module, class of the module, weight shapes)
MLP_NODES = [
    ("Gather", ["embed.weight", "ids"], "e", "embed", "torch.nn.modules.sparse.Embedding"),
    ("LayerNormalization", ["e", "ln.w", "ln.b"], "n0", "layers.0.norm",
     "torch.nn.modules.normalization.LayerNorm"),
    ("MatMul", ["n0", "fc.w"], "f0", "layers.0.fc", LINEAR),
    ("Relu", ["f0"], "r0", "layers.0.act", "torch.nn.modules.activation.ReLU"),
    ("MatMul", ["r0", "proj.w"], "p0", "layers.0.proj", LINEAR),
    ("Add", ["e", "p0"], "h1", "layers.0", "model.Block"),
    ("MatMul", ["h1", "head.w"], "y", "head", LINEAR),
]  # fmt: skip
MLP_WEIGHTS = {"embed.weight": (16, 8), "ln.w": (8,), "ln.b": (8,), "fc.w": (8, 16),
               "proj.w": (16, 8), "head.w": (8, 16)}  # fmt: skip


def dynamo_mlp_model():
    """An embedding, a Megatron MLP block (norm, fc, relu, proj, residual) and a head, with
    the dynamo exporter's name scopes and module classes on every node."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in MLP_WEIGHTS.items()
    ]
    nodes = []
    for i, (op, ins, out, module, cls) in enumerate(MLP_NODES):
        node = helper.make_node(op, ins, [out], name=f"node_{out}")
        parts = module.split(".")
        scopes = ["", *(".".join(parts[: j + 1]) for j in range(len(parts))), f"{op}_{i}"]
        classes = ["model.Net", *(["model.Block"] * (len(parts) - 1)), cls, f"aten.{op}"]
        helper.set_metadata_props(
            node,
            {"pkg.torch.onnx.name_scopes": repr(scopes), CLASS_KEY: repr(classes)},
        )
        nodes.append(node)
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 16])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MEGATRON = {
    "node_e": [[4, 1], [1, 1]],  # vocabulary split: RowwiseParallel, indices whole
    "node_n0": [[1, 1, 1], [1], [1]],
    "node_f0": [[1, 1, 1], [1, 4]],  # column split
    "node_r0": [[1, 1, 4]],
    "node_p0": [[1, 1, 4], [4, 1]],  # row split
    "node_h1": [[1, 1, 1], [1, 1, 1]],
    "node_y": [[1, 1, 1], [1, 4]],  # column split of the graph output: gathered at the end
}
LAST_DIM_SPLIT = {"shape": [2, 4, 16], "device_matrix": [1, 1, 4], "tensor_map": [-1, -1, 0],
                  "partial": []}  # fmt: skip


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    save(dynamo_mlp_model(), str(path))
    return path


def shard_plan(strategies: dict, layouts: dict | None = None) -> dict:
    return {"format": SHARD_PLAN_FORMAT, "mesh": {"shape": [4]}, "strategies": strategies,
            "layouts": layouts or {}}  # fmt: skip


def test_megatron_strategies_map_onto_dtensor_styles(mlp_path):
    plan = dtensor_plan(mlp_path, shard_plan(MEGATRON, {"r0": LAST_DIM_SPLIT}), "plan.json")
    assert plan.to_dict() == {
        "mesh": [4],
        "ranks": 4,
        "parallelize_plan": {
            "embed": "RowwiseParallel",
            "layers.0.fc": "ColwiseParallel",
            "layers.0.proj": "RowwiseParallel",
            "head": "ColwiseParallel",
        },
        "input_layouts": {"embed": "Replicate"},
        "output_layouts": {"head": "Replicate"},
        "replicate": ["layers.0.norm"],
        "not_mapped": [],
        "follows": [{"module": "layers.0.act", "reason": "1 sharded operator without weights"}],
    }


def test_a_rowwise_module_whose_input_arrives_whole_gathers_nothing_but_slices(mlp_path):
    whole = {**LAST_DIM_SPLIT, "tensor_map": [-1, -1, -1]}
    plan = dtensor_plan(mlp_path, shard_plan(MEGATRON, {"r0": whole}), "plan.json")
    assert plan.input_layouts == {"embed": "Replicate", "layers.0.proj": "Replicate"}


def test_strategies_no_style_expresses_are_listed_with_the_reason(mlp_path):
    strategies = {**MEGATRON, "node_y": [[1, 1, 1], [2, 2]], "node_f0": [[4, 1, 1], [1, 1]]}
    strategies["node_n0"] = [[1, 4, 1], [1], [1]]  # sequence split: SequenceParallel
    plan = dtensor_plan(mlp_path, shard_plan(strategies), "plan.json")
    assert plan.parallelize_plan == {
        "embed": "RowwiseParallel",
        "layers.0.norm": "SequenceParallel",
        "layers.0.proj": "RowwiseParallel",
    }
    assert [(n.module, n.reason) for n in plan.not_mapped] == [
        ("layers.0.fc", "Linear: its input is split [4, 1, 1] (batch or sequence): no module "
         "style shards that"),
        ("head", "Linear: its weight is split [2, 2] over 4 devices: neither by columns nor by "
         "rows"),
    ]  # fmt: skip


def test_dtensor_refuses_a_plan_that_is_not_a_sharding(mlp_path, tmp_path):
    with pytest.raises(MtppError, match=r"plan.json: --format dtensor takes an operator-shard"):
        dtensor_plan(mlp_path, {"format": "mtpp-plan"}, "plan.json")
    with pytest.raises(MtppError, match="no operator of the plan is a node of the model"):
        dtensor_plan(mlp_path, shard_plan({"elsewhere": [[1]]}), "plan.json")


def test_export_dtensor_writes_the_plan_and_the_call(mlp_path, tmp_path):
    rep = export_dtensor(mlp_path, shard_plan(MEGATRON), tmp_path / "dt", tmp_path / "p.json")
    assert rep.files == ("dtensor_plan.json", "README.md")
    data = json.loads((tmp_path / "dt" / "dtensor_plan.json").read_text())
    assert data["parallelize_plan"]["layers.0.fc"] == "ColwiseParallel"
    readme = (tmp_path / "dt" / "README.md").read_text()
    assert "parallelize_module(" in readme and 'init_device_mesh("cuda", (4,))' in readme


def test_joint_plan_gives_its_layout_and_both_forms(mlp_path, tmp_path):
    tensor_stage = {
        "devices": [0, 1],
        "mesh": {"shape": [2]},
        "ops": ["node_e", "node_n0", "node_f0", "node_r0", "node_p0", "node_h1"],
        "strategies": {"node_f0": [[1, 1, 1], [1, 2]], "node_p0": [[1, 1, 2], [2, 1]],
                       "node_r0": [[1, 1, 2]], "node_e": [[1, 1], [1, 1]]},
    }  # fmt: skip
    data_stage = {"devices": [2, 3], "mesh": {"shape": [2]}, "ops": ["node_y"],
                  "strategies": {"node_y": [[2, 1, 1], [1, 1]]}}  # fmt: skip
    joint = {"format": "mtpp-joint-plan", "stages": [tensor_stage, data_stage]}
    files = joint_files(mlp_path, load_onnx(mlp_path), joint, "joint.json")
    assert json.loads(files["joint_layout.json"]) == {
        "pipeline": 2,
        "stages": [
            {"stage": 0, "devices": [0, 1], "mesh": [2], "data": 1, "tensor": 2},
            {"stage": 1, "devices": [2, 3], "mesh": [2], "data": 2, "tensor": 1},
        ],
        "torch_pipeline": "torch_pipeline.json",
        "torch_pipeline_refused": None,
    }
    assert json.loads(files["torch_pipeline.json"]) == {
        "split_spec": {"head": "BEGINNING"},
        "stages": [["embed", "layers"], ["head"]],
    }
    first = json.loads(files["stage0_dtensor_plan.json"])
    assert first["parallelize_plan"] == {
        "layers.0.fc": "ColwiseParallel",
        "layers.0.proj": "RowwiseParallel",
    }
    second = json.loads(files["stage1_dtensor_plan.json"])
    assert second["parallelize_plan"] == {} and second["replicate"] == ["head"]  # data parallel
    assert "| 1 | [2, 3] | 2 | 1 | 0 | 0 |" in files["README.md"]
