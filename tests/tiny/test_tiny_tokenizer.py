"""The tiny tokenizer: byte-level BPE with Qwen-style pre-tokenization, exact round trips."""

from __future__ import annotations

import json
import random

import pytest

from polarproxy.tiny.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, SPLIT_PATTERN, train_tokenizer


@pytest.fixture(scope="module")
def tok(random_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(random_model_dir)


SAMPLES = [
    "",
    " ",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nwindows newlines\n\n\nand blank lines\n",
    "café naïve façade Zürich — “quotes” … 日本語のテキスト 中文 한국어 Привет мир العربية עברית हिन्दी",
    "emoji 🙂🚀👩‍💻🏳️‍🌈 and combining e\u0301 a\u0308 and zero\u200bwidth",
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    "$ ls -la | grep '*.py' && echo \"$HOME\" > /tmp/out.txt 2>&1",
    '{"name": "list_files", "arguments": {"path": "."}, "n": -1.5e-3, "ok": true, "none": null}',
    "<|im_start|>user\nhi<|im_end|>\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call>",
    "<|im_start <think </think> <tool_call <|endoftext|",
    "NUL\x00 and DEL\x7f and \x1b[31mcolors\x1b[0m",
    "1234567890 3.14159 0xDEADBEEF 1e10",
    "I'm sure they'll say it's 'fine' -- they've DONE IT'S thing",
]


def _random_text(rng: random.Random) -> str:
    ranges = [
        (0x20, 0x7E),
        (0x00, 0x1F),
        (0xA0, 0x24F),
        (0x370, 0x4FF),
        (0x3040, 0x30FF),
        (0x4E00, 0x4FFF),
        (0xAC00, 0xAC8F),
        (0x1F300, 0x1F64F),
        (0x10000, 0x1007F),
    ]
    chars = []
    for _ in range(rng.randint(0, 60)):
        lo, hi = rng.choice(ranges)
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


def test_tokenizer_round_trips_fixed_samples_exactly(tok):
    for text in SAMPLES:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_tokenizer_round_trips_random_unicode_exactly(tok):
    rng = random.Random(7)
    for _ in range(300):
        text = _random_text(rng)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_special_and_added_tokens_are_single_ids(tok):
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, t
        assert tok.convert_ids_to_tokens(ids[0]) == t
        # inside text too
        inner = tok(f"a{t}b", add_special_tokens=False)["input_ids"]
        assert ids[0] in inner


def test_special_tokens_are_skipped_but_tags_are_kept_on_decode(tok):
    ids = tok(
        "<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>y</tool_call><|im_end|>",
        add_special_tokens=False,
    )["input_ids"]
    assert (
        tok.decode(ids, skip_special_tokens=True)
        == "assistant\n<think>\nx\n</think>\n\n<tool_call>y</tool_call>"
    )


def test_tokenizer_config_names_eos_and_pad(tok):
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert tok.bos_token is None
    assert len(tok) == 4096
    assert tok("plain text")["input_ids"] == tok("plain text", add_special_tokens=False)["input_ids"]


def test_tokenizer_json_uses_qwen_split_then_byte_level(random_model_dir):
    spec = json.loads((random_model_dir / "tokenizer.json").read_text())
    pre = spec["pre_tokenizer"]
    assert pre["type"] == "Sequence"
    split, byte_level = pre["pretokenizers"]
    assert split["type"] == "Split" and split["pattern"]["Regex"] == SPLIT_PATTERN
    assert split["behavior"] == "Isolated"
    assert byte_level["type"] == "ByteLevel"
    assert byte_level["add_prefix_space"] is False and byte_level["use_regex"] is False
    assert spec["decoder"]["type"] == "ByteLevel"
    assert spec["model"]["type"] == "BPE"
    flags = {t["content"]: t["special"] for t in spec["added_tokens"]}
    assert flags == {**dict.fromkeys(SPECIAL_TOKENS, True), **dict.fromkeys(ADDED_TOKENS, False)}


def test_tokenizer_training_is_deterministic():
    assert train_tokenizer(0).to_str() == train_tokenizer(0).to_str()
