"""Reading and writing the project's small files, with one clear error per failure.

Every loader (graphs, plans, clusters, sharding points, experiment configs) reads through
here, so a missing file, a folder, bad encoding, or malformed JSON/YAML always ends in the
same kind of one-line :class:`MtppError`; writes go to a temporary file and are renamed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from solver.errors import MtppError

_UMASK = os.umask(0)
os.umask(_UMASK)


def read_text(path: str | Path, what: str = "file") -> str:
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise MtppError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise MtppError(f"{path}: is a folder, expected a {what}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise MtppError(f"{path}: cannot read ({e})") from None


def read_json(path: str | Path, what: str = "file") -> object:
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise MtppError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        ) from None


def read_yaml(path: str | Path, what: str = "file") -> object:
    import yaml

    text = read_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MtppError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write JSON to a temporary file beside ``path`` and rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the usual permissions
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
