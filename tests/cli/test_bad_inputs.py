"""Every class of bad input through the CLI: one line on stderr, exit code 2, nothing changed.

Each case writes one malformed file in ``tmp_path`` and runs ``mtpp`` on it through
:func:`tests.badinput.assert_refused`. Also here: the top-level guard (an internal error is one
line plus a saved trace, exit 3), ``--json | head`` without a BrokenPipeError, NaN-free JSON,
and names holding rich markup or control characters printed literally.
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from solver.cli import main
from solver.cli.common import print_json
from solver.core.files import read_json, write_json_atomic
from tests.badinput import assert_refused

NATIVE = {
    "format": "mtpp-graph",
    "version": 1,
    "name": "toy",
    "nodes": [
        {"name": "a", "work": 1.0, "sizeout": 4},
        {"name": "b", "work": 2.0, "sizeout": 4},
    ],
    "edges": [["a", "b"]],
    "params": [{"name": "w", "bytes": 8, "users": ["a"]}],
}

DNNPART = {
    "maxFPGAs": 2,
    "maxSizePerFPGA": 100.0,
    "maxCPUs": 0,
    "nodes": [
        {"id": 0, "name": "a", "fpgaLatency": 1.0, "size": 1, "isBackwardNode": 0},
        {"id": 1, "name": "b", "fpgaLatency": 2, "size": 3, "isBackwardNode": False},
    ],
    "edges": [{"sourceId": 0, "destId": 1, "cost": 0.5, "size": 10.0}],
}


def changed(base: dict, path: tuple, value) -> dict:
    """A deep copy of ``base`` with the item at ``path`` set to ``value``."""
    d = copy.deepcopy(base)
    obj = d
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    return d


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    return p


@pytest.fixture
def graph(tmp_path) -> Path:
    return write(tmp_path, "g.json", json.dumps(NATIVE))


def test_good_inputs_are_accepted(graph, tmp_path, capsys):
    """The fixtures the bad cases start from are themselves fine (so the refusals mean it)."""
    assert main(["inspect", str(graph), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == 2
    d = write(tmp_path, "d.json", json.dumps(DNNPART))
    assert main(["inspect", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 2 and out["cluster"]["devices"] == 2 and out["work"] == 3.0
    c = write(tmp_path, "c.yaml", "fast_memory: &m 1GB\ncapacity: *m\ndevices: 3\n")
    assert main(["inspect", str(graph), "--cluster", str(c), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster"]["devices"] == 3 and out["cluster"]["capacity"] == 1e9


# ---------------------------------------------------------------------- files
BOMB = "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\n" + "".join(
    f"{x}: &{x} [{', '.join([f'*{p}'] * 9)}]\n" for p, x in zip("abcdefg", "bcdefgh", strict=True)
)

FILE_CASES = [
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("nan.json", '{"format": "mtpp-graph", "nodes": [{"name": "a", "work": NaN}]}', "NaN"),
    ("inf.json", '{"format": "mtpp-graph", "nodes": [{"name": "a", "work": Infinity}]}', "Inf"),
    ("big.json", '{"format": "mtpp-graph", "nodes": [{"name": "a", "work": 1e999}]}', "1e999"),
    ("dup.json", '{"format": "mtpp-graph", "format": "x"}', "duplicate key 'format'"),
    ("digits.json", '{"a": ' + "9" * 5000 + "}", "thousands of digits"),
    ("latin1.json", b'{"name": "caf\xe9"}', "not UTF-8"),
    ("broken.json", '{"format": ', "not valid JSON"),
]


@pytest.mark.parametrize("name, content, match", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_malformed_graph_files(name, content, match, tmp_path, capsys):
    p = write(tmp_path, name, content)
    assert_refused(capsys, ["inspect", p], match, watch=tmp_path)


YAML_CASES = [
    ("deep.yaml", "[" * 10_000 + "]" * 10_000, "nested too deeply"),
    ("dup.yaml", "devices: 2\nfast_memory: 1GB\ndevices: 4\n", "duplicate key 'devices' at line 3"),
    ("bomb.yaml", BOMB, "billion laughs"),
    ("loop.yaml", "devices: &a [1, *a]\n", "refers to a value that contains it"),
    ("tag.yaml", "devices: !!python/object/apply:os.system [ls]\n", "not valid YAML"),
    ("digits.yaml", "devices: " + "9" * 5000 + "\n", "thousands of digits"),
]


@pytest.mark.parametrize("name, content, match", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_malformed_yaml_files(name, content, match, graph, tmp_path, capsys):
    p = write(tmp_path, name, content)
    assert_refused(capsys, ["inspect", graph, "--cluster", p], match, watch=tmp_path)


def test_alias_bomb_really_is_one():
    """The bomb above expands to 9**8 values: the refusal is not a false alarm."""
    import yaml

    data = yaml.safe_load(BOMB)
    assert len(data["h"]) == 9 and data["h"][0][0][0][0][0][0][0] is data["a"]


def test_huge_file_refused_before_reading(tmp_path, capsys):
    p = tmp_path / "huge.json"
    with open(p, "wb") as fh:  # 200 MB, sparse: the size check must come before any read
        fh.truncate(200 * 2**20)
    assert_refused(capsys, ["inspect", p], r"200 MiB is larger than the 64 MiB limit", tmp_path)


def test_size_limit_can_be_set(graph, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MTPP_MAX_INPUT_MIB", "1")
    big = write(tmp_path, "big.json", json.dumps(dict(NATIVE, name="x" * 2**20)))
    assert_refused(capsys, ["inspect", big], "larger than the 1 MiB limit", watch=tmp_path)
    monkeypatch.setenv("MTPP_MAX_INPUT_MIB", "lots")
    assert_refused(capsys, ["inspect", graph], "MTPP_MAX_INPUT_MIB='lots'", watch=tmp_path)


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_devices_are_not_files(path, tmp_path, capsys):
    assert_refused(capsys, ["inspect", path], "not a regular file", watch=tmp_path)


def test_onnx_name_on_a_device(tmp_path, capsys):
    (tmp_path / "m.onnx").symlink_to("/dev/zero")
    assert_refused(capsys, ["inspect", tmp_path / "m.onnx"], "not a regular file", tmp_path)


def test_folder_is_not_a_graph(tmp_path, capsys):
    (tmp_path / "d.json").mkdir()
    assert_refused(capsys, ["inspect", tmp_path / "d.json"], "is a folder", watch=tmp_path)


# ---------------------------------------------------------------------- dnn-partitioning
DNN_CASES = [
    (("maxFPGAs",), 0, r"'maxFPGAs'.*greater than or equal to 1"),
    (("maxFPGAs",), 2.7, r"'maxFPGAs'.*valid integer, got 2.7"),
    (("maxFPGAs",), True, r"'maxFPGAs'.*valid integer, got True"),
    (("maxFPGAs",), 10**6, r"'maxFPGAs'.*less than or equal to 1024"),
    (("maxSizePerFPGA",), -1.0, r"'maxSizePerFPGA'.*greater than or equal to 0"),
    (("nodes", 1, "fpgaLatency"), "3", r"'nodes.1.fpgaLatency'.*got '3' \(node id 1, 'b'\)"),
    (("nodes", 1, "fpgaLatency"), None, r"'nodes.1.fpgaLatency'.*got None \(node id 1"),
    (("nodes", 1, "fpgaLatency"), [1], r"'nodes.1.fpgaLatency'.*got \[1\]"),
    (("nodes", 1, "fpgaLatency"), True, r"'nodes.1.fpgaLatency'.*got True"),
    (("nodes", 1, "fpgaLatency"), 10**400, r"'nodes.1.fpgaLatency'.*integer of 1329 bits"),
    (("nodes", 1, "size"), -5, r"'nodes.1.size'.*greater than or equal to 0, got -5"),
    (("nodes", 1, "id"), "1", r"'nodes.1.id'.*valid integer, got '1'"),
    (("nodes", 1, "id"), 10**400, r"'nodes.1.id'.*less than or equal"),
    (("nodes", 1, "isBackwardNode"), 2, r"'nodes.1.isBackwardNode'"),
    (("nodes", 0, "name"), "x" * 5000, r"'nodes.0.name'.*at most 1000 characters"),
    (("nodes", 0), 5, r"'nodes.0'.*valid dictionary"),
    (("edges", 0, "destId"), 7, r"edges\[0\] names unknown node id 7"),
    (("edges", 0, "cost"), True, r"'edges.0.cost'.*got True"),
    (("edges", 0, "cost"), -0.5, r"'edges.0.cost'.*greater than or equal to 0"),
]


@pytest.mark.parametrize("path, value, match", DNN_CASES, ids=[str(c[:2]) for c in DNN_CASES])
def test_bad_dnn_partitioning_fields(path, value, match, tmp_path, capsys):
    p = write(tmp_path, "d.json", json.dumps(changed(DNNPART, path, value)))
    assert_refused(capsys, ["inspect", p], match, watch=tmp_path)


# ---------------------------------------------------------------------- native graph JSON
NATIVE_CASES = [
    (("nodes", 1, "work"), "2", r"'nodes.1.work'.*valid number, got '2' \(node 'b'\)"),
    (("nodes", 1, "work"), None, r"'nodes.1.work'.*got None"),
    (("nodes", 1, "work"), True, r"'nodes.1.work'.*got True"),
    (("nodes", 1, "work"), 10**400, r"'nodes.1.work'.*integer of 1329 bits"),
    (("nodes", 1, "sizeout"), -4, r"'nodes.1.sizeout'.*greater than or equal to 0"),
    (("nodes", 1, "name"), 7, r"'nodes.1.name'.*valid string, got 7"),
    (("nodes", 1, "name"), "n" * 5000, r"'nodes.1.name'.*at most 1000 characters"),
    (("params", 0, "bytes"), False, r"'params.0.bytes'.*got False"),
    (("params", 0, "users"), ["zz"], r"unknown node 'zz'"),
    (("edges", 0), [1, 2], r"'edges.0'"),
    (("version",), True, r"'version'"),
]


@pytest.mark.parametrize("path, value, match", NATIVE_CASES, ids=[str(c[:2]) for c in NATIVE_CASES])
def test_bad_native_fields(path, value, match, tmp_path, capsys):
    p = write(tmp_path, "g.json", json.dumps(changed(NATIVE, path, value)))
    assert_refused(capsys, ["inspect", p], match, watch=tmp_path)


# ---------------------------------------------------------------------- cluster YAML
CLUSTER_CASES = [
    ("devices: true", r"'devices'.*valid integer, got True"),
    ("devices: 0", r"'devices'.*greater than or equal to 1"),
    ("devices: -3", r"'devices'.*greater than or equal to 1"),
    ("devices: 2.7", r"'devices'.*valid integer, got 2.7"),
    ("devices: 100000", r"'devices'.*less than or equal to 1024"),
    ("devices: '4'", r"'devices'.*valid integer, got '4'"),
    ("link_bandwidth: -3GB/s", r"link_bandwidth: must be a non-negative quantity"),
    ("link_bandwidth: .nan", r"link_bandwidth: must be a non-negative quantity, got nan"),
    ("link_bandwidth: 0", r"link_bandwidth must be > 0"),
    ("fast_memory: nan", r"fast_memory: cannot read 'nan'"),
    ("fast_memory: -3GB", r"fast_memory: must be a non-negative quantity, got '-3GB'"),
    ("fast_memory: 1e999GB", r"fast_memory: '1e999GB' is too large; write 'inf'"),
    ("fast_memory: 900parsecs", r"unknown unit 'parsecs'"),
    ("capacity: [1, 2]", r"capacity: expected a quantity"),
    ("capacity: " + "9" * 400, r"capacity: the number is too large"),
    ("link_latency: .inf", r"link_latency must be finite"),
    ("name: [x]", r"'name'.*valid string"),
    ("fast_memry: 1GB", r"'fast_memry'.*Extra inputs"),
    # topologies that do not add up: the message names the group or the devices at fault
    ("topology: {groups: []}", r"topology.groups is empty; list at least one group"),
    ("topology: {groups: [{name: a, devices: 0}]}", r"group 'a' must hold >= 1 devices, got 0$"),
    ("topology: {groups: [{name: a, devices: -2}]}", r"group 'a' must hold >= 1 devices, got -2"),
    ("topology: {groups: [{name: a, devices: []}]}", r"group 'a' must hold >= 1 devices, got \[\]"),
    (
        "topology: {groups: [{devices: [0, 1]}, {devices: [1, 2]}], between: {bandwidth: 1}}",
        r"device 1 is listed in groups 'group0' and 'group1'",
    ),
    ("topology: {groups: [{devices: 2}, {devices: 2}]}", r"no link between them"),
    (
        "devices: 5\ntopology: {groups: [{devices: 2}, {devices: 2}], between: {bandwidth: 1}}",
        r"the groups hold 4 devices but devices is 5 \(device 4 is in no group\)",
    ),
    ("topology: {groups: [{devices: 2}], fast_memory: [1GB]}", r"lists 1 values but there are 2"),
    ("topology: {groups: [{devices: 2}], compute: [0, 1TFLOPS]}", r"compute\[0\] must be > 0"),
]


@pytest.mark.parametrize("text, match", CLUSTER_CASES, ids=[c[0][:24] for c in CLUSTER_CASES])
def test_bad_cluster_yaml(text, match, graph, tmp_path, capsys):
    c = write(tmp_path, "c.yaml", text + "\n")
    assert_refused(capsys, ["inspect", graph, "--cluster", c], match, watch=tmp_path)


def test_bad_cluster_stated_by_graph(tmp_path, capsys):
    p = write(tmp_path, "g.json", json.dumps(dict(NATIVE, cluster={"devices": True})))
    assert_refused(capsys, ["inspect", p], r"'devices'.*got True", watch=tmp_path)


# ---------------------------------------------------------------------- sharding YAML
SHARDING_CASES = [
    ("- {node: a, device: " + "9" * 400 + "}", r"device must be a whole number from 0 to 1023"),
    ("- {node: a, device: '1'}", r"device must be a whole number.*got '1'"),
    ("- {node: a, device: 1.0}", r"device must be a whole number.*got 1.0"),
    ("- {node: a, device: true}", r"device must be a whole number.*got True"),
    ("- {node: a, device: 0, stage: -1}", r"stage must be a whole number.*got -1"),
    ("- {node: [a], device: 0}", r"node must be a node name, got \['a'\]"),
    ("- {node: " + "x" * 2000 + ", device: 0}", r"node name longer than 1000"),
    ("- {node: a, device: 0}\n- {node: a, device: 1, device: 2}", r"duplicate key 'device'"),
]


@pytest.mark.parametrize("text, match", SHARDING_CASES, ids=[c[0][:30] for c in SHARDING_CASES])
def test_bad_sharding_yaml(text, match, graph, tmp_path, capsys):
    s = write(tmp_path, "points.yaml", text + "\n")
    assert_refused(capsys, ["evaluate", graph, s], match, watch=tmp_path)


@pytest.mark.parametrize(
    "block, match",
    [
        (10**400, r"block of node 'a' must be a whole number from 0 to 1023, got 1000"),
        (-1, r"block of node 'a' must be a whole number from 0 to 1023, got -1"),
        ("0", r"block of node 'a' must be a whole number.*got '0'"),
        (True, r"block of node 'a' must be a whole number.*got True"),
    ],
)
def test_bad_block_numbers_in_a_plan_file(block, match, graph, tmp_path, capsys):
    """Huge, negative, string and boolean block numbers in a plan file are refused by name."""
    out = tmp_path / "plan.json"
    assert main(["solve", str(graph), "-k", "2", "-q", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    plan["assignment"]["a"] = block
    bad = write(tmp_path, "bad.json", json.dumps(plan))
    assert_refused(capsys, ["evaluate", graph, bad], match, watch=tmp_path)


# ---------------------------------------------------------------------- options
OPTION_CASES = [
    (["--dim", "batch=0"], r"--dim 'batch=0': VALUE must be between 1 and 2147483647"),
    (["--dim", "batch=2147483648"], r"VALUE must be between 1 and 2147483647"),
    (["--dim", "batch=" + "9" * 5000], r"VALUE must be a whole number"),
    (["--dim", "batch=-1"], r"VALUE must be a whole number"),
    (["--dim", "batch=x"], r"VALUE must be a whole number"),
    (["--dim", "batch=1e3"], r"VALUE must be a whole number"),
    (["--dim", "batch=2", "--dim", "batch=4"], r"'batch' is given twice"),
    (["--dim", "=4"], r"write NAME=VALUE"),
    (["--devices", "0"], r"^mtpp inspect: error: argument --devices/-k: --devices must be >= 1"),
    (["--devices", "100000"], r"at most 1024, got 100000 \(see mtpp inspect --help\)$"),
    (["-k", "x"], r"expected a whole number of devices, got 'x'"),
    (["--top", "x"], r"^mtpp inspect: error: argument --top: invalid int value: 'x'"),
    (["--frobnicate"], r"^mtpp inspect: error: unrecognized arguments: --frobnicate"),
    (["--work", "magic"], r"argument --work: invalid choice: 'magic'"),
]


@pytest.mark.parametrize(
    "extra, match", OPTION_CASES, ids=[" ".join(c[0])[:30] for c in OPTION_CASES]
)
def test_bad_options(extra, match, graph, tmp_path, capsys):
    assert_refused(capsys, ["inspect", graph, *extra], match, watch=tmp_path)


def test_argparse_errors_name_the_command(graph, tmp_path, capsys):
    line = assert_refused(capsys, ["solve", graph, "--seed", "x"], "--seed", watch=tmp_path)
    assert line == (
        "mtpp solve: error: argument --seed: invalid int value: 'x' (see mtpp solve --help)"
    )
    assert_refused(capsys, ["frobnicate"], r"^mtpp: error: argument COMMAND", watch=tmp_path)


# ---------------------------------------------------------------------- names printed literally
def test_markup_and_control_characters_in_names(tmp_path, capsys):
    nasty = ["[red]a[/]", "[/]", "b\x1b[31mred\x07"]
    g = dict(
        NATIVE,
        name="[bold]g[/]",
        nodes=[{"name": n, "work": 1.0 + i, "op_type": "[/]op"} for i, n in enumerate(nasty)],
        edges=[],
        params=[],
    )
    p = write(tmp_path, "g.json", json.dumps(g))
    capsys.readouterr()
    assert main(["inspect", str(p)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    for text in ("[red]a[/]", "[/]", "b?[31mred?", "graph [bold]g[/]", "[/]op"):
        assert text in out, text
    assert "\x1b" not in out and "\x07" not in out


def test_control_characters_in_an_error_stay_on_one_line(tmp_path, capsys):
    """The cycle message lists raw node names; a newline or escape in one must not leak."""
    g = dict(NATIVE, nodes=[{"name": "x\ny\x1b", "work": 1}, {"name": "b", "work": 1}])
    g.update(edges=[["x\ny\x1b", "b"], ["b", "x\ny\x1b"]], params=[])
    p = write(tmp_path, "g.json", json.dumps(g))
    line = assert_refused(capsys, ["inspect", p], "cycle", watch=tmp_path)
    assert "x y?" in line and "\x1b" not in line


# ---------------------------------------------------------------------- guard
def test_internal_error_is_one_line_and_a_saved_trace(graph, tmp_path, capsys, monkeypatch):
    import tempfile

    import solver.frontends

    def broken(*args, **kwargs):
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr(solver.frontends, "load_graph", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    capsys.readouterr()
    assert main(["inspect", str(graph)]) == 3
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    prefix = "mtpp: internal error: ValueError: boom; full trace saved to "
    assert err.startswith(prefix)
    trace = Path(err[len(prefix) :].strip())
    assert trace.parent == tmp_path and trace.name.startswith("mtpp-crash-")
    text = trace.read_text()
    assert "Traceback" in text and "in broken" in text and "second line" in text


@pytest.mark.parametrize(
    "exc, code, match",
    [
        (MemoryError(), 2, r"^mtpp: error: out of memory in mtpp inspect"),
        (RecursionError("maximum recursion depth"), 2, r"^mtpp: error: the input is nested"),
    ],
)
def test_memory_and_recursion_errors(exc, code, match, graph, capsys, monkeypatch):
    import solver.frontends

    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(solver.frontends, "load_graph", broken)
    capsys.readouterr()
    assert main(["inspect", str(graph)]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(match, err), err


def test_json_into_a_closed_pipe(tmp_path):
    """``mtpp inspect --json | head -c 10``: the reader leaves early, mtpp stays quiet."""
    n = 3000  # enough output (about 500 kB) to fill the pipe buffer many times over
    g = dict(
        NATIVE,
        nodes=[{"name": f"node{i}", "work": 1.0 + i, "sizeout": 4} for i in range(n)],
        edges=[],
        params=[],
    )
    p = write(tmp_path, "big.json", json.dumps(g))
    cmd = [sys.executable, "-m", "solver.cli", "inspect", str(p), "--json", "--top", str(n)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read()
    code = proc.wait(timeout=120)
    assert head == b'{\n "graph"'
    assert err == b"", err.decode()
    assert code == 1  # what the Python docs do on a broken pipe


def test_json_into_head_through_a_shell(tmp_path):
    sh = "/bin/sh"
    if not os.path.exists(sh):
        pytest.skip("no /bin/sh")
    g = dict(NATIVE, nodes=[{"name": f"n{i}", "work": 1.0} for i in range(3000)], edges=[])
    g["params"] = []
    p = write(tmp_path, "big.json", json.dumps(g))
    cmd = f"'{sys.executable}' -m solver.cli inspect '{p}' --json --top 3000 | head -c 10"
    res = subprocess.run([sh, "-c", cmd], capture_output=True, timeout=120)
    assert res.stdout == b'{\n "graph"' and res.stderr == b""


# ---------------------------------------------------------------------- NaN-free JSON
def _strict(text: str):
    def refuse(name):
        raise ValueError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def test_print_json_never_emits_nan_or_infinity(capsys):
    capsys.readouterr()
    print_json(
        {
            "nan": float("nan"),
            "inf": [np.inf, -np.inf, np.float32("nan")],
            "arr": np.array([1.5, np.nan]),
            "ok": np.int64(3),
            "flag": np.bool_(True),
            "nested": {"x": (1.0, float("-inf"))},
        }
    )
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out
    assert _strict(out) == {
        "nan": None,
        "inf": [None, None, None],
        "arr": [1.5, None],
        "ok": 3,
        "flag": True,
        "nested": {"x": [1.0, None]},
    }


def test_written_json_reads_back(tmp_path):
    p = tmp_path / "x.json"
    write_json_atomic(p, {"bound": float("inf"), "f": np.array([np.nan, 2.0])})
    assert read_json(p) == {"bound": None, "f": [None, 2.0]}


# ---------------------------------------------------------------------- second outside attack
# Cases found by feeding ~950 bad inputs through the installed command (issue 10, second pass).


@pytest.mark.parametrize("value", ["toy", ["x"], 5])
def test_plan_graph_field_of_the_wrong_type(value, graph, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["solve", str(graph), "-k", "2", "-q", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    plan["graph"] = value
    bad = write(tmp_path, "bad.json", json.dumps(plan))
    for cmd in ("evaluate", "simulate"):
        assert_refused(capsys, [cmd, graph, bad], r"'graph' must be a mapping", watch=tmp_path)
    plan["graph"] = {"fingerprint": ["x"]}
    bad.write_text(json.dumps(plan))
    assert_refused(
        capsys, ["evaluate", graph, bad], r"'graph.fingerprint' must be a string", tmp_path
    )


@pytest.mark.parametrize("key", ["lower_bound", "objective"])
def test_plan_claiming_an_integer_too_large_for_a_float(key, graph, tmp_path, capsys):
    """A claimed number beyond a float is an invalid claim (exit 1), not an OverflowError."""
    out = tmp_path / "plan.json"
    assert main(["solve", str(graph), "-k", "2", "-q", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    plan[key] = 10**400
    bad = write(tmp_path, "bad.json", json.dumps(plan))
    capsys.readouterr()
    assert main(["evaluate", str(graph), str(bad), "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["claim"].startswith(f"invalid: the {key.replace('_', ' ')}")
    assert res["status_source"] != "claimed" or res["status"] != "OPTIMAL"


def test_manual_sharding_with_devices_out_of_pipeline_order(graph, tmp_path, capsys):
    """Devices backwards inside one stage (so stages and devices do not correspond one to
    one): refused by name, not an internal error. With one device per stage the file is a
    placed plan (PopRT's meaning: the stage is the pipeline position, the device the IPU) and
    is accepted."""
    s = write(
        tmp_path, "s.yaml", "- {node: a, device: 1, stage: 0}\n- {node: b, device: 0, stage: 0}\n"
    )
    match = r"'b' \(device 0\) consumes 'a' from the later device 1; number the devices"
    assert_refused(capsys, ["solve", graph, "-m", "manual", "--sharding", s], match, tmp_path)
    assert_refused(capsys, ["evaluate", graph, s], match, watch=tmp_path)
    placed = write(
        tmp_path, "p.yaml", "- {node: a, device: 1, stage: 0}\n- {node: b, device: 0, stage: 1}\n"
    )
    argv = ["solve", graph, "-m", "manual", "--sharding", placed, "-k", "2", "--json"]
    assert main([str(x) for x in argv]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["placement"] == [1, 0]
    assert out["assignment"]["a"] == 0


@pytest.mark.parametrize(
    "fmt, path, value, match",
    [
        ("native", ("nodes", 0, "work"), 1e308, r"node 'a': work must be at most 1e\+30"),
        ("native", ("nodes", 1, "sizeout"), 1e31, r"node 'b': sizeout must be at most 1e\+30"),
        ("native", ("params", 0, "bytes"), 1e300, r"parameter 'w': bytes must be at most 1e\+30"),
        ("dnnpart", ("nodes", 0, "fpgaLatency"), 1e308, r"work must be at most 1e\+30"),
    ],
)
def test_amounts_too_large_for_the_sums(fmt, path, value, match, tmp_path, capsys):
    """Two works of 1e308 summed to inf and then NaN (an internal error): refused on load."""
    base = NATIVE if fmt == "native" else DNNPART
    p = write(tmp_path, "g.json", json.dumps(changed(base, path, value)))
    assert_refused(capsys, ["solve", p, "-q"], match, watch=tmp_path)


def test_duplicate_parameter_names(tmp_path, capsys):
    params = [{"name": "w", "bytes": 8, "users": ["a"]}, {"name": "w", "bytes": 8, "users": ["b"]}]
    p = write(tmp_path, "g.json", json.dumps(changed(NATIVE, ("params",), params)))
    assert_refused(capsys, ["inspect", p], r"parameter name 'w' appears more than once", tmp_path)


def test_output_paths_that_cannot_be_written(graph, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = tmp_path / "p.json"
    assert main(["solve", str(graph), "-k", "2", "-q", "--out", str(plan)]) == 0
    os.mkfifo(tmp_path / "fifo")
    long = "a" * 300 + ".json"
    for opt in (["solve", graph, "-q", "--out"], ["simulate", graph, plan, "--gantt"]):
        assert_refused(capsys, [*opt, ""], r"path is empty", watch=tmp_path)
        assert_refused(capsys, [*opt, long], r"longer than \d+ bytes", watch=tmp_path)
        assert_refused(capsys, [*opt, "fifo"], r"fifo: not a regular file", watch=tmp_path)
    assert_refused(capsys, ["solve", graph, "-q", "--out", "x/"], r"names a folder", tmp_path)
    from solver.core.errors import MtppError
    from solver.core.files import check_output_dir

    for out, match in (("", "path is empty"), ("b" * 300, "longer than")):
        with pytest.raises(MtppError, match=match):
            check_output_dir(out, [graph], force=True, what="export")
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)  # still a FIFO, not replaced


def test_outputs_never_replace_a_cluster_file_or_external_weights(graph, tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = write(tmp_path, "c.yaml", "name: c\ndevices: 2\nlink_bandwidth: 1GB/s\n")
    assert_refused(
        capsys, ["solve", graph, "--cluster", c, "--out", c], r"overwrite an input", tmp_path
    )
    w = numpy_helper.from_array(np.random.default_rng(0).random((4, 4), np.float32), "W")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")
    model = helper.make_model(helper.make_graph([node], "e", [x], [y], [w]))
    onnx.save_model(
        model, tmp_path / "e.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    data = tmp_path / "w.bin"
    assert_refused(
        capsys, ["solve", tmp_path / "e.onnx", "-q", "--out", data], r"overwrite an input", tmp_path
    )
    plan = tmp_path / "p.json"
    assert main(["solve", str(tmp_path / "e.onnx"), "-q", "--out", str(plan)]) == 0
    assert_refused(
        capsys,
        ["simulate", tmp_path / "e.onnx", plan, "--gantt", data],
        r"overwrite an input",
        watch=tmp_path,
    )


def test_no_command_is_one_line(tmp_path, capsys):
    assert_refused(capsys, [], r"^mtpp: error: name a command: inspect, solve", watch=tmp_path)


@pytest.mark.parametrize(
    "command", ["inspect", "solve", "evaluate", "simulate", "export", "run", "experiment"]
)
def test_help_paragraphs_are_wrapped(command, capsys):
    """Descriptions used to be one 400-character line; only indented example lines may be wide."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    wide = [x for x in out.splitlines() if len(x) > 100 and not x.startswith(" ")]
    assert not wide, wide
    assert "{cpsat," not in out  # the method list is printed once, in the help text


def test_huge_values_print_as_exponents(tmp_path, capsys):
    g = changed(NATIVE, ("params", 0, "bytes"), 1e29)
    p = write(tmp_path, "g.json", json.dumps(g))
    assert main(["solve", str(p), "-q", "-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "~0" in out and "e+" in out
    assert max(len(x) for x in out.splitlines()) <= 80


def test_inputs_too_large_for_numpy_with_memory_ok(tmp_path, capsys):
    """--memory-ok skips the estimate; inputs past what numpy can shape used to end in an
    internal "array is too big" error in run and in export --verify."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])
    w = numpy_helper.from_array(np.random.default_rng(0).random((8, 8), np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    model = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "dyn", [x], [y], [w])), model)
    dims = ["--dim", "batch=2147483647", "--dim", "seq=2147483647"]
    plan = tmp_path / "p.json"
    assert (
        main(["solve", str(model), *dims, "-k", "2", "-m", "time", "-q", "--out", str(plan)]) == 0
    )
    match = r"input 'x' of shape \[2147483647, 2147483647, 8\] would take .* TiB"
    assert_refused(capsys, ["run", model, plan, *dims, "--memory-ok"], match, watch=tmp_path)
    out = tmp_path / "out"
    argv = ["export", model, plan, *dims, "--out", out, "--verify", "--verify-memory-ok"]
    assert_refused(capsys, argv, match, watch=tmp_path)
    assert not out.exists()


@pytest.mark.parametrize(
    "line, match",
    [
        ("link_latency: 1e300s", r"link_latency must be at most 1e\+09 s, got 1e\+300"),
        ("link_bandwidth: 1e-300B/s", r"link_bandwidth must be at least 1e-06 B/s"),
        ("compute: 1e-300FLOPS", r"compute must be at least 1e-06 FLOPS"),
    ],
)
def test_cluster_rates_and_latencies_that_break_the_sums(line, match, graph, tmp_path, capsys):
    """A 1e300 s latency gave a simulated period of 0 (the sums lost every other term), and a
    1e-300 FLOPS compute blamed a node's work; both are refused in the cluster file."""
    base = "name: c\ndevices: 2\nlink_bandwidth: 1GB/s\ncompute: 1TFLOPS\nlink_latency: 0s\n"
    key = line.split(":")[0]
    text = "\n".join(line if x.startswith(key + ":") else x for x in base.splitlines())
    c = write(tmp_path, "c.yaml", text + "\n")
    out = tmp_path / "p.json"
    assert main(["solve", str(graph), "-k", "2", "-q", "--out", str(out)]) == 0
    assert_refused(capsys, ["simulate", graph, out, "--cluster", c], match, watch=tmp_path)


def test_simulate_latency_too_long_for_the_sums(graph, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["solve", str(graph), "-k", "2", "-q", "--out", str(out)]) == 0
    match = r"--latency .* got 1e\+300 \(the largest accepted is 1e\+09\)"
    assert_refused(capsys, ["simulate", graph, out, "--latency", "1e300"], match, tmp_path)
