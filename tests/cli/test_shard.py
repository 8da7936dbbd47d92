"""The sharded program executed on emulated devices (--verify), and the `mtpp shard` command."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import sharding_examples as examples
from solver.cli import main
from solver.spmd.mesh import Layout, Mesh
from solver.spmd.model import from_proto
from solver.spmd.program import Planner, evaluate
from solver.spmd.propagate import propagate
from solver.spmd.redistribute import Redistribution, Step
from tests.badinput import assert_refused
from tests.conftest import ROOT
from tests.spmd.test_rules_program import CLUSTER


def run(model, conf, mesh=(8,)):
    from solver.backends.verify import verify

    sm = from_proto(model, {})
    pl = Planner(sm, Mesh(mesh, (1e9,) * len(mesh), (0.0,) * len(mesh)), CLUSTER)
    prog = evaluate(pl, propagate(pl, conf))
    return pl, prog, verify(pl, prog, seed=3)


@pytest.mark.parametrize(
    "name, conf, mesh",
    [
        ("ffn", {"dense1.matmul": ((2, 1), (1, 4))}, (8,)),
        ("mlp", {"fc1": ((1, 8), (1, 8), (1,))}, (8,)),  # Gemm contraction split + bias once
        ("convnet", {"conv2": ((1, 4, 1, 1), (2, 4, 1, 1))}, (8,)),  # input channels split
        ("convnet", {"conv1": ((2, 1, 1, 1), (4, 1, 1, 1), (4,))}, (2, 4)),
        ("transformer", {"embed": ((8, 1), (1, 1))}, (8,)),  # vocabulary split Gather
        (
            "transformer",
            {"l0.q.matmul": ((1, 1, 1), (1, 8)), "l1.ffn2.matmul": ((2, 1, 4), (4, 1))},
            (2, 4),
        ),
    ],
)
def test_verify_sharded_program_equals_the_model(name, conf, mesh):
    model = {
        "ffn": examples.ffn,
        "mlp": examples.mlp,
        "convnet": examples.convnet,
        "transformer": lambda: examples.transformer(layers=2),
    }[name]()
    pl, prog, v = run(model, conf, mesh)
    assert v["ok"], v
    assert v["max_abs_diff"] < 1e-4
    assert prog.comm_bytes_per_device > 0  # a real split, not a replicated run
    (out,) = v["outputs"].values()
    ref_shape = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert out["shape"] == ref_shape


def test_verify_split_reduce_mean():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 1])
    w = numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((16,)).astype(np.float32), "w"
    )
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["m"], name="scale"),
        helper.make_node("ReduceMean", ["m"], ["y"], name="mean", axes=[1], keepdims=1),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    g = helper.make_graph(nodes, "g", [x], [z], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    pl, prog, v = run(m, {"mean": ((2, 4),)})
    assert prog.shardings[1].out_layouts[0].partial  # the split axis leaves partial means
    assert v["ok"], v


def _tamper(prog, kind):
    """A wrong program: one redistribution replaced by a plain slice (dropped reduction) or by a
    slice to the wrong blocks."""
    for key, r in prog.redists.items():
        if not r.steps:
            continue
        src, dst = r.src, r.dst
        if kind == "drop-reduction" and src.partial:
            plain = Layout(src.shape, src.device_matrix, src.dims)
            step = Step("Slice", None, plain, dst, 0.0, 0.0)
            prog.redists[key] = Redistribution(src, dst, (step,))
            return True
    return False


def test_verify_fails_on_a_dropped_reduction():
    pl, prog, v = run(examples.ffn(), {"dense1.matmul": ((2, 1), (1, 4))})
    assert v["ok"]
    assert _tamper(prog, "drop-reduction")
    from solver.backends.verify import verify

    bad = verify(pl, prog, seed=3)
    assert not bad["ok"] and bad["max_abs_diff"] > 1e-2


def test_verify_fails_on_a_wrong_slice(monkeypatch):
    from solver.backends.verify import verify
    from solver.spmd import collectives

    conf = {"dense1.matmul": ((1, 1), (1, 1)), "dense2.matmul": ((1, 8), (8, 1))}
    pl, prog, v = run(examples.ffn(), conf)
    assert v["ok"]
    kinds = [s.kind for _, r in prog.all_redists() for s in r.steps]
    assert "Slice" in kinds
    real = collectives.apply_step

    def shifted(step, bufs):  # every device keeps its neighbour's slice (same shapes)
        out = real(step, bufs)
        return out[1:] + out[:1] if step.kind == "Slice" else out

    monkeypatch.setattr(collectives, "apply_step", shifted)
    bad = verify(pl, prog, seed=3)
    assert not bad["ok"] and bad["max_abs_diff"] > 1e-2


def test_verify_reports_a_program_that_cannot_run():
    """Shards of the wrong shape make a local operator fail: verify says so, no traceback."""
    from solver.backends.verify import verify
    from solver.spmd.redistribute import plan_redistribution

    pl, prog, _ = run(examples.ffn(), {"dense2.matmul": ((1, 8), (8, 1))})
    (key,) = [k for k, r in prog.redists.items() if r.steps]
    r = prog.redists[key]
    wrong = Layout(r.dst.shape, (8,), ((), ()))  # whole tensors where shards are expected
    prog.redists[key] = dataclasses.replace(
        plan_redistribution(r.src, wrong, 4, pl.mesh), dst=r.dst
    )
    bad = verify(pl, prog, seed=3)
    assert not bad["ok"] and "on device 0" in bad["error"]


# ---------------------------------------------------------------------- the command
@pytest.fixture
def ffn_files(tmp_path):
    onnx.save(examples.ffn(), tmp_path / "ffn.onnx")
    (tmp_path / "ffn.yaml").write_text("dense1.matmul: [[2, 1], [1, 4]]\n")
    return tmp_path


def test_cli_json_fields_verify_and_out_round_trip(ffn_files, capsys):
    d = ffn_files
    code = main(
        [
            "shard",
            str(d / "ffn.onnx"),
            "--devices",
            "8",
            "--config",
            str(d / "ffn.yaml"),
            "--verify",
            "--json",
            "--out",
            str(d / "out"),
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in (
        "mesh",
        "method",
        "status",
        "objective",
        "strategies",
        "layouts",
        "redistributions",
        "collectives",
        "comm_bytes_per_device",
        "max_memory_per_device",
        "verify",
    ):
        assert key in data
    assert data["status"] == "FEASIBLE" and data["method"] == "propagate"
    assert data["strategies"]["dense2.matmul"] == [[2, 4], [4, 1]]
    assert data["layouts"]["dense1.matmul_out"]["device_matrix"] == [2, 1, 4]
    assert data["layouts"]["dense1.matmul_out"]["tensor_map"] == [2, 0]
    (red,) = data["redistributions"]
    assert red["tensor"] == "dense2.matmul_out" and red["ops"][0]["op"] == "ReduceScatter"
    assert red["bytes_per_device"] == 6144
    assert data["collectives"] == {"ReduceScatter": 1}
    assert data["verify"]["ok"] and data["verify"]["max_abs_diff"] < 1e-4
    assert sorted(p.name for p in (d / "out").iterdir()) == [
        "annotated.onnx",
        "plan.json",
        "strategies.yaml",
    ]
    assert json.loads((d / "out/plan.json").read_text())["strategies"] == data["strategies"]
    # strategies.yaml loads back with --config to the same plan
    main(
        [
            "shard",
            str(d / "ffn.onnx"),
            "--devices",
            "8",
            "--config",
            str(d / "out/strategies.yaml"),
            "--json",
        ]
    )
    again = json.loads(capsys.readouterr().out)
    assert again["strategies"] == data["strategies"] and again["objective"] == data["objective"]
    # annotated.onnx carries every strategy: no config needed
    main(["shard", str(d / "out/annotated.onnx"), "--devices", "8", "--json"])
    annotated = json.loads(capsys.readouterr().out)
    assert annotated["strategies"] == data["strategies"]
    assert len(annotated["configured"]) == 5


def test_cli_human_table(ffn_files, capsys):
    d = ffn_files
    assert (
        main(
            [
                "shard",
                str(d / "ffn.onnx"),
                "-k",
                "8",
                "--mesh",
                "2x4",
                "--config",
                str(d / "ffn.yaml"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "((2, 4), (4, 1))" in out and "ReduceScatter x1" in out and "memory per device" in out


def test_cli_plan_over_the_memory_limit_is_refused(ffn_files, capsys):
    """A propagate plan over --memory ends like the exact one: exit 2, one line naming the memory
    it needs (weights + activation peak) and the limit."""
    d = ffn_files
    argv = ["shard", str(d / "ffn.onnx"), "-k", "8", "--config", str(d / "ffn.yaml")]
    assert_refused(
        capsys,
        [*argv, "--memory", "1KiB", "--json"],
        r"the propagate plan needs .* per device \(weights .* \+ activation peak .*\) but the "
        r"memory limit is 1 KiB \(1024 bytes\)",
        watch=d,
    )


@pytest.mark.parametrize(
    "yaml_text, args, match",
    [
        ("dense1.matmul: [[3, 1], [1, 1]]\n", [], "does not divide the dim of size 64"),
        ("dense1.matmul: [[2, 1]]\n", [], "1 tuple.*2 data input"),
        (
            "dense1.matmull: [[2, 1], [1, 4]]\n",
            [],
            "no node named 'dense1.matmull'.*did you mean 'dense1.matmul'",
        ),
        ("dense1.matmul: [[2, 1], [1, 4]]\n", ["--mesh", "2x3"], "multiplies to 6 devices"),
        ("dense1.matmul: [[4, 1], [1, 4]]\n", ["-k", "6"], "does not divide the 6 devices"),
        ("dense1.matmul: abc\n", [], "not a strategy"),
        ("dense1.matmul: [[2, 1], [x]]\n", [], "list of integers"),
        ("- a\n", [], "one 'node name"),
    ],
)
def test_cli_bad_input(tmp_path, capsys, yaml_text, args, match):
    onnx.save(examples.ffn(), tmp_path / "ffn.onnx")
    (tmp_path / "c.yaml").write_text(yaml_text)
    argv = ["shard", tmp_path / "ffn.onnx", "--config", tmp_path / "c.yaml"]
    if "-k" not in args:
        argv += ["-k", "8"]
    assert_refused(capsys, argv + args, match, watch=tmp_path)


def test_cli_refuses_a_non_empty_out_and_a_non_onnx_model(ffn_files, capsys):
    d = ffn_files
    (d / "full").mkdir()
    (d / "full/keep.txt").write_text("mine")
    assert_refused(
        capsys, ["shard", d / "ffn.onnx", "-k", "8", "--out", d / "full"], "not empty", watch=d
    )
    assert_refused(capsys, ["shard", d / "ffn.yaml", "-k", "8"], "needs an ONNX model", watch=d)
    assert_refused(capsys, ["shard", d / "nope.onnx", "-k", "8"], "no such ONNX file", watch=d)


def _ops_zoo():
    """Transpose, Split, Concat, Slice, Greater, Where, Neg, Cast, Unsqueeze, Squeeze, Flatten,
    ReduceSum, a tensor fed twice (Mul(x, x)) and CumSum (no rule: replicated)."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)  # noqa: E731
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    n = helper.make_node
    nodes = [
        n("Transpose", ["x"], ["t"], name="transpose", perm=[0, 2, 1]),  # [8, 32, 16]
        n("Split", ["t", "halves"], ["a", "b"], name="split", axis=1),  # 2 x [8, 16, 16]
        n("Concat", ["b", "a"], ["c"], name="concat", axis=2),  # [8, 16, 32]
        n("Slice", ["c", "st", "en", "ax"], ["s"], name="slice"),  # [8, 16, 24]
        n("Mul", ["s", "s"], ["sq"], name="square"),
        n("Greater", ["s", "zero"], ["pos"], name="greater"),
        n("Neg", ["sq"], ["neg"], name="neg"),
        n("Where", ["pos", "sq", "neg"], ["w"], name="where"),
        n("Cast", ["w"], ["w64"], name="cast", to=TensorProto.DOUBLE),
        n("Cast", ["w64"], ["w32"], name="cast_back", to=TensorProto.FLOAT),
        n("Unsqueeze", ["w32", "ax0"], ["u"], name="unsqueeze"),
        n("Squeeze", ["u", "ax0"], ["q"], name="squeeze"),
        n("CumSum", ["q", "one"], ["cs"], name="cumsum"),
        n("Flatten", ["cs"], ["f"], name="flatten", axis=1),  # [8, 384]
        n("ReduceSum", ["f", "one"], ["y"], name="reduce", keepdims=1),  # [8, 1]
    ]
    inits = [
        i64("halves", [16, 16]),
        i64("st", [4]),
        i64("en", [28]),
        i64("ax", [2]),
        i64("ax0", [0]),
        i64("one", [1]),
        zero,
    ]
    g = helper.make_graph(
        nodes,
        "zoo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 1])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize(
    "conf",
    [
        {"transpose": ((2, 4, 1),)},
        {"concat": ((4, 2, 1), (4, 2, 1)), "reduce": ((1, 8),)},  # ReduceSum over a split axis
        {"where": ((1, 8, 1), (1, 8, 1), (1, 8, 1))},
    ],
)
def test_verify_view_and_data_movement_operators(conf):
    pl, prog, v = run(_ops_zoo(), conf)
    assert pl.replicated_ops == ["CumSum"]
    assert v["ok"], v


