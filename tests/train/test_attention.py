"""Packed attention (`attention.VARLEN`): each sequence of a packed row attends only to itself, with the
numbers of transformers' sdpa path, without a (T, T) mask; padded rows and explicit masks keep sdpa's path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from polarproxy.train.attention import (  # noqa: E402
    VARLEN,
    packed_mask,
    sequence_bounds,
    use_packed_attention,
    varlen_attention_forward,
    varlen_mask,
)
from polarproxy.train.batching import packed_batch, padded_batch, step_weights  # noqa: E402
from polarproxy.train.data import Sample  # noqa: E402
from polarproxy.train.logprobs import hidden_states  # noqa: E402


def test_sequence_bounds_split_where_positions_restart() -> None:
    pos = torch.tensor([0, 1, 2, 0, 0, 1, 5, 6])  # a jump (5 after 1) starts a sequence too
    assert sequence_bounds(pos) == [0, 3, 4, 6, 8]
    assert sequence_bounds(torch.arange(5)) == [0, 5]


def _samples(lengths: list[int]) -> list[Sample]:
    out = []
    for j, n in enumerate(lengths):
        ids = [(7 * i + 13 * j) % 97 for i in range(n)]
        out.append(Sample(ids, [0] + [1] * (n - 1), [0.0] * n, 1.0, episode_id=f"e{j}"))
    return out


def _rows_one_by_one(model, samples: list[Sample]) -> torch.Tensor:
    """Each row's hidden states on its own (sdpa, no packing), end to end."""
    weights = step_weights(samples, "token-mean")
    return torch.cat(
        [hidden_states(model, padded_batch(samples, [i], weights, pad_id=0)) for i in range(len(samples))]
    )


@pytest.mark.parametrize(
    "extra",
    [{}, {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}],
    ids=["full", "sliding-window-4"],
)
def test_a_packed_row_equals_its_rows_run_alone_and_builds_no_mask(monkeypatch, extra, tiny_models) -> None:
    model = tiny_models[0](**extra)
    samples = _samples([9, 1, 5, 12, 3])
    weights = step_weights(samples, "token-mean")
    with torch.no_grad():
        alone = _rows_one_by_one(model, samples)
        assert use_packed_attention(model) == VARLEN
        calls: list[tuple[int, bool, bool]] = []
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def spy(q, k, v, attn_mask=None, **kw):
            calls.append((q.shape[2], attn_mask is None, kw.get("is_causal", False)))
            return sdpa(q, k, v, attn_mask=attn_mask, **kw)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        packed = hidden_states(model, packed_batch(samples, list(range(len(samples))), weights))
    assert torch.allclose(packed, alone, atol=1e-5)
    # one call per sequence and layer, each over that sequence alone; masked only where a window cuts it
    assert sorted(c[0] for c in calls) == sorted([9, 1, 5, 12, 3] * 2)
    window = extra.get("sliding_window")
    for length, unmasked, causal in calls:
        assert unmasked == causal == (window is None or length <= window), (length, unmasked, causal)


def test_padded_rows_and_explicit_masks_keep_sdpa_numbers(tiny_models) -> None:
    model = tiny_models[0]()
    samples = _samples([9, 1, 5])
    weights = step_weights(samples, "token-mean")
    with torch.no_grad():
        padded_sdpa = hidden_states(model, padded_batch(samples, [0, 1, 2], weights, pad_id=0))
        four_d_sdpa = hidden_states(model, packed_batch(samples, [0, 1, 2], weights, mask_mode="4d"))
        use_packed_attention(model)
        padded = hidden_states(model, padded_batch(samples, [0, 1, 2], weights, pad_id=0))
        four_d = hidden_states(model, packed_batch(samples, [0, 1, 2], weights, mask_mode="4d"))
    assert torch.equal(padded, padded_sdpa)
    assert torch.equal(four_d, four_d_sdpa)
    assert varlen_mask(1, 4, 4, attention_mask=None) is None


def test_only_sdpa_models_switch_and_the_saved_config_does_not_name_it(tmp_path: Path, tiny_models) -> None:
    model = tiny_models[0]()
    model.set_attn_implementation("eager")
    assert use_packed_attention(model) == "eager"
    model.set_attn_implementation("sdpa")
    assert use_packed_attention(model) == VARLEN
    model.save_pretrained(tmp_path)  # a checkpoint others load (SGLang, vLLM, from_pretrained) as usual
    assert VARLEN not in (tmp_path / "config.json").read_text()
    assert "attn_implementation" not in json.loads((tmp_path / "config.json").read_text())


def test_packed_mask_is_block_diagonal_causal_and_windowed() -> None:
    pos = torch.tensor([0, 1, 2, 0, 1, 2, 3])
    mask = packed_mask([pos], None)[0, 0]
    assert mask.shape == (7, 7)
    for q in range(7):
        for k in range(7):
            same = (q < 3) == (k < 3)
            assert bool(mask[q, k]) == (same and k <= q), (q, k)
    windowed = packed_mask([pos], 2)[0, 0]
    assert windowed.sum(1).tolist() == [1, 2, 2, 1, 2, 2, 2]


def test_what_it_hands_to_sdpa_gets_the_block_mask_not_the_whole_row() -> None:
    """A call it does not run per sequence itself (here: an attention-sink tensor, which transformers'
    sdpa ignores) must still keep the sequences apart: same numbers as the per-sequence path."""

    class Attn(torch.nn.Module):
        is_causal = True
        num_key_value_groups = 2

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 10, 8, generator=g)
    k, v = torch.randn(1, 2, 10, 8, generator=g), torch.randn(1, 2, 10, 8, generator=g)
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]])
    own, _ = varlen_attention_forward(Attn(), q, k, v, None, scaling=0.35, position_ids=pos)
    handed, _ = varlen_attention_forward(
        Attn(), q, k, v, None, scaling=0.35, position_ids=pos, s_aux=torch.zeros(4)
    )
    whole_row, _ = varlen_attention_forward(
        Attn(), q, k, v, None, scaling=0.35, position_ids=torch.arange(10)[None]
    )
    assert torch.allclose(handed, own, atol=1e-6)
    assert not torch.allclose(whole_row, own, atol=1e-3)  # the check can tell rows apart


def test_a_model_whose_packed_attention_fails_the_check_goes_back_to_sdpa(monkeypatch, tiny_models) -> None:
    from polarproxy.train import layout

    model = tiny_models[0]()
    use_packed_attention(model)
    # as if per-sequence attention were wrong for this model: the first check fails, sdpa's passes
    verdicts = iter([False, True])
    monkeypatch.setattr(layout, "packing_is_exact", lambda m: next(verdicts))
    assert layout.choose_layout(model) == "packed"
    assert model.config._attn_implementation == "sdpa"
