"""The audit over hand-made stores: fresh renders compared with recorded prompts, per call, per episode
and in total; skipped calls and the sanity flags."""

from __future__ import annotations

import pytest
from audit_stores import TOOLS, Episode2, add_call, reasoning_episode
from typer.testing import CliRunner

from polarproxy.audit import audit_store
from polarproxy.cli import app
from polarproxy.conversation import Completion, Conversation, Message, ToolCall
from polarproxy.errors import UsageError
from polarproxy.store import EpisodeStart
from polarproxy.store.errors import NotFoundError


def first_diff(a: list[int], b: list[int]) -> int | None:
    """Independent of the audit: the plain definition."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_dropped_reasoning_drifts_at_the_start_of_the_earlier_output(store, renderer, tiny_model_dir):
    ep = reasoning_episode(store, renderer)
    report = audit_store(store, [ep.episode_id], tiny_model_dir)
    (audit,) = report.episodes
    c1, c2 = audit.calls
    assert c1.result == "identical" and c1.render_mode == "fresh" and not c1.unexpected
    assert c2.result == "drifted" and c2.render_mode == "extended" and c2.prefix_exact is True
    fresh = renderer.render(ep.second).ids
    assert c2.diff.first_diff == first_diff(ep.prompt2, fresh) == len(ep.prompt1)  # where <think> began
    assert c2.diff.drifted_tokens == len(ep.prompt2) - len(ep.prompt1)
    think = renderer.encode("<think>\nI should list.\n</think>\n\n")
    assert (c2.diff.changed_recorded, c2.diff.changed_fresh) == (len(think), 0)
    assert c2.recorded_at_diff.startswith("<think>") and c2.fresh_at_diff.startswith("<tool_call>")
    s = audit.summary
    assert (s.calls, s.audited, s.identical, s.drifted, s.unexpected, s.prefix_breaks) == (2, 2, 1, 1, 0, 0)
    assert s.prompt_tokens == len(ep.prompt1) + len(ep.prompt2)
    assert s.drifted_share == pytest.approx((len(ep.prompt2) - len(ep.prompt1)) / s.prompt_tokens)


def test_re_serialized_tool_arguments_drift_inside_the_tool_call(store, renderer, tiny_model_dir):
    # the model wrote compact JSON; the harness got (and sent back) the arguments re-serialized
    call = ToolCall("call_1", "ls", '{"path": "."}')
    ep = Episode2(
        store,
        renderer,
        sampled='<tool_call>\n{"name": "ls", "arguments": {"path":"."}}\n</tool_call>',
        completion=Completion(tool_calls=[call], finish_reason="tool_calls"),
        returned=Message(role="assistant", tool_calls=[call]),
        then=[Message(role="tool", content="a.txt", tool_call_id="call_1")],
    )
    (audit,) = audit_store(store, None, tiny_model_dir).episodes
    c2 = audit.calls[1]
    fresh = renderer.render(ep.second).ids
    assert c2.result == "drifted" and c2.diff.first_diff == first_diff(ep.prompt2, fresh)
    start = len(ep.prompt1)
    assert start < c2.diff.first_diff < start + len(ep.output1)
    before = renderer.decode(ep.prompt2[start : c2.diff.first_diff])
    assert '<tool_call>\n{"name": "ls", "arguments": {"path":'.startswith(before)
    assert c2.prefix_exact is True and audit.summary.unexpected == 0


def test_a_call_that_keeps_all_its_history_audits_identical_when_extended(store, renderer, tiny_model_dir):
    # same reasoning, but no new user turn: the template keeps it, so T2 and a fresh render agree
    call = ToolCall("call_1", "ls", '{"path": "."}')
    Episode2(
        store,
        renderer,
        sampled='<think>\nI should list.\n</think>\n\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n'
        "</tool_call>",
        completion=Completion(reasoning="I should list.", tool_calls=[call], finish_reason="tool_calls"),
        returned=Message(role="assistant", reasoning="I should list.", tool_calls=[call]),
        then=[Message(role="tool", content="a.txt", tool_call_id="call_1")],
    )
    total = audit_store(store, None, tiny_model_dir).total
    assert (total.audited, total.identical, total.drifted, total.drifted_tokens) == (2, 2, 0, 0)


def test_skipped_calls_are_counted_by_reason(store, renderer, tiny_model_dir):
    eid = store.create_episode(EpisodeStart(command=["test"]))
    conv = Conversation(messages=[Message(role="user", content="hi")], tools=TOOLS)
    ids = renderer.render(conv).ids
    add_call(store, eid, conv, ids, fidelity="text")
    add_call(store, eid, conv, ids, fidelity="server-rendered", render_mode="server")
    add_call(store, eid, conv, [])
    add_call(store, eid, None, ids)
    add_call(store, eid, {"messages": [{"role": "user", "bogus": 1}]}, ids)
    add_call(store, eid, conv, ids)
    report = audit_store(store, [eid], tiny_model_dir)
    reasons = [c.skip_reason for c in report.episodes[0].calls]
    assert reasons == ["text", "server-rendered", "no-prompt-ids", "no-conversation", "render-error", None]
    assert "bogus" in report.episodes[0].calls[4].error
    d = report.to_dict()["total"]
    assert d["calls"] == 6 and d["audited"] == 1 and d["identical"] == 1 and d["skipped"] == 5
    assert d["skipped_by_reason"] == {
        "no-conversation": 1,
        "no-prompt-ids": 1,
        "render-error": 1,
        "server-rendered": 1,
        "text": 1,
    }
    assert d["prompt_tokens"] == len(ids)


def test_a_fresh_call_that_does_not_re_render_is_flagged_unexpected(store, renderer, tiny_model_dir):
    eid = store.create_episode(EpisodeStart(command=["test"]))
    conv = Conversation(messages=[Message(role="user", content="hi")])
    ids = renderer.render(conv).ids
    add_call(store, eid, conv, [*ids[:2], 5, *ids[2:]])
    (c,) = audit_store(store, [eid], tiny_model_dir).episodes[0].calls
    assert (
        c.unexpected and c.diff.first_diff == 2 and (c.diff.changed_recorded, c.diff.changed_fresh) == (1, 0)
    )


def test_an_extended_call_that_does_not_start_with_its_base_is_a_prefix_break(
    store, renderer, tiny_model_dir
):
    ep = reasoning_episode(store, renderer)
    broken = [*ep.prompt1, *ep.output1[1:], *ep.prompt2[len(ep.prompt1) + len(ep.output1) :]]
    add_call(store, ep.episode_id, ep.second, broken, render_mode="extended", extended_from=ep.call1)
    add_call(store, ep.episode_id, ep.second, ep.prompt2, render_mode="extended", extended_from="call_gone")
    audit = audit_store(store, [ep.episode_id], tiny_model_dir).episodes[0]
    assert [c.prefix_exact for c in audit.calls] == [None, True, False, False]
    assert audit.summary.prefix_breaks == 2


def test_totals_add_up_over_episodes(store, renderer, tiny_model_dir):
    a = reasoning_episode(store, renderer)
    b = reasoning_episode(store, renderer)
    report = audit_store(store, None, tiny_model_dir)
    assert [e.episode_id for e in report.episodes] == [a.episode_id, b.episode_id]
    t = report.to_dict()["total"]
    per = [e.to_dict() for e in report.episodes]
    assert t["episodes"] == 2
    for key in ("calls", "audited", "identical", "drifted", "prompt_tokens", "drifted_tokens"):
        assert t[key] == sum(e[key] for e in per)
    assert t["drifted_share"] == pytest.approx(t["drifted_tokens"] / t["prompt_tokens"], abs=1e-6)


def test_the_model_folder_defaults_to_the_one_the_episode_records(store, renderer, tiny_model_dir, tmp_path):
    ep = reasoning_episode(store, renderer, metadata={"model_dir": str(tiny_model_dir)})
    report = audit_store(store, [ep.episode_id], None)
    assert report.episodes[0].model_dir == str(tiny_model_dir) and report.total.drifted == 1
    gone = reasoning_episode(store, renderer, metadata={"model_dir": str(tmp_path / "gone")})
    with pytest.raises(UsageError, match="no longer exists"):
        audit_store(store, [gone.episode_id], None)


def test_cli_without_a_model_folder_says_how_to_give_one(store, renderer, tmp_path):
    ep = reasoning_episode(store, renderer)
    r = CliRunner().invoke(
        app, ["audit", ep.episode_id, "--db", str(tmp_path / "audit.db")], env={"POLARPROXY_MODEL": None}
    )
    assert r.exit_code == 1
    assert f"Episode {ep.episode_id} does not record its model folder" in r.output
    assert "Pass --model DIR" in r.output


def test_cli_names_an_unknown_episode(store, tmp_path, tiny_model_dir):
    r = CliRunner().invoke(
        app, ["audit", "ep_nope", "--db", str(tmp_path / "audit.db"), "--model", str(tiny_model_dir)]
    )
    assert r.exit_code == 1 and "nope" in r.output and "polarproxy ls" in r.output


def test_an_episode_without_calls_needs_no_model_folder(store, renderer, tiny_model_dir):
    empty = store.create_episode(EpisodeStart(command=["test"]))
    report = audit_store(store, None, None)
    assert [(e.episode_id, e.model_dir, e.summary.calls) for e in report.episodes] == [(empty, None, 0)]
    ep = reasoning_episode(store, renderer)
    with pytest.raises(UsageError, match=f"Episode {ep.episode_id} does not record its model folder"):
        audit_store(store, [ep.episode_id], None)  # named: an error
    assert audit_store(store, None, tiny_model_dir).total.calls == 2


def test_over_all_episodes_one_without_a_model_folder_is_skipped_with_the_reason(
    store, renderer, tiny_model_dir, tmp_path
):
    lost = reasoning_episode(store, renderer)  # records no model folder
    kept = reasoning_episode(store, renderer, metadata={"model_dir": str(tiny_model_dir)})
    report = audit_store(store, None, None)
    by_id = {e.episode_id: e for e in report.episodes}
    assert "does not record its model folder" in by_id[lost.episode_id].skipped
    assert by_id[kept.episode_id].skipped is None and by_id[kept.episode_id].summary.calls == 2
    r = CliRunner().invoke(app, ["audit", "--db", str(tmp_path / "audit.db")], env={"POLARPROXY_MODEL": None})
    assert r.exit_code == 0, r.output
    assert f"episode {lost.episode_id} skipped" in " ".join(r.output.split())


def test_unknown_episode_ids_are_named(store):
    with pytest.raises(NotFoundError, match="ep_nope"):
        audit_store(store, ["ep_nope"], None)


def test_cli_flags_unexpected_drift_and_prefix_breaks_in_red_words(store, renderer, tiny_model_dir, tmp_path):
    ep = reasoning_episode(store, renderer)
    conv = Conversation(messages=[Message(role="user", content="hi")])
    ids = renderer.render(conv).ids
    add_call(store, ep.episode_id, conv, [*ids[:2], 5, *ids[2:]])
    add_call(store, ep.episode_id, ep.second, ep.prompt2, render_mode="extended", extended_from="call_gone")
    add_call(store, ep.episode_id, conv, ids, fidelity="text")
    args = ["audit", "--db", str(tmp_path / "audit.db"), "--model", str(tiny_model_dir)]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "drifted (unexpected)" in r.output and "prefix broken" in r.output
    assert "1 call(s) polarproxy rendered fresh do not re-render identically" in r.output
    assert "1 extended call(s) do not start with the earlier call's prompt + output" in r.output
    assert "skipped 1 call(s): text-only record" in r.output
    assert f"#1 at {len(ep.prompt1)}: model saw '<think>" in r.output


def test_cli_filters_episodes_and_leaves_out_empty_ones(store, renderer, tiny_model_dir, tmp_path):
    """`audit --task/--group/--harness/--since` audit those episodes only; episodes without calls are
    counted, not printed as empty tables; a store whose calls all lack a model folder is an error."""
    store.create_episode(EpisodeStart(command=["serve"]))  # a `serve` start's empty default episode
    a = reasoning_episode(store, renderer, metadata={"model_dir": str(tiny_model_dir)})
    db = str(tmp_path / "audit.db")
    r = CliRunner().invoke(app, ["audit", "--db", db, "--json"], env={"POLARPROXY_MODEL": None})
    assert r.exit_code == 0, r.output
    assert [e["episode_id"] for e in _json_lines(r.stdout)["episodes"] if e["calls"]] == [a.episode_id]
    r = CliRunner().invoke(app, ["audit", "--db", db], env={"POLARPROXY_MODEL": None})
    assert "1 episode(s) without calls left out" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["audit", "--db", db, "--task", "no-such-task", "--json"])
    assert r.exit_code == 0 and _json_lines(r.stdout)["episodes"] == []
    r = CliRunner().invoke(
        app, ["audit", "--db", db, "--since", "1h", "--json"], env={"POLARPROXY_MODEL": None}
    )
    assert [e["episode_id"] for e in _json_lines(r.stdout)["episodes"] if e["calls"]] == [a.episode_id]
    reasoning_episode(store, renderer)  # calls, and no model folder: alone, nothing can be audited
    r = CliRunner().invoke(
        app, ["audit", "--db", db, "--harness", "nothing-else"], env={"POLARPROXY_MODEL": None}
    )
    assert r.exit_code == 0


def _json_lines(text: str) -> dict:
    import json

    return json.loads(text[text.index("{") :])
