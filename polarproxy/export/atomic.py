"""Writing an export file atomically: `out` is either the old file or the complete new one.

The file gets the mode a plain `open(out, "w")` would give it (0666 less the process umask), not the 0600
of the temporary file it is written through. While rows are written, the bytes written so far are synced
to disk in a background thread every `SYNC_AHEAD_BYTES`, so the sync before the rename (what makes the file
durable) waits only for the last stretch instead of the whole file, and the disk works while the rows are
made.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

SYNC_AHEAD_BYTES = 16 << 20


class AtomicFile:
    """The temporary file an export is written through: `write(bytes)`, which starts a background
    `fdatasync` each `every` bytes written (one at a time: a stretch written while one runs is synced by
    the next), or `path`, for a writer that opens the file itself (pyarrow writes Parquet through its own
    native file, without the GIL; the sync at the end covers what it wrote). `every` 0: never synced."""

    def __init__(self, f: BinaryIO, every: int, path: str) -> None:
        self._f = f
        self.path = path
        self._every = every
        self._unsynced = 0
        self._syncing: threading.Thread | None = None
        self._error: OSError | None = None

    def write(self, data: Any) -> int:
        n = self._f.write(data)
        self._unsynced += n
        if (
            self._every
            and self._unsynced >= self._every
            and (self._syncing is None or not self._syncing.is_alive())
        ):
            self._raise_if_failed()
            self._f.flush()  # hand the buffered bytes to the kernel, then sync them off this thread
            self._unsynced = 0
            self._syncing = threading.Thread(target=self._sync, name="export-sync", daemon=True)
            self._syncing.start()
        return n

    def append_file(self, path: str) -> None:
        """Append the bytes of file `path`, copied by the kernel (`copy_file_range`: no pass through this
        process), or read and written where the kernel cannot (another file system, an old kernel)."""
        self._raise_if_failed()
        self._f.flush()
        out = self._f.fileno()
        with open(path, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            try:
                while size > 0:
                    n = os.copy_file_range(src.fileno(), out, size)
                    if n == 0:
                        break
                    size -= n
                return
            except (AttributeError, OSError):  # no copy_file_range here: copy what is left through Python
                pass
            while chunk := src.read(1 << 20):
                self.write(chunk)

    def _sync(self) -> None:
        try:
            os.fdatasync(self._f.fileno())
        except OSError as exc:  # raised in the writer's thread, at the next sync or at the end
            self._error = exc

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def wait(self) -> None:
        """Wait for a running background sync (the file must not be closed under it)."""
        if self._syncing is not None:
            self._syncing.join()

    def finish(self) -> None:
        """After `wait`: raise the background sync's error, then flush and sync what is left (flush only
        for a file that is never synced)."""
        self._raise_if_failed()
        self._f.flush()
        if self._every:
            os.fsync(self._f.fileno())


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


def new_file_mode() -> int:
    """The mode `open(path, "w")` would give a new file: 0666 less the process umask."""
    return 0o666 & ~_umask()


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """Make the renames in `folder` durable (best effort: not every file system can sync a folder)."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


@contextmanager
def atomic_file(out: str | os.PathLike[str], *, durable: bool = True) -> Iterator[AtomicFile]:
    """A binary file to write `out` through: rows go to a temporary file in the same folder, which is synced
    and renamed over `out` when the block ends without an error, and removed when it raises. `durable`
    False: never synced (a part of a parallel export, which is synced once, where it is appended)."""
    path = Path(out)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, new_file_mode())
        with os.fdopen(fd, "wb") as f:
            ahead = AtomicFile(f, SYNC_AHEAD_BYTES if durable else 0, tmp_name)
            try:
                yield ahead
            finally:
                ahead.wait()
            ahead.finish()
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    if not durable:
        return
    sync_folder(path.parent)  # make the rename itself durable
