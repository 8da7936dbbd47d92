"""solver.core.outdir: an output folder appears whole or not at all; what it replaces is removed
only
after, and a link named as the output loses the link, never its target."""

from __future__ import annotations

import os
import stat

import onnx
import pytest

from solver.cli import main
from solver.core import outdir
from tests.cli.test_shard import examples


def _filled(tmp_path, text: str = "new"):
    tmp = outdir.temp_dir_beside(tmp_path / "out")
    (tmp / "f.txt").write_text(text)
    return tmp


def test_temp_dir_is_hidden_beside_with_the_usual_mode(tmp_path):
    tmp = outdir.temp_dir_beside(tmp_path / "sub" / "out")
    umask = os.umask(0)
    os.umask(umask)
    assert tmp.parent == tmp_path / "sub" and tmp.name.startswith(".out.")
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o777 & ~umask
    assert list(tmp.iterdir()) == []


def test_replace_dir_puts_the_new_folder_in_place_and_removes_the_old(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out/old.txt").write_text("old")
    tmp = _filled(tmp_path)
    outdir.replace_dir(tmp, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["f.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary, no old copy


def test_replace_dir_through_a_link_keeps_the_link_target(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target/keep.txt").write_text("keep")
    (tmp_path / "out").symlink_to(tmp_path / "target")
    outdir.replace_dir(_filled(tmp_path), tmp_path / "out")
    assert (tmp_path / "target/keep.txt").read_text() == "keep"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out/f.txt").read_text() == "new"


def test_replace_dir_puts_the_old_folder_back_when_the_rename_fails(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    (tmp_path / "out/old.txt").write_text("old")
    tmp = _filled(tmp_path)
    real = os.replace
    calls = []

    def failing_second(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(outdir.os, "replace", failing_second)
    with pytest.raises(OSError, match="disk full"):
        outdir.replace_dir(tmp, tmp_path / "out")
    assert (tmp_path / "out/old.txt").read_text() == "old"
    assert (tmp / "f.txt").read_text() == "new"


def test_shard_force_is_not_stopped_by_a_leftover_old_folder(tmp_path, capsys):
    """A folder an earlier interrupted run left beside the output does not break --force (shard
    once renamed the old output to a fixed '.out.old' name, which then already existed)."""
    onnx.save(examples.ffn(), tmp_path / "ffn.onnx")
    (tmp_path / "out").mkdir()
    (tmp_path / "out/old.txt").write_text("old")
    (tmp_path / ".out.old").mkdir()
    (tmp_path / ".out.old/stale.txt").write_text("stale")
    argv = ["shard", str(tmp_path / "ffn.onnx"), "-k", "2", "--method", "dp", "--json"]
    assert main([*argv, "--out", str(tmp_path / "out"), "--force"]) == 0
    capsys.readouterr()
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["annotated.onnx", "plan.json", "strategies.yaml"]
    assert (tmp_path / ".out.old/stale.txt").read_text() == "stale"  # not ours: left alone
