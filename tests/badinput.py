"""Run the CLI on a bad input and check the contract: one line on stderr, exit code 2, and no
file changed except the requested output.

Usage in a test module::

    from .badinput import assert_refused

    def test_negative_seed(tmp_path, capsys):
        assert_refused(capsys, ["solve", str(graph), "--seed", "-1"], "--seed", watch=tmp_path)
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from solver.cli import main


def snapshot(*folders: Path) -> dict[str, str]:
    """Path -> content hash (or 'dir') of everything under ``folders``."""
    out = {}
    for folder in folders:
        folder = Path(folder)
        if not folder.exists():
            continue
        for p in sorted(folder.rglob("*")):
            if p.is_symlink() or not p.is_file():
                out[str(p)] = "dir" if p.is_dir() else "other"
            else:
                out[str(p)] = hashlib.sha1(p.read_bytes()).hexdigest()
    return out


def assert_refused(
    capsys,
    argv: list[str],
    match: str,
    watch: Path | list[Path] | None = None,
    allowed: tuple[str, ...] = (),
) -> str:
    """``mtpp argv`` must exit 2 with exactly one stderr line matching ``match`` (a regex),
    print no traceback, and change nothing under ``watch`` but the ``allowed`` paths."""
    folders = [watch] if isinstance(watch, (str, Path)) else list(watch or [])
    before = snapshot(*folders)
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2, f"exit code {code}, stderr: {err!r}"
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert re.search(match, lines[0]), f"{match!r} not in {lines[0]!r}"
    after = snapshot(*folders)
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    changed = {p for p in changed if not any(p.startswith(str(a)) for a in allowed)}
    assert not changed, f"files changed by a refused command: {sorted(changed)}"
    return lines[0]
