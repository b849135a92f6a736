"""Where the long-context benchmark's proxy time goes (bench/long_context.py `--profile`): py-spy's
collapsed stacks by stage, and the per-call operations on the whole prompt or request timed alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

# Stages: the first frame from the leaf up that matches a rule (function name or "", part of its file) names
# the stage; frames of the stdlib's plumbing are passed over unless no frame above them matches.
STAGES: list[tuple[str, str, str]] = [
    ("tokenizer (encode/decode)", "", "tokenizers"),
    ("tokenizer (encode/decode)", "encode", "render/renderer.py"),
    ("tokenizer (encode/decode)", "decode", "render/renderer.py"),
    ("chat template (jinja, tail render)", "", "jinja2"),
    ("chat template (jinja, tail render)", "", "render/renderer.py"),
    ("T2 prefix check (_mismatch: message comparison)", "_mismatch", "render/prefix.py"),
    ("T2 prompt assembly (one int32 array)", "build", "render/prefix.py"),
    ("T2 other (prefix.py)", "", "render/prefix.py"),
    ("T2 index: int32 arrays of the turn (_finish_ok)", "_finish_ok", "capture/gateway.py"),
    ("store: pack_ids (the prompt array's bytes)", "pack_ids", "store/arrays.py"),
    ("store: conversation JSON (to_dict + orjson)", "_dumps", "store/call_writes.py"),
    ("store: conversation JSON (to_dict + orjson)", "to_dict", "polarproxy/conversation.py"),
    ("store: body edits (textdelta)", "", "store/textdelta.py"),
    ("store: base choice, prefix compare (bases.py)", "", "store/bases.py"),
    ("store: SQL (sqlalchemy, sqlite3)", "", "sqlalchemy"),
    ("store: SQL (sqlalchemy, sqlite3)", "", "sqlite3"),
    ("store: other", "", "polarproxy/store/"),
    ("store writer thread (queue, settle)", "", "store/writer.py"),
    ("request parse (dialect, conversation)", "", "polarproxy/dialects/"),
    ("request parse (dialect, conversation)", "", "polarproxy/conversation.py"),
    ("addon (request parse, redaction, hand-off)", "", "capture/addon.py"),
    ("backend /generate (JSON of input_ids, HTTP)", "", "polarproxy/backends/"),
    ("responder (second hop: body read again, answer)", "", "capture/responder.py"),
    ("gateway other", "", "capture/gateway.py"),
    ("polarproxy other", "", "polarproxy/"),
    ("mitmproxy (HTTP parse, flows, forwarding)", "", "mitmproxy"),
    ("mitmproxy (HTTP parse, flows, forwarding)", "", "h11"),
]
PLUMBING: list[tuple[str, str]] = [
    ("asyncio (loop, transports)", "asyncio/"),
    ("threads (pool, hand-off)", "concurrent/"),
    ("threads (pool, hand-off)", "threading.py"),
    ("threads (pool, hand-off)", "queue.py"),
]
# a thread waiting: in select, a pool's or a queue's wait, a sleep, the store writer's queue get (its leaf)
IDLE_LEAVES = ("select", "_worker", "wait", "get", "sleep", "_work")


def stage_of(frames: list[str]) -> str:
    plumbing = None
    for frame in reversed(frames):
        name, _, where = frame.partition(" (")
        hit = next(
            (st for st, fn, part in STAGES if part in where and (not fn or fn == name.rsplit(".", 1)[-1])),
            None,
        )
        if hit is not None:
            return hit
        if plumbing is None:
            plumbing = next((st for st, part in PLUMBING if part in where), None)
    return plumbing or "other"


def where_time_goes(raw: str, cpu_ms_per_call: float) -> dict[str, Any]:
    """Shares of py-spy's busy samples (collapsed stacks, 'frame;frame;... count') by stage, and the
    milliseconds per call they stand for. Samples of a thread waiting (a leaf in select, a pool's or a
    queue's wait) and of the bench's own gc watcher are left out."""
    stages: dict[str, int] = {}
    leaf_funcs: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        leaf = frames[-1]
        leaf_name = leaf.partition(" (")[0].rsplit(".", 1)[-1]
        if (
            leaf_name in IDLE_LEAVES
            or "(threading.py" in leaf
            or "(selectors.py" in leaf
            or "(<string>" in stack
        ):
            continue
        total += n
        leaf_funcs[leaf] = leaf_funcs.get(leaf, 0) + n
        stage = stage_of(frames)
        stages[stage] = stages.get(stage, 0) + n
    order = sorted(stages.items(), key=lambda kv: -kv[1])
    top = sorted(leaf_funcs.items(), key=lambda kv: -kv[1])[:15]
    return {
        "busy_samples": total,
        "stage_share": {k: round(v / total, 3) for k, v in order} if total else {},
        "stage_ms_per_call": {k: round(cpu_ms_per_call * v / total, 3) for k, v in order} if total else {},
        "top_leaf_frames": [{"frame": f, "share": round(n / total, 3)} for f, n in top] if total else [],
    }


# -- the per-call operations whose cost grows with the prompt, timed in this process ----------------------


def _best_ms(fn: Any, repeats: int = 15) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def _case_operations(
    messages: list[dict[str, Any]], tools: list[Any], r: Any, output_ids: list[int]
) -> dict[str, Any]:
    from array import array

    from polarproxy.backends.wire import _json_default
    from polarproxy.dialects.openai_chat import OpenAIChat
    from polarproxy.dialects.resend import ResentBodies
    from polarproxy.store import textdelta
    from polarproxy.store.arrays import int32_array, pack_ids
    from polarproxy.store.bases import Known, choose_base

    last, prev = messages[:-1], messages[:-3]  # the last call's messages, and the one before's

    def body_of(msgs: list[dict[str, Any]]) -> bytes:
        return orjson.dumps({"model": "tiny", "messages": msgs, "tools": tools, "max_tokens": 64})

    body, prev_body = body_of(last), body_of(prev)
    conv, prev_conv = OpenAIChat().parse(orjson.loads(body)), OpenAIChat().parse(orjson.loads(prev_body))
    ids = r.render(conv).ids
    # The forms the proxy holds them in (render/prefix.py): the earlier call's prompt and output as int32
    # arrays, the tail's IDs as the tokenizer gives them (a list); the prompt is their join, an array.
    turn_prompt, turn_out, tail = array("i", ids[:-60]), array("i", output_ids), ids[-60 + 36 :]
    prompt = turn_prompt + turn_out + array("i", tail)
    packed = pack_ids(prompt)
    earlier = Known("c0", "e0", pack_ids(turn_prompt + turn_out), len(turn_prompt), len(turn_out))
    conv_json, prev_json = (
        orjson.dumps(conv.to_dict()).decode(),
        orjson.dumps(prev_conv.to_dict()).decode(),
    )
    n = len(prev_conv.messages)
    # the addon's parse (dialects/resend.py): the earlier body's layout in place, then this body
    resent = ResentBodies()
    prev_resent = resent.parse(OpenAIChat(), "e", prev_body, path="", query={})
    layout = resent._layouts.get("e")

    def parse_resent() -> Any:
        if layout is not None:
            resent._layouts["e"] = layout
        return resent.parse(OpenAIChat(), "e", body, path="", query={})

    conv_resent = parse_resent()
    ops = {
        "T2 prompt assembly (prompt + output + tail arrays)": lambda: (
            turn_prompt + turn_out + array("i", tail)
        ),
        "pack_ids for the store (an int32 array's bytes)": lambda: pack_ids(prompt),
        "int32 array for the T2 index (_finish_ok, no copy)": lambda: int32_array(prompt),
        "store base choice (prefix compare, bases.py)": lambda: choose_base(
            packed, [earlier], hint="c0", hint_len=None
        ),
        "JSON of input_ids for /generate (orjson, numpy view)": lambda: orjson.dumps(
            {"input_ids": prompt, "stream": False}, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY
        ),
        "request parse (the addon's: from 16 KB, new messages only)": parse_resent,
        "conversation to_dict (addon)": conv.to_dict,
        "conversation JSON (store, orjson)": lambda: orjson.dumps(conv.to_dict()).decode(),
        "T2 message comparison (_mismatch)": lambda: all(
            a is b or a == b for a, b in zip(conv_resent.messages[:n], prev_resent.messages, strict=True)
        ),
        "body edits vs the earlier call (textdelta.encode)": lambda: textdelta.encode(
            (prev_body.decode(), prev_json), (body.decode(), conv_json)
        ),
    }
    return {
        "prompt_tokens": len(ids),
        "request_body_kb": round(len(body) / 1024, 1),
        "ms": {k: round(_best_ms(fn), 3) for k, fn in ops.items()},
    }


def operation_costs(
    model_dir: Path, episodes: list[Any], tools: list[Any], output_ids: list[int]
) -> dict[str, Any]:
    """Best-of-15 milliseconds of each per-call operation the proxy runs on the whole prompt or the whole
    request, on the last call of a finished 1k and 32k episode (the real bodies and token IDs), with the
    same functions the proxy calls, on the values in the forms it holds them. What the proxy does with the
    prompt (gateway.py, prefix.py, store): joins it as one int32 array (T2: earlier prompt + output + tail),
    packs that array's bytes for the store (pack_ids) and compares them with the base's (bases.py), keeps
    the same array in the T2 index, writes it as JSON for /generate through a numpy view; parses the request,
    turns the conversation into a dict (addon) and JSON (store), compares its messages with the earlier
    call's (T2), and stores both bodies as edits of the earlier call's (textdelta)."""
    from polarproxy.render.renderer import Renderer

    r = Renderer(model_dir)
    out: dict[str, Any] = {}
    for case in ("1k", "32k"):
        ep = next(e for e in reversed(episodes) if e.case == case and e.done())
        out[case] = _case_operations(ep.messages, tools, r, output_ids)
    growth = {k: round(out["32k"]["ms"][k] - out["1k"]["ms"][k], 3) for k in out["1k"]["ms"]}
    out["growth_ms"] = dict(sorted(growth.items(), key=lambda kv: -kv[1]))
    out["growth_ms_total"] = round(sum(growth.values()), 3)
    return out
