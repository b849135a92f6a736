"""Writing an export file atomically: `out` is either the old file or the complete new one.

The file gets the mode a plain `open(out, "w")` would give it (0666 less the process umask), not the 0600
of the temporary file it is written through.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def _umask() -> int:
    """The process umask, read without changing it where Linux says it (/proc), else set and restored."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(out: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write `out` through: rows go to a temporary file in the same folder, which is synced
    and renamed over `out` when the block ends without an error, and removed when it raises."""
    path = Path(out)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
