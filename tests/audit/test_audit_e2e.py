"""The drift audit end to end: multi-turn episodes recorded through the real proxy (`polarproxy record`,
mitmproxy, the local backend over the tiny model answering from a script), then `polarproxy audit` run as
a subprocess and its figures checked against a computation of our own.

Two templates make a fresh render drift from what the model saw:
- the tiny model's own, Qwen3-style: it drops the reasoning of assistant turns before the last user
  message, so after a second user turn the history re-renders without it;
- a copy whose tool calls write their arguments through `tojson`, as the Llama 3.1 and Mistral templates
  do: the JSON text the harness sends back is re-serialized (here into a quoted string).
The recorded prompts still extend the earlier prompt + output token for token (T2).
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from pathlib import Path

import pytest
from audit_processes import audit, check_episode, record, scripted_backend

from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
REASONING = ("I should list the files.", "The listing is in.")
# The first call's arguments are sampled compact (`{"path":"."}`): a template that re-serializes them
# (`tojson` on the parsed object) writes `{"path": "."}` where the model saw its own compact text.
FIRST_CALL = (
    f"<think>\n{REASONING[0]}\n</think>\n\n"
    '<tool_call>\n{"name": "list_files", "arguments": {"path":"."}}\n</tool_call>'
)
SCRIPT = {
    "steps": [
        {"raw": FIRST_CALL},
        {"reasoning": REASONING[1], "text": "Two files."},
    ],
    "final": "Done.",
}
VERBATIM_ARGUMENTS = """{%- if f.arguments is string -%}
                    {{- f.arguments -}}
                {%- else -%}
                    {{- f.arguments | tojson -}}
                {%- endif -%}"""
TOJSON_ARGUMENTS = "{{- f.arguments | tojson -}}"


def reserializing_copy(model_dir: Path, out: Path) -> Path:
    """The model folder with a chat template that passes tool-call arguments through `tojson`."""
    shutil.copytree(model_dir, out)
    jinja = out / "chat_template.jinja"
    assert VERBATIM_ARGUMENTS in jinja.read_text(), "the tiny template changed: update this test"
    jinja.write_text(jinja.read_text().replace(VERBATIM_ARGUMENTS, TOJSON_ARGUMENTS))
    config = out / "tokenizer_config.json"
    data = json.loads(config.read_text())
    if "chat_template" in data:
        data["chat_template"] = data["chat_template"].replace(VERBATIM_ARGUMENTS, TOJSON_ARGUMENTS)
        config.write_text(json.dumps(data))
    return out


@pytest.fixture(scope="module")
def scripted_url(tiny_model_dir, tmp_path_factory):
    with scripted_backend(tiny_model_dir, SCRIPT, tmp_path_factory.mktemp("script")) as url:
        yield url


@pytest.fixture(scope="module")
def recorded(scripted_url, tiny_model_dir, tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    (ws / "README.md").write_text("# Sample\n")
    (ws / "main.py").write_text("print('hi')\n")
    db = tmp_path_factory.mktemp("db") / "audit.db"
    variant = reserializing_copy(tiny_model_dir, tmp_path_factory.mktemp("variant") / "tojson-args")
    agent = [sys.executable, str(HERE / "chat_agent.py")]
    reasoning_ep, _ = record(
        scripted_url, tiny_model_dir, db, ws, [*agent, "List the files.", "Again, please."]
    )
    arguments_ep, _ = record(scripted_url, variant, db, ws, [*agent, "List the files."])
    return {"db": db, "reasoning": (reasoning_ep, tiny_model_dir), "arguments": (arguments_ep, variant)}


@pytest.fixture(scope="module")
def report(recorded):
    r = audit(recorded["db"], "--json")  # every episode, each with the model folder it was recorded with
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def episode(report: dict, episode_id: str) -> dict:
    (ep,) = [e for e in report["episodes"] if e["episode_id"] == episode_id]
    return ep


def test_recorded_prompts_extend_the_earlier_prompt_and_output_token_exactly(recorded):
    store = Store.open(str(recorded["db"]))
    for key, n in (("reasoning", 4), ("arguments", 2)):
        calls = store.list_calls(recorded[key][0])
        assert [c.status for c in calls] == ["ok"] * n
        assert [c.render_mode for c in calls] == ["fresh"] + ["extended"] * (n - 1)
        for prev, cur in itertools.pairwise(calls):
            assert cur.extended_from == prev.id
            assert cur.prompt_ids[: len(prev.prompt_ids) + len(prev.output_ids)] == [
                *prev.prompt_ids,
                *prev.output_ids,
            ]


def test_audit_figures_match_an_independent_fresh_render(recorded, report):
    store = Store.open(str(recorded["db"]))
    totals = {"calls": 0, "audited": 0, "drifted": 0, "prompt_tokens": 0, "drifted_tokens": 0}
    for key in ("reasoning", "arguments"):
        eid, model = recorded[key]
        ep = episode(report, eid)
        assert ep["model_dir"] == str(model.resolve())  # the folder the episode was recorded with
        calls = store.list_calls(eid)
        totals["drifted"] += check_episode(ep, calls, Renderer(model))
        totals["calls"] += len(calls)
        totals["audited"] += len(calls)
        totals["prompt_tokens"] += ep["prompt_tokens"]
        totals["drifted_tokens"] += ep["drifted_tokens"]
    assert report["total"]["episodes"] == 2
    assert {k: report["total"][k] for k in totals} == totals


def test_dropped_reasoning_drifts_from_where_the_first_answer_began(recorded, report):
    eid, model = recorded["reasoning"]
    renderer = Renderer(model)
    calls = Store.open(str(recorded["db"])).list_calls(eid)
    rows = episode(report, eid)["per_call"]
    # within the first user turn the template keeps the reasoning: the extension re-renders identically
    assert [r["result"] for r in rows] == ["identical", "identical", "drifted", "drifted"]
    assert all(r["prefix_exact"] for r in rows[1:])
    for row in rows[2:]:
        # after the second user turn both earlier reasoning blocks are gone from the re-render
        assert row["first_diff"] == len(calls[0].prompt_ids)
        assert row["recorded_at_diff"].startswith("<think>")
        dropped = sum(len(renderer.encode(f"<think>\n{r}\n</think>\n\n")) for r in REASONING)
        assert row["recorded_tokens"] - row["fresh_tokens"] == dropped
        assert row["changed_recorded"] - row["changed_fresh"] == dropped


def test_re_serialized_tool_arguments_drift_inside_the_tool_call(recorded, report):
    eid, model = recorded["arguments"]
    renderer = Renderer(model)
    first, second = Store.open(str(recorded["db"])).list_calls(eid)
    rows = episode(report, eid)["per_call"]
    assert [r["result"] for r in rows] == ["identical", "drifted"] and rows[1]["prefix_exact"]
    at = rows[1]["first_diff"]
    start = len(first.prompt_ids)
    assert start < at < start + len(first.output_ids)
    before = renderer.decode(second.prompt_ids[start:at])  # what the model sampled, up to the drift
    assert FIRST_CALL.startswith(before) and '"arguments"' in before  # the drift is inside the arguments
    assert '"path": "."' in before + rows[1]["fresh_at_diff"]  # the re-render's spacing
    assert '"path":"."' in before + rows[1]["recorded_at_diff"]  # what the model sampled


def test_human_output_is_a_table_per_episode_and_totals(recorded):
    eid, _ = recorded["reasoning"]
    r = audit(recorded["db"], eid[:-2], columns=200)  # a prefix (the first 10 characters are a time: shared)
    assert r.returncode == 0, r.stderr
    assert f"episode {eid}: 2 of 4 audited calls drift" in r.stdout
    assert "extends #0" in r.stdout and "identical" in r.stdout
    first = Store.open(str(recorded["db"])).list_calls(eid)[0]
    assert f"#2 at {len(first.prompt_ids)}: model saw '<think>" in r.stdout
    assert "total" in r.stdout and "unexpected" not in r.stdout
