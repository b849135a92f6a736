"""T2 on the chat templates model families ship (../shared/fixtures/chat-templates/) and the project's own:
every follow-up call of a multi-turn episode (tool calls, tool results, a follow-up user message, an
answer cut by max_tokens, reasoning where the family has it) extends the call before it, and what it
appends is exactly what the template writes after that answer in this conversation."""

from __future__ import annotations

import json

import pytest
from real_templates import NAMES, Episode, run_standard_episode

from polarproxy.render.prefix import SENTINEL


def expected_tail(ep: Episode, i: int) -> tuple[str, str]:
    """(what a fresh render of call i's conversation writes after call i-1's answer, that render)."""
    call = ep.calls[i]
    fresh = ep.r.render(call.conversation)
    tail_ids = call.prompt.ids[len(ep.calls[i - 1].prompt.ids) + len(ep.calls[i - 1].turn.output_ids) :]
    tail = ep.r.decode(tail_ids)
    return tail, fresh.text


@pytest.mark.parametrize("name", NAMES)
def test_every_follow_up_extends_the_call_before_it(name):
    ep = run_standard_episode(name)
    assert ep.calls[0].prompt.mode == "fresh"
    for i, call in enumerate(ep.calls[1:], start=1):
        prev = ep.calls[i - 1]
        p = call.prompt
        assert (p.mode, p.extended_from, p.policy) == ("extended", prev.turn.call_id, "extend"), p.note
        assert p.ids[: len(prev.prompt.ids) + len(prev.turn.output_ids)] == [
            *prev.prompt.ids,
            *prev.turn.output_ids,
        ]
    assert not ep.index.needs_history  # the short stand-in conversation gave every tail (checked each call)


@pytest.mark.parametrize("name", NAMES)
def test_the_appended_part_is_what_the_template_writes_after_the_answer(name):
    ep = run_standard_episode(name)
    for i, call in enumerate(ep.calls[1:], start=1):
        tail, fresh = expected_tail(ep, i)
        prev = ep.calls[i - 1]
        assert fresh.endswith(tail), (i, tail, fresh[-len(tail) - 80 :])
        head = fresh[: len(fresh) - len(tail)]
        if prev.turn.closing_text is not None:
            # the model's end-of-turn token is in its output; the template writes it right before the tail
            assert head.endswith(prev.turn.closing_text)
            assert call.prompt.closing_added is None
        else:
            # cut by max_tokens: the template's closing follows the answer's text, as masked prompt tokens
            assert head.rstrip().endswith(prev.turn.completion.text.strip())
            assert call.prompt.closing_added and tail.startswith(call.prompt.closing_added)
            assert ep.eos in call.prompt.closing_added
            assert "added as prompt tokens (masked" in call.prompt.note
        # the tokens are those of a fresh render where it ends the same way (no merge across the cut)
        assert ep.r.encode(fresh)[-len(ep.r.encode(tail)) :] == ep.r.encode(tail)
        for m in call.conversation.messages[len(prev.conversation.messages) + 1 :]:
            text = m.content.strip()
            assert text in tail or json.dumps(text)[1:-1] in tail  # as is, or JSON-escaped (Hermes, Llama)
        assert SENTINEL not in tail


@pytest.mark.parametrize("name", ["qwen3", "tiny", "hermes-2-pro-tools"])
def test_reasoning_the_template_drops_stays_in_the_model_context(name):
    ep = run_standard_episode(name)
    last = ep.calls[-1]
    seen = ep.r.decode(last.prompt.ids)
    fresh = ep.r.render(last.conversation).text
    if ep.family.reasoning:
        assert seen.count("<think>") >= 3  # the model's own reasoning of earlier turns
        assert fresh.count("<think>") < seen.count("<think>")  # a fresh render drops it (last user query)


def test_qwen3_writes_an_empty_think_block_only_for_the_last_turn_and_t2_does_not_inherit_it():
    ep = run_standard_episode("qwen3")
    # the answer after the follow-up "Thanks." had no reasoning; rendered last, Qwen3 would write an empty
    # think block, which the model never sampled: the extended prompts hold none of it
    for call in ep.calls[1:]:
        assert "<think>\n\n</think>" not in ep.r.decode(call.prompt.ids)


def test_mistral_extends_while_a_fresh_render_rewrites_earlier_turns():
    """Mistral writes the tools and the system prompt into the last user message: the fresh render of a
    later call differs from the earlier prompt in its earlier tokens; policy 'extend' keeps them."""
    ep = run_standard_episode("mistral-parallel-tools")
    follow_up = next(
        c for c in ep.calls if c.conversation.messages[-1].content == "Now explain it in detail, please."
    )
    before = ep.calls[ep.calls.index(follow_up) - 1]
    fresh = ep.r.render(follow_up.conversation).ids
    assert fresh[: len(before.prompt.ids)] != list(before.prompt.ids)
    assert follow_up.prompt.mode == "extended"
    assert ep.r.decode(follow_up.prompt.ids).count("[AVAILABLE_TOOLS]") == 2  # once per user turn it was last


def test_mistral_under_policy_fresh_renders_every_call_as_the_template_does():
    ep = run_standard_episode("mistral-parallel-tools", policy="fresh")
    for call in ep.calls:
        assert call.prompt.mode == "fresh" and call.prompt.policy == "fresh"
        assert call.prompt.ids == ep.r.render(call.conversation).ids
    assert "policy 'fresh'" in ep.calls[1].prompt.note
    assert ep.r.decode(ep.calls[-1].prompt.ids).count("[AVAILABLE_TOOLS]") == 1
