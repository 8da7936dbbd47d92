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


# ---------------------------------------------------------------------- output safety
def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output_file(
    path: str | Path, inputs: list[str | Path] = (), what: str = "output"
) -> Path:
    """Refuse an output file that is an input, a folder, under a file, or not writable.

    Returns the path. An existing regular file may be replaced (the user named it as the
    output); the write itself must still go through a temporary name and a rename.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "g.json").write_text("{}")
    2
    >>> check_output_file(d / "g.json", [d / "g.json"])
    Traceback (most recent call last):
    ...
    solver.errors.MtppError: ...: the output would overwrite an input file; choose another name
    """
    path = Path(path)
    for x in inputs:
        x = Path(x)
        if path.resolve() == x.resolve() or _same_file(path, x):
            raise MtppError(
                f"{path}: the {what} would overwrite an input file; choose another name"
            )
    if path.is_dir():
        raise MtppError(f"{path}: is a folder; give a file name for the {what}")
    parent = path.parent
    for anc in (parent, *parent.parents):
        if anc.exists():
            if not anc.is_dir():
                raise MtppError(
                    f"{path}: {anc} is a file, not a folder; choose another {what} path"
                )
            if not os.access(anc, os.W_OK | os.X_OK):
                raise MtppError(f"{path}: cannot write in {anc} (permission denied)")
            break
    return path


def check_output_dir(
    path: str | Path, inputs: list[str | Path] = (), force: bool = False, what: str = "output"
) -> Path:
    """Refuse an output folder whose replacement would destroy something not asked for.

    An existing non-empty folder is refused unless ``force``; even then never the current
    folder, one of its ancestors, a folder holding an input, or an input itself. A file of that
    name is never replaced by a folder. Returns the path (nothing is created or deleted here).
    """
    path = Path(path)
    full = path.resolve()
    cwd = Path.cwd().resolve()
    for x in inputs:
        xf = Path(x).resolve()
        if full == xf:
            raise MtppError(f"{path}: the {what} folder would replace an input; choose another")
        if full in xf.parents:
            raise MtppError(
                f"{path}: holds the input {x}; choose an {what} folder that holds no input"
            )
    if path.exists() and not path.is_dir():
        raise MtppError(f"{path}: is a file, not a folder; choose another {what} folder")
    if full == cwd or full in cwd.parents:
        raise MtppError(
            f"{path}: is the current folder or one of its parents; choose a new {what} folder"
        )
    if path.is_dir() and any(path.iterdir()) and not force:
        raise MtppError(
            f"{path}: folder exists and is not empty; choose a new {what} folder, or pass "
            "--force to replace it"
        )
    for anc in full.parents:
        if anc.exists():
            if not anc.is_dir():
                raise MtppError(f"{path}: {anc} is a file, not a folder")
            if not os.access(anc, os.W_OK | os.X_OK):
                raise MtppError(f"{path}: cannot write in {anc} (permission denied)")
            break
    return path
