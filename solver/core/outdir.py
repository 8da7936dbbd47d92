"""An output folder written whole: files go into a temporary folder beside it, which is renamed
into place only once complete, so an interrupted write leaves the old folder (or none).

Check the path first with :func:`solver.core.files.check_output_dir`; ``mtpp export`` and
``mtpp shard --out`` both write through here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path


def temp_dir_beside(out_dir: Path) -> Path:
    """A new empty folder in ``out_dir``'s parent (created if needed), hidden, with the mode a
    plain ``mkdir`` would give (``mkdtemp`` makes 0700)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp


def replace_dir(tmp: Path, out_dir: Path) -> None:
    """Rename the complete folder ``tmp`` to ``out_dir``.

    An existing ``out_dir`` (already allowed by :func:`solver.core.files.check_output_dir`) is
    renamed aside first and deleted only once the new folder is in place; if that rename
    fails, the old folder is put back.
    """
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except BaseException:
        os.replace(old, out_dir)
        raise
    if old.is_symlink():  # the user named a link to a folder: drop the link, not its target
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)
