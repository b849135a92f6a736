"""render/chat_template.py renders as transformers does, and render/snapshot.py keeps what transformers read.

Every real template of ../shared/fixtures/chat-templates (and the tiny one) renders the conversations of
a standard episode (tool calls, tool results, reasoning, a cut answer, a follow-up), and hand-made edge
cases (content null, reasoning under each of its names, no tools, an empty tool list, a refusal), through
transformers' `apply_chat_template` and through ours: the texts (or the errors) must be the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jinja2 import TemplateError
from real_templates import NAMES, TOOLS, run_standard_episode, template_folder

from polarproxy.render import snapshot
from polarproxy.render.chat_template import ChatTokenizer
from polarproxy.render.renderer import Renderer, template_messages, template_tool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(snapshot.CACHE_ENV, str(root))
    monkeypatch.delenv(snapshot.SWITCH_ENV, raising=False)
    return root


def _transformers(folder: Path):
    return snapshot._from_transformers(folder)


EDGE_CASES = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "list_files", "arguments": '{"path": "."}'},
                }
            ],
        },
        {"role": "tool", "content": "a\nb", "tool_call_id": "c1", "name": "list_files"},
    ],
    [
        {"role": "user", "content": "think"},
        {"role": "assistant", "content": "yes", "reasoning_content": "because"},
        {"role": "user", "content": "again"},
    ],
    [
        {"role": "user", "content": "think"},
        {"role": "assistant", "content": "yes", "reasoning": "old name"},
        {"role": "user", "content": "again"},
    ],
    [
        {"role": "user", "content": "think"},
        {"role": "assistant", "content": "yes", "thinking": "gpt-oss name", "reasoning_content": None},
        {"role": "user", "content": "again"},
    ],
    [{"role": "assistant", "content": "an assistant first"}],
    [{"role": "user", "content": '<|im_start|> & <b>html</b> \u00e9 "quotes"'}],
]


def _render_both(theirs, ours: ChatTokenizer, messages, tools, gen: bool):
    results = []
    for tok, kw in ((theirs, {"tokenize": False}), (ours, {})):
        try:
            results.append(
                ("text", tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, **kw))
            )
        except TemplateError as e:
            results.append(("refused", str(e)))
        except (TypeError, ValueError) as e:  # e.g. `arguments|items` of a JSON string
            results.append((type(e).__name__, str(e)))
    return results


@pytest.mark.parametrize("name", NAMES)
def test_every_real_template_renders_as_transformers_renders_it(name, cache):
    folder = template_folder(name)
    theirs = _transformers(folder)
    ours = snapshot.load(folder)
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert ours.chat_template == theirs.chat_template
    assert ours.eos_token_id == theirs.eos_token_id
    assert ours.get_added_vocab() == theirs.get_added_vocab()
    tools = [template_tool(t) for t in TOOLS]
    episode = run_standard_episode(name)
    r = episode.r
    cases = [template_messages(c.conversation.messages, r.arguments_form) for c in episode.calls]
    cases += EDGE_CASES
    compared = 0
    for messages in cases:
        for tool_list in (tools, None, []):
            for gen in (True, False):
                a, b = _render_both(theirs, ours, messages, tool_list, gen)
                assert a == b, (name, messages, tool_list, gen)
                compared += a[0] == "text"
    assert compared > len(cases)  # most of them render: the comparison is of texts, not of two refusals
    text = theirs.apply_chat_template(cases[0], tools=tools, tokenize=False)
    assert Renderer(folder).encode(text) == theirs.encode(text, add_special_tokens=False)


def test_a_second_load_reads_the_snapshot_and_gives_the_same_tokenizer(tiny_model_dir, cache, monkeypatch):
    first = snapshot.load(tiny_model_dir)
    made = list((cache / "tokenizers").iterdir())
    assert len(made) == 1 and {p.name for p in made[0].iterdir()} == {"tokenizer.json", "chat.json"}

    def no_transformers(path):
        raise AssertionError("the snapshot was there: transformers must not be asked")

    monkeypatch.setattr(snapshot, "_from_transformers", no_transformers)
    second = snapshot.load(tiny_model_dir)
    assert second.chat_template == first.chat_template
    assert second.special_tokens_map == first.special_tokens_map
    text = "<|im_start|>user\nhello there, 123<|im_end|>"
    encode = [t.backend_tokenizer.encode(text, add_special_tokens=False).ids for t in (first, second)]
    assert encode[0] == encode[1]
    assert second.backend_tokenizer.get_vocab_size() == first.backend_tokenizer.get_vocab_size()


def test_an_edited_template_gets_a_new_snapshot(tiny_model_dir, cache, tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    before = snapshot.load(folder)
    template = folder / "chat_template.jinja"
    template.write_text(template.read_text() + "{# edited #}")
    after = snapshot.load(folder)
    assert after.chat_template == before.chat_template + "{# edited #}"
    assert len(list((cache / "tokenizers").iterdir())) == 2


def test_a_damaged_snapshot_is_made_again(tiny_model_dir, cache):
    snapshot.load(tiny_model_dir)
    (folder,) = (cache / "tokenizers").iterdir()
    (folder / "chat.json").write_text("{not json")
    again = snapshot.load(tiny_model_dir)
    assert again.chat_template and json.loads((folder / "chat.json").read_text())["format"] == snapshot.FORMAT


def test_an_unwritable_cache_still_loads(tiny_model_dir, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(snapshot.CACHE_ENV, str(blocker))  # a file where the folder would go
    assert snapshot.load(tiny_model_dir).chat_template


def test_the_cache_can_be_turned_off(tiny_model_dir, cache, monkeypatch):
    monkeypatch.setenv(snapshot.SWITCH_ENV, "0")
    assert snapshot.load(tiny_model_dir).chat_template
    assert not cache.exists()


def test_a_renderer_loaded_from_its_snapshot_never_imports_transformers(tiny_model_dir, cache):
    code = (
        "import sys\n"
        "from polarproxy.render.renderer import Renderer\n"
        f"r = Renderer({str(tiny_model_dir)!r})\n"
        "from polarproxy.conversation import Conversation, Message\n"
        "ids = r.render(Conversation(messages=[Message(role='user', content='hi')])).ids\n"
        "print(len(ids), 'transformers' in sys.modules)\n"
    )
    env = {**os.environ, snapshot.CACHE_ENV: str(cache)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert runs[0][0] == runs[1][0] != "0"
    assert runs[0][1] == "True" and runs[1][1] == "False"  # the first load asked transformers, the second not
    assert Renderer(tiny_model_dir).tokenizer.eos_token
