"""Workspace copies (rollout/copying.py): data cloned where the file system shares blocks, else read and
written; both give the same bytes, a file system that refuses reflinks falls through, a real error is
raised."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from polarproxy.rollout import copying


def _copy(src: Path, dst: Path) -> str:
    with open(src, "rb") as fsrc, open(dst, "xb") as fdst:
        return copying.clone_data(fsrc, fdst)


@pytest.mark.parametrize("size", [0, 1, (1 << 20) + 7])
def test_every_way_gives_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    data = os.urandom(size)
    src = tmp_path / "src"
    src.write_bytes(data)
    first = _copy(src, tmp_path / "a")  # what this file system does (ext4: read; XFS, btrfs: reflink)
    assert first in ("reflink", "read") and (tmp_path / "a").read_bytes() == data

    def refuse(*args: object) -> None:
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(copying.fcntl, "ioctl", refuse)  # no reflinks here
    assert _copy(src, tmp_path / "b") == "read" and (tmp_path / "b").read_bytes() == data


def test_a_real_error_is_not_swallowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x" * 10)

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(copying.fcntl, "ioctl", full)
    with pytest.raises(OSError, match="No space left"):
        _copy(src, tmp_path / "d")


def test_a_sample_workspace_keeps_modes_and_links(tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "ws"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "run.sh").write_text("echo hi\n")
    (src / "pkg" / "run.sh").chmod(0o755)
    (src / "link").symlink_to("pkg/run.sh")
    shutil.copytree(src, tmp_path / "copy", symlinks=True, copy_function=copying.clone_file)
    assert (tmp_path / "copy" / "pkg" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert os.readlink(tmp_path / "copy" / "link") == "pkg/run.sh"