def test_cli_dynamic_dims_and_replicated_warning(tmp_path, capsys):
    m = _ops_zoo()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(m, tmp_path / "zoo.onnx")
    (tmp_path / "c.yaml").write_text("transpose: [[4, 2, 1]]\n")
    code = main(
        [
            "shard",
            str(tmp_path / "zoo.onnx"),
            "-k",
            "8",
            "--dim",
            "batch=8",
            "--config",
            str(tmp_path / "c.yaml"),
            "--verify",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert code == 0 and data["verify"]["ok"]
    assert data["layouts"]["x"]["shape"] == [8, 16, 32]
    assert err.strip() == "mtpp: warning: no sharding rule for CumSum; they run replicated"
    assert_refused(
        capsys,
        [
            "shard",
            tmp_path / "zoo.onnx",
            "-k",
            "8",
            "--dim",
            "batch=6",
            "--config",
            tmp_path / "c.yaml",
        ],
        "does not divide",
        watch=tmp_path,
    )


def test_cli_force_replaces_only_when_complete(ffn_files, capsys):
    d = ffn_files
    (d / "out").mkdir()
    (d / "out/old.txt").write_text("old")
    argv = [
        "shard",
        str(d / "ffn.onnx"),
        "-k",
        "8",
        "--config",
        str(d / "ffn.yaml"),
        "--out",
        str(d / "out"),
        "--verify",
    ]
    assert main([*argv, "--force"]) == 0
    assert "verify: ok" in capsys.readouterr().out
    assert sorted(p.name for p in (d / "out").iterdir()) == [
        "annotated.onnx",
        "plan.json",
        "strategies.yaml",
    ]
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []  # no temporaries left
    annotated = onnx.load(str(d / "out/annotated.onnx"))
    onnx.checker.check_model(annotated)
    props = {n.name: {e.key: e.value for e in n.metadata_props} for n in annotated.graph.node}
    assert props["dense2.add"] == {"mtpp_strategy": "((2, 4), (4))"}


@pytest.mark.parametrize("name", ["resnet", "decoder"])
def test_cli_verify_on_the_bundled_small_models(name, capsys):
    """Real exports (BatchNormalization, shape arithmetic folded away) verify on 4 devices."""
    code = main(["shard", str(ROOT / f"models/small/{name}.onnx"), "-k", "4", "--verify", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["verify"]["ok"], data["verify"]
    assert "BatchNormalization" not in data["replicated_op_types"]
    assert data["comm_bytes_per_device"] > 0


def test_plan_json_is_strict_json_like_stdout(tmp_path):
    """plan.json goes through json_safe as --json does: an infinity is null (never the
    non-JSON 'Infinity'), a numpy integer stays an integer."""
    from solver.backends.export_spmd import write_out

    sm = from_proto(examples.ffn(), {})
    plan = {"lower_bound": float("inf"), "gap": float("nan"), "count": np.int64(3)}
    write_out(tmp_path / "out", sm, {}, plan)
    text = (tmp_path / "out/plan.json").read_text()
    assert json.loads(text) == {"lower_bound": None, "gap": None, "count": 3}
    assert "Infinity" not in text and "NaN" not in text and '"count": 3\n' in text


# ------------------------------------------------- external weights, huge dims, empty --out
def _external_ffn(folder, location="w.bin"):
    """examples.ffn (random weights) saved with every weight in one external file."""
    onnx.save_model(
        examples.ffn(),
        folder / "e.onnx",
        save_as_external_data=True,
        location=location,
        size_threshold=0,
    )
    return folder / "e.onnx"


def _set_external(path, key, value):
    """Rewrite one external-data field of the model's first external initializer."""
    m = onnx.load(str(path), load_external_data=False)
    t = next(t for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    for e in t.external_data:
        if e.key == key:
            e.value = value
    onnx.save(m, path)


def test_cli_external_weights_load_and_verify(tmp_path, capsys):
    model = _external_ffn(tmp_path)
    code = main(["shard", str(model), "-k", "8", "--verify", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["verify"]["ok"]


@pytest.mark.parametrize(
    "damage, match",
    [
        ("truncate", r"^mtpp: error: tensor '.+': external data file 'w.bin' is too short"),
        ("empty", r"^mtpp: error: tensor '.+': external data (file 'w.bin' is too short|offset)"),
        ("offset", r"^mtpp: error: tensor '.+': external data offset 999999 is past the end"),
        ("missing", r"^mtpp: error: tensor '.+': its external data file 'w.bin' is missing"),
    ],
)
def test_cli_broken_external_weights_are_refused(tmp_path, capsys, damage, match):
    model = _external_ffn(tmp_path)
    data = tmp_path / "w.bin"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    elif damage == "empty":
        data.write_bytes(b"")
    elif damage == "offset":
        _set_external(model, "offset", "999999")
    else:
        data.unlink()
    assert_refused(capsys, ["shard", model, "-k", "8"], match, watch=tmp_path)
    assert_refused(capsys, ["shard", model, "-k", "8", "--verify"], match, watch=tmp_path)


@pytest.mark.parametrize("location", ["../../../../etc/passwd", "/dev/zero", "../w.bin"])
def test_cli_external_weights_outside_the_folder_are_refused(tmp_path, capsys, location):
    (tmp_path / "m").mkdir()
    model = _external_ffn(tmp_path / "m")
    (tmp_path / "w.bin").write_bytes((tmp_path / "m/w.bin").read_bytes())  # a valid copy
    _set_external(model, "location", location)
    assert_refused(
        capsys,
        ["shard", model, "-k", "8", "--verify"],
        r"^mtpp: error: tensor '.+' keeps its data at .+, outside the model's folder; refusing",
        watch=tmp_path,
    )


def test_cli_verify_with_inputs_no_machine_can_hold_is_refused(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])
    w = numpy_helper.from_array(np.random.default_rng(1).random((4, 4), np.float32), "W")
    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")
    onnx.save(
        helper.make_model(helper.make_graph([node], "dyn", [x], [y], [w])), tmp_path / "d.onnx"
    )
    big = ["--dim", "batch=2147483647", "--dim", "seq=2147483647"]
    assert_refused(
        capsys,
        ["shard", tmp_path / "d.onnx", *big, "-k", "2", "--verify"],
        r"^mtpp: error: input 'x' of shape \[2147483647, 2147483647, 4\] would take .+ more than "
        r"any machine can hold; use smaller --dim values$",
        watch=tmp_path,
    )
    small = ["--dim", "batch=2", "--dim", "seq=3"]
    code = main(["shard", str(tmp_path / "d.onnx"), *small, "-k", "2", "--verify", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["verify"]["ok"]


def test_cli_out_must_name_a_folder_that_is_no_input(tmp_path, capsys):
    model = _external_ffn(tmp_path)
    assert_refused(
        capsys,
        ["shard", model, "-k", "8", "--out", ""],
        r"^mtpp: error: the --out path is empty; give a file or folder name$",
        watch=tmp_path,
    )
    assert_refused(
        capsys,
        ["shard", model, "-k", "8", "--out", "  "],
        r"the --out path is empty",
        watch=tmp_path,
    )
    for inp in (model, tmp_path / "w.bin"):
        assert_refused(
            capsys,
            ["shard", model, "-k", "8", "--out", inp, "--force"],
            r"the --out folder would replace an input",
            watch=tmp_path,
        )


@pytest.mark.parametrize(
    "cluster, mesh, axis, fit",
    [("dgx-a100-x2", "4x4", 0, "2x8"), ("ipu-pod16", "2x8", 1, "4x4")],
)
def test_mesh_that_does_not_fit_the_groups_is_refused(cluster, mesh, axis, fit, tmp_path, capsys):
    """A multi-axis mesh one of whose axes joins devices partly inside a group and partly across
    groups cannot be priced with one link per axis: one line naming the axis and a fitting mesh.
    The fitting mesh and the 1-D mesh over all devices are accepted."""
    from solver.core.cluster import load_cluster
    from solver.spmd.mesh import mesh_on

    model = tmp_path / "ffn.onnx"
    onnx.save(examples.ffn(), model)
    match = (
        rf"mesh {mesh} does not fit the groups of cluster '{cluster}': axis {axis} .* e\.g\. {fit}"
    )
    assert_refused(
        capsys, ["shard", str(model), "--cluster", cluster, "--mesh", mesh], match, tmp_path
    )
    c = load_cluster(cluster, None)
    shape = tuple(int(x) for x in fit.split("x"))
    good = mesh_on(c, range(16), shape)
    assert good.bandwidth[0] < good.bandwidth[1]  # across the groups, then inside one
    assert mesh_on(c, range(16), (16,)).bandwidth == (min(good.bandwidth),)


def test_mesh_axis_inside_groups_with_different_links_is_priced_at_the_slowest():
    """Groups whose inside links differ (100 and 50 GB/s): a 2x2 mesh has axis 0 across the
    groups and axis 1 inside each group; axis 1 is accepted and priced at the slower inside
    link, not refused as a misfit."""
    from solver.core.cluster import cluster_from_dict
    from solver.spmd.mesh import mesh_on

    c = cluster_from_dict(
        {
            "name": "mixed-links",
            "devices": 4,
            "topology": {
                "groups": [
                    {"name": "a", "devices": 2, "link": {"bandwidth": "100GB/s", "latency": 0}},
                    {"name": "b", "devices": 2, "link": {"bandwidth": "50GB/s", "latency": 0}},
                ],
                "between": {"bandwidth": "10GB/s", "latency": "1us"},
            },
        },
        "test",
    )
    m = mesh_on(c, range(4), (2, 2))
    assert m.bandwidth == (10e9, 50e9)
    assert m.latency == (1e-6, 0.0)


@pytest.mark.parametrize("strategy", [((),), ((), (4,)), ((2, 1), (1, 4)), ((4,),)])
def test_strategy_text_round_trips(strategy):
    """fmt_strategy's text reads back as the same strategy (one rank-0 input included)."""
    from solver.spmd.strategy import fmt_strategy, parse_strategy

    assert parse_strategy(fmt_strategy(strategy), "test") == strategy


def test_cli_states_the_smallest_memory_a_plan_needs(tmp_path, capsys):
    """`mtpp shard --method cpsat --memory` below what any plan needs: exit 2, one line naming
    the least memory per device any plan needs; that much memory is then accepted and the plan
    printed needs exactly it."""
    import re

    onnx.save(examples.transformer(layers=1, batch=2, seq=16, hidden=32, heads=4, vocab=64),
              tmp_path / "t.onnx")  # fmt: skip
    argv = ["shard", tmp_path / "t.onnx", "-k", "4", "--method", "cpsat", "--time-limit", "20"]
    argv.append("--json")  # no progress lines: the refusal is the one line on stderr
    line = assert_refused(
        capsys,
        [*argv, "--memory", "2KiB"],
        r"^mtpp: error: no sharding plan fits the memory limit of 2 KiB \(2048 bytes\) per device; "
        r"the least memory any plan needs is [\d.]+ KiB \((\d+) bytes\); raise --memory$",
        watch=tmp_path,
    )
    least = int(re.search(r"needs is .*\((\d+) bytes\)", line).group(1))
    assert main([str(a) for a in [*argv, "--memory", str(least)]]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_memory_per_device"] == least
