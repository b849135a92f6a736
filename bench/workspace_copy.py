"""Workspace copies: what each rollout sample pays to get its own copy of a task's repository, side by side
in one run: the way polarproxy copies (rollout/copying.py: a reflink where the file system shares blocks,
else the kernel's copy_file_range) against a plain read/write copy (what `shutil.copyfileobj` does).

    python bench/workspace_copy.py [--files 2000] [--mb 200] [--repeats 3] [--quick] [--json OUT]

A synthetic repository of `--files` files and `--mb` MB in all (sizes spread as a source tree's: many small,
a few large) is copied `--repeats` times each way, alternating; reported: seconds per copy (median), MB/s,
the disk space one copy took (statvfs, after a sync), and which way the file system allowed ('reflink',
'kernel', 'read'). The folder is made under
$POLARPROXY_BENCH_DIR (default: the system temp folder), whose file system decides the outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from polarproxy.rollout.copying import clone_data


def make_tree(root: Path, files: int, total_mb: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    weights = [rng.paretovariate(1.2) for _ in range(files)]
    scale = total_mb * (1 << 20) / sum(weights)
    written = 0
    for i, w in enumerate(weights):
        path = root / f"pkg{i % 40}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        size = max(1, int(w * scale))
        path.write_bytes(os.urandom(size))
        written += size
    return written


def _used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def copy_tree(src: Path, dst: Path, *, clone: bool) -> Counter[str]:
    ways: Counter[str] = Counter()

    def one(s: str, d: str) -> str:
        with open(s, "rb") as fsrc, open(d, "xb") as fdst:
            if clone:
                ways[clone_data(fsrc, fdst)] += 1
            else:
                shutil.copyfileobj(fsrc, fdst, 1 << 20)
                ways["read"] += 1
        shutil.copymode(s, d)
        return d

    shutil.copytree(src, dst, symlinks=True, copy_function=one)
    return ways


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="20 files, 2 MB, one repeat (the tests' smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.files, args.mb, args.repeats = 20, 2, 1
    base = Path(os.environ.get("POLARPROXY_BENCH_DIR") or tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=base, prefix="polarproxy-bench-copy-") as tmp:
        src = Path(tmp) / "repo"
        size = make_tree(src, args.files, args.mb)
        times: dict[str, list[float]] = {"polarproxy": [], "read/write": []}
        disk: dict[str, int] = {}
        ways: Counter[str] = Counter()
        for r in range(args.repeats):
            for name, clone in (("polarproxy", True), ("read/write", False)):
                dst = Path(tmp) / f"copy-{name.replace('/', '-')}-{r}"
                os.sync()
                before = _used(Path(tmp))
                t0 = time.perf_counter()
                got = copy_tree(src, dst, clone=clone)
                times[name].append(time.perf_counter() - t0)
                os.sync()
                disk[name] = _used(Path(tmp)) - before
                if clone:
                    ways.update(got)
                shutil.rmtree(dst)
    result = {
        "files": args.files,
        "bytes": size,
        "ways": dict(ways),
        **{
            name: {
                "s_median": statistics.median(ts),
                "mb_per_s": size / (1 << 20) / statistics.median(ts),
                "disk_bytes": disk[name],  # what one copy took on the file system (statvfs)
            }
            for name, ts in times.items()
        },
    }
    result["speedup"] = result["read/write"]["s_median"] / result["polarproxy"]["s_median"]
    print(
        f"{args.files} files, {size / (1 << 20):.0f} MB: polarproxy {result['polarproxy']['s_median']:.3f} s "
        f"({dict(ways)}, {disk['polarproxy'] / (1 << 20):.1f} MB on disk), read/write "
        f"{result['read/write']['s_median']:.3f} s ({disk['read/write'] / (1 << 20):.1f} MB); {result['speedup']:.2f}x"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
