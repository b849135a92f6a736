"""A model folder's tokenizer as transformers reads it, kept so that later loads do not import transformers.

What a folder's tokenizer files mean is transformers' to say: which special tokens it names (from
tokenizer_config.json, special_tokens_map.json or the added tokens), which chat templates
(chat_template.jinja, chat_templates/, chat_template.json, tokenizer_config.json), and the Rust tokenizer
it builds from tokenizer.json. The first load of a folder asks transformers (~1.2 s: its import reads the
source of every model module) and writes down what it found: the Rust tokenizer as transformers built it
(`tokenizer.json`), the chat templates and the named special tokens (`chat.json`). A later load of the
same files with the same transformers reads that back (~0.1 s with the `tokenizers` import) and renders
with render/chat_template.py, as the first load does too: one way of rendering either way.

A snapshot is found by a hash of the folder's tokenizer files' contents and of the installed transformers
and tokenizers (their versions and package files), so an edited template, a new tokenizer or an upgrade of
either gets a new one. They live in `$POLARPROXY_CACHE_DIR/tokenizers/`, else `$XDG_CACHE_HOME/polarproxy/tokenizers/`
(`~/.cache/polarproxy/tokenizers/`), each written to a temporary folder and renamed into place (processes
loading the same folder at once write the same thing; one rename wins). A snapshot that cannot be read is
made again; a cache that cannot be written is skipped (the load still works, a debug log says why).
`POLARPROXY_TOKENIZER_CACHE=0` turns the cache off: every load asks transformers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from polarproxy.render.chat_template import ChatTokenizer

log = logging.getLogger("polarproxy.render")

FORMAT = 1  # of chat.json; a change makes new snapshots
CACHE_ENV = "POLARPROXY_CACHE_DIR"
SWITCH_ENV = "POLARPROXY_TOKENIZER_CACHE"
# The files transformers reads to load a tokenizer (and the folder of extra chat templates).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
)
TEMPLATES_DIR = "chat_templates"

# transformers' lazy module is not safe to import from two threads at once (one of them can get "cannot
# import name ..." from the half-initialized package): loads in this process take turns.
_TRANSFORMERS_LOCK = threading.Lock()


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "polarproxy"


def _package_stamp(name: str) -> str:
    """An installed package, named without importing it: its dist-info folder and package file."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return f"{name} absent"
    origin = Path(spec.origin)
    st = origin.stat()
    dists = sorted(p.name for p in origin.parent.parent.glob(f"{name}-*.dist-info"))
    return f"{','.join(dists)}:{origin}:{st.st_size}:{st.st_mtime_ns}"


def snapshot_key(path: Path) -> str:
    """The hash that names `path`'s snapshot (see the module's doc)."""
    h = hashlib.blake2b(digest_size=16)
    stamps = "\0".join(_package_stamp(p) for p in ("transformers", "tokenizers"))
    h.update(f"polarproxy-tokenizer-snapshot:{FORMAT}\0{stamps}\0".encode())
    files = [path / name for name in TOKENIZER_FILES]
    templates = path / TEMPLATES_DIR
    if templates.is_dir():
        files += sorted(templates.glob("*.jinja"))
    for f in files:
        if f.is_file():
            h.update(f"{f.relative_to(path)}\0{f.stat().st_size}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _from_transformers(path: Path) -> Any:
    """transformers' tokenizer of a folder. `PreTrainedTokenizerFast` reads tokenizer.json, the special
    tokens and the chat template without importing torch (`AutoTokenizer` imports it: +500 MB in the
    proxy); folders without tokenizer.json fall back to AutoTokenizer."""
    with _TRANSFORMERS_LOCK:
        if (path / "tokenizer.json").is_file():
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _read(folder: Path) -> ChatTokenizer | None:
    from tokenizers import Tokenizer

    try:
        chat = json.loads((folder / "chat.json").read_text(encoding="utf-8"))
        if not isinstance(chat, dict) or chat.get("format") != FORMAT:
            return None
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return ChatTokenizer(backend, chat["chat_template"], chat["special_tokens"])
    except Exception as e:  # any damage (a partial file, an old layout): make it again
        log.debug("tokenizer snapshot %s unreadable (%s): making it again", folder, e)
        return None


def _write(folder: Path, tokenizer: ChatTokenizer) -> None:
    chat = {
        "format": FORMAT,
        "chat_template": tokenizer.chat_template,
        "special_tokens": tokenizer.special_tokens_map,
    }
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".writing-"))
    except OSError as e:
        log.debug("tokenizer cache %s not writable (%s): not kept", folder.parent, e)
        return
    try:
        tokenizer.backend_tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "chat.json").write_text(json.dumps(chat, ensure_ascii=False), encoding="utf-8")
        os.rename(tmp, folder)
    except OSError as e:  # another process put it there first, or the disk is full: either way, go on
        log.debug("tokenizer snapshot %s not written (%s)", folder, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(path: Path) -> ChatTokenizer:
    """The folder's ChatTokenizer: from its snapshot when there is one, else read by transformers (and the
    snapshot written). Raises what transformers raises for a folder it cannot read."""
    use_cache = os.environ.get(SWITCH_ENV, "1") != "0"
    folder = cache_root() / "tokenizers" / snapshot_key(path) if use_cache else None
    if folder is not None and folder.is_dir():
        found = _read(folder)
        if found is not None:
            return found
        shutil.rmtree(folder, ignore_errors=True)
    tok = _from_transformers(path)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"transformers loaded a tokenizer without a Rust backend ({type(tok).__name__}).")
    template = tok.chat_template
    chat = ChatTokenizer(
        backend, dict(template) if isinstance(template, dict) else template, dict(tok.special_tokens_map)
    )
    if folder is not None:
        _write(folder, chat)
    return chat
