"""The evaluate stage's copy of a workspace the agent left: regular files, folders and symlinks that stay
inside the workspace, nothing else. FIFOs, sockets and devices are skipped and counted (a FIFO would hang the
copy); a symlink that leads out of the workspace is skipped and counted, never followed (it would copy a
host file, or the store, into what the verifier reads); the total is capped by apparent size, so a sparse
file counts for what it claims to hold. Nothing is read through a link.

File data is cloned where the file system shares blocks (`clone_data`: a reflink on btrfs, XFS, bcachefs,
OpenZFS 2.2: the copy costs metadata only until the agent writes), else read and written here. A sample's workspace (prewarm: `copy_tree`) and the
evaluate stage's copies all go this way, so a repository of hundreds of MB costs each sample little where
the disk can share it."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
# errors that mean "this file system (or pair of them) cannot do that": fall back to the next way
_CANNOT = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM}


def clone_data(fsrc: BinaryIO, fdst: BinaryIO) -> str:
    """Copy an open file's data into an empty one: a reflink where the file system shares blocks, else a
    read/write loop (the kernel's copy_file_range measured no faster on ext4, bench/workspace_copy.py).
    Returns the way used ('reflink' or 'read')."""
    src, dst = fsrc.fileno(), fdst.fileno()
    try:
        fcntl.ioctl(dst, FICLONE, src)
        return "reflink"
    except OSError as e:
        if e.errno not in _CANNOT:
            raise
    shutil.copyfileobj(fsrc, fdst, 1 << 20)
    return "read"


def clone_file(src: str, dst: str) -> str:
    """`shutil.copytree`'s copy_function: the data as `clone_data` copies it, then the mode and times."""
    with open(src, "rb") as fsrc, open(dst, "xb") as fdst:
        clone_data(fsrc, fdst)
    shutil.copystat(src, dst)
    return dst


class WorkspaceTooLarge(Exception):
    """The workspace holds more than the cap allows; the message names both."""


@dataclass
class CopyReport:
    files: int = 0
    bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # kind -> count (fifo, socket, device, link-out)

    def skip(self, kind: str) -> None:
        self.skipped[kind] = self.skipped.get(kind, 0) + 1


def _inside(root: Path, link: Path) -> bool:
    """Whether the symlink `link` (under `root`) resolves to a path inside `root`, without reading through it
    more than the resolution itself does."""
    target = os.readlink(link)
    resolved = Path(os.path.normpath(os.path.join(link.parent, target)))
    try:
        real = resolved.resolve(strict=False)
    except (OSError, RuntimeError):  # a loop
        return False
    return real == root or root in real.parents


def _relative_target(root: Path, link: Path) -> str | None:
    """The link's target, relative to its folder, when it stays inside `root` both as written and resolved;
    else None. An absolute target is made relative: in the copy it must name the copy's file, never lead back
    into the folder it was copied from (the agent's live workspace, whose links out were not copied)."""
    lexical = Path(os.path.normpath(os.path.join(link.parent, os.readlink(link))))
    if not (lexical == root or root in lexical.parents) or not _inside(root, link):
        return None
    return os.path.relpath(lexical, link.parent)


def under_link(root: Path, rel: Path) -> bool:
    """Whether a folder on the way from `root` to `root/rel` is a symlink (or not a folder): a path to read or
    change through there would go where the link leads, not where `rel` says."""
    here = root
    for part in rel.parts[:-1]:
        here = here / part
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                return True
        except FileNotFoundError:
            return False
    return False


def copy_workspace(src: Path, dst: Path, *, max_bytes: int | None) -> CopyReport:
    """Copy `src` to `dst` (which must not exist) as described above. Raises WorkspaceTooLarge past
    `max_bytes` (apparent sizes), OSError when a file cannot be read."""
    root = src.resolve()
    report = CopyReport()
    dst.mkdir(parents=True)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        out = dst / here.relative_to(root)
        for name in list(dirnames):
            path = here / name
            if path.is_symlink():  # os.walk lists a link to a folder among the folders: copy it as a link
                dirnames.remove(name)
                filenames.append(name)
            else:
                (out / name).mkdir()
        for name in filenames:
            path = here / name
            st = os.lstat(path)
            mode = st.st_mode
            if stat.S_ISLNK(mode):
                target = _relative_target(root, path)
                if target is not None:
                    os.symlink(target, out / name)
                    report.files += 1
                else:
                    report.skip("link-out")
                continue
            if stat.S_ISFIFO(mode):
                report.skip("fifo")
                continue
            if stat.S_ISSOCK(mode):
                report.skip("socket")
                continue
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                report.skip("device")
                continue
            if not stat.S_ISREG(mode):
                report.skip("other")
                continue
            report.bytes += st.st_size
            if max_bytes is not None and report.bytes > max_bytes:
                raise WorkspaceTooLarge(
                    f"the workspace holds more than {max_bytes} bytes (at {path.relative_to(root)}); "
                    "raise --max-workspace-bytes, or the agent wrote too much"
                )
            with open(path, "rb", opener=no_follow) as fsrc, open(out / name, "xb") as fdst:
                clone_data(fsrc, fdst)
            os.chmod(out / name, stat.S_IMODE(mode))
            report.files += 1
    return report


def no_follow(path: str, flags: int) -> int:
    """An `open()` opener that never follows a link at the path's end and never blocks on a FIFO."""
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
