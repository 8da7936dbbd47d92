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
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from solver.cli import main
from solver.cli.common import print_json
from solver.files import read_json, write_json_atomic

from .badinput import assert_refused

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

    import solver.io

    def broken(*args, **kwargs):
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr(solver.io, "load_graph", broken)
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
    import solver.io

    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(solver.io, "load_graph", broken)
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
