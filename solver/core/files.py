"""Reading and writing the project's small files, with one clear error per failure.

Every loader (graphs, plans, clusters, sharding points, experiment configs) reads through
here, so a missing file, a folder, bad encoding, or malformed JSON/YAML always ends in the
same kind of one-line :class:`MtppError`; writes go to a temporary file and are renamed.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

from solver.core.errors import MtppError, first_line

_UMASK = os.umask(0)
os.umask(_UMASK)

# Inputs larger than this are refused before they are read: a JSON or YAML file becomes Python
# objects about ten times its size, and the largest real cost graph we know is a few MiB.
# MTPP_MAX_INPUT_MIB raises (or lowers) the limit for one run.
MAX_INPUT_MIB = 64
# A YAML file expands to at most this many values once its aliases are followed (a "billion
# laughs" file of a few hundred bytes would otherwise expand to 10**9 values).
MAX_YAML_VALUES = 1_000_000


def max_input_bytes() -> int:
    """The input size limit in bytes: ``MTPP_MAX_INPUT_MIB`` if set, else MAX_INPUT_MIB."""
    raw = os.environ.get("MTPP_MAX_INPUT_MIB")
    if raw is None or not raw.strip():
        return MAX_INPUT_MIB * 2**20
    try:
        mib = int(raw)
    except ValueError:
        mib = 0
    if mib < 1:
        raise MtppError(f"MTPP_MAX_INPUT_MIB={raw!r}: give a whole number of MiB >= 1")
    return mib * 2**20


def check_regular_file(path: str | Path, what: str = "file") -> os.stat_result:
    """Refuse a missing path, a folder, or a device, pipe or socket (``/dev/zero`` would be read
    forever); return the file's ``stat``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MtppError(f"{path}: no such {what}") from None
    except OSError as e:
        raise MtppError(f"{path}: cannot read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise MtppError(f"{path}: is a folder, expected a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise MtppError(f"{path}: not a regular file (a device, pipe or socket); give a {what}")
    return st


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of a regular file no larger than :func:`max_input_bytes`."""
    path = Path(path)
    st = check_regular_file(path, what)
    limit = max_input_bytes()
    if st.st_size > limit:
        raise MtppError(
            f"{path}: {st.st_size / 2**20:.0f} MiB is larger than the {limit // 2**20} MiB limit "
            f"for a {what}; set MTPP_MAX_INPUT_MIB to raise it"
        )
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)  # the file may have grown since the stat
    except OSError as e:
        raise MtppError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > limit:
        raise MtppError(f"{path}: larger than the {limit // 2**20} MiB limit for a {what}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MtppError(f"{path}: not UTF-8 text (byte {e.start}); expected a {what}") from None


def read_head(path: str | Path, size: int, what: str = "file") -> bytes:
    """The first ``size`` bytes of a regular file (fewer when it is shorter): enough to tell
    its kind from its content."""
    check_regular_file(path, what)
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError as e:
        raise MtppError(f"{path}: cannot read ({e.strerror or e})") from None


# ---------------------------------------------------------------------- JSON
class _JsonRefusal(ValueError):
    """A JSON value that parses but that we refuse (NaN, Infinity, duplicate key)."""


def _refuse_constant(name: str) -> float:
    raise _JsonRefusal(f"{name} is not a number JSON allows; write a finite number")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise _JsonRefusal(f"the number {text[:40]} is too large for a float")
    return x


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _JsonRefusal(f"duplicate key {dup[:80]!r}")
    return out


def read_json(path: str | Path, what: str = "file") -> object:
    """Parse a JSON file strictly: no NaN/Infinity, no number that overflows, no duplicate key."""
    return parse_json(read_text(path, what), path)


def parse_json(text: str, path: str | Path) -> object:
    """Parse JSON text read from ``path`` (named in errors) with the checks of :func:`read_json`."""
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            object_pairs_hook=_no_duplicate_keys,
        )
    except json.JSONDecodeError as e:
        raise MtppError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        ) from None
    except _JsonRefusal as e:
        raise MtppError(f"{path}: not accepted: {e}") from None
    except RecursionError:
        raise MtppError(f"{path}: JSON nested too deeply (over about 1000 levels)") from None
    except ValueError:  # an integer with more digits than Python converts (4300)
        raise MtppError(f"{path}: not accepted: a number with thousands of digits") from None


# ---------------------------------------------------------------------- YAML
def _yaml_loader():
    """A SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        dup = key in seen
                        seen.add(key)
                    except TypeError:  # an unhashable key: the base class explains it
                        continue
                    if dup:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {str(key)[:80]!r}", key_node.start_mark
                        )
            return super().construct_mapping(node, deep)

    return Loader


def _check_expansion(data: object, where: Path) -> None:
    """Refuse a YAML value that refers to itself or expands to more than MAX_YAML_VALUES."""
    count = 0
    on_path: set[int] = set()
    stack: list[tuple[object, bool]] = [(data, False)]
    while stack:
        obj, leaving = stack.pop()
        if leaving:
            on_path.discard(id(obj))
            continue
        count += 1
        if count > MAX_YAML_VALUES:
            raise MtppError(
                f"{where}: expands to more than {MAX_YAML_VALUES:,} values (aliases repeated "
                "many times, a 'billion laughs' file?); write the values out"
            )
        if isinstance(obj, (dict, list)):
            if id(obj) in on_path:
                raise MtppError(f"{where}: a YAML alias refers to a value that contains it")
            on_path.add(id(obj))
            stack.append((obj, True))
            stack.extend((v, False) for v in (obj.values() if isinstance(obj, dict) else obj))


def read_yaml(path: str | Path, what: str = "file") -> object:
    """Parse a YAML file safely: no duplicate keys, no alias bombs, no deep nesting crash."""
    text = read_text(path, what)
    try:
        data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 -- a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = " ".join(x for x in (e.context, e.problem) if x)
        raise MtppError(f"{path}: not valid YAML ({problem}{where})") from None
    except yaml.YAMLError as e:
        raise MtppError(f"{path}: not valid YAML ({first_line(e)})") from None
    except RecursionError:
        raise MtppError(f"{path}: YAML nested too deeply (over about 1000 levels)") from None
    except ValueError:  # an integer with more digits than Python converts (4300)
        raise MtppError(f"{path}: not accepted: a number with thousands of digits") from None
    _check_expansion(data, path)
    return data


# ---------------------------------------------------------------------- writing
def json_safe(obj: object) -> object:
    """``obj`` with numpy values made plain and NaN/Infinity replaced by None (JSON null).

    Everything mtpp writes as JSON goes through here, so what it writes it can read back.
    """
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else None
    return obj


@contextmanager
def atomic_file(path: str | Path, mode: str = "w", newline: str | None = None):
    """Open a temporary file beside ``path`` for writing; when the block ends normally, rename
    it into place (with the usual permissions), else remove it. An interrupted write never
    leaves a half-written ``path``: the old file stays.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_file(p) as fh:
    ...     _ = fh.write("done")
    >>> p.read_text()
    'done'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the usual permissions
        with os.fdopen(fd, mode, newline=newline) as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write JSON to a temporary file beside ``path`` and rename it into place."""
    text = json.dumps(json_safe(data), indent=1, allow_nan=False)
    with atomic_file(path) as fh:
        fh.write(text)
        fh.write("\n")


# ---------------------------------------------------------------------- output safety
def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_path_text(path: str | Path, what: str) -> None:
    """Refuse an output path that is empty or has a name longer than the file system allows
    (the write would fail only after the work is done)."""
    text = os.fspath(path)
    if not text.strip():
        raise MtppError(f"the {what} path is empty; give a file or folder name")
    try:
        limit = os.pathconf(".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in Path(text).parts:
        if len(os.fsencode(part)) > limit:
            raise MtppError(
                f"{text[:40]}...: a name in the {what} path is longer than {limit} bytes; "
                "choose a shorter name"
            )


def check_output_file(
    path: str | Path, inputs: list[str | Path] = (), what: str = "output"
) -> Path:
    """Refuse an output file that is an input, a folder, a device, under a file, or not
    writable.

    Returns the path. An existing regular file may be replaced (the user named it as the
    output); the write itself must still go through a temporary name and a rename.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "g.json").write_text("{}")
    2
    >>> check_output_file(d / "g.json", [d / "g.json"])
    Traceback (most recent call last):
    ...
    solver.core.errors.MtppError: ...: the output would overwrite an input file; choose another name
    """
    _check_path_text(path, what)
    if os.fspath(path).endswith(("/", os.sep)):
        raise MtppError(f"{path}: names a folder; give a file name for the {what}")
    path = Path(path)
    for x in inputs:
        x = Path(x)
        if path.resolve() == x.resolve() or _same_file(path, x):
            raise MtppError(
                f"{path}: the {what} would overwrite an input file; choose another name"
            )
    if path.is_dir():
        raise MtppError(f"{path}: is a folder; give a file name for the {what}")
    if path.exists() and not path.is_file():  # the rename would replace /dev/null itself
        raise MtppError(
            f"{path}: not a regular file (a device, pipe or socket); give a file name for the "
            f"{what}"
        )
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
    _check_path_text(path, what)
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


# ---------------------------------------------------------------------- validation messages
def shown(value: object, limit: int = 40) -> str:
    """A user's value for an error message: its repr, or a description when that is long."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"  # repr fails past 4300 digits
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    return f"a {type(value).__name__} of {len(value) if hasattr(value, '__len__') else '?'} items"


def validation_message(err, where: str, data: object) -> str:
    """One line for the first error of a pydantic ``ValidationError``: where, key, what, got.

    The key path is taken from the data (pydantic also lists union members such as 'str').
    """
    first = err.errors()[0]
    loc, node = [], data
    for part in first["loc"]:
        inside = isinstance(node, dict) and part in node
        inside |= isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if inside:
            node = node[part]
            loc.append(str(part))
        elif first["type"] == "missing" and part == first["loc"][-1]:
            loc.append(str(part))
    key = ".".join(loc) or "(top level)"
    got = "" if first["type"] in ("missing", "extra_forbidden") else f", got {shown(node)}"
    return f"{where}: key {key!r}: {first['msg']}{got}"
