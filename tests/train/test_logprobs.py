"""Chunked logprobs equal the ones of the full logits, in value and gradient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from polarproxy.train.logprobs import chunked_logprobs, full_logprobs  # noqa: E402


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_logprobs_equal_full_logprobs_and_gradients(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    n, h, v = 53, 16, 301
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    bias = torch.randn(v, generator=g, requires_grad=True)
    targets = torch.randint(v, (n,), generator=g)
    upstream = torch.randn(n, generator=g)

    lp, ent = chunked_logprobs(hidden, weight, targets, chunk=chunk, bias=bias)
    (lp * upstream).sum().backward()
    grads = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    full = full_logprobs(hidden, weight, targets, bias=bias)
    (full * upstream).sum().backward()

    assert torch.allclose(lp, full, atol=1e-5)
    for a, t in zip(grads, (hidden, weight, bias), strict=True):
        assert torch.allclose(a, t.grad, atol=1e-5)
    logits = torch.nn.functional.linear(hidden, weight, bias).detach()
    expected_entropy = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(ent, expected_entropy, atol=1e-4)
    assert not ent.requires_grad


def test_no_tokens_give_empty_logprobs_that_still_backpropagate() -> None:
    weight = torch.randn(5, 3, requires_grad=True)
    lp, ent = chunked_logprobs(torch.zeros(0, 3), weight, torch.zeros(0, dtype=torch.long))
    assert lp.shape == ent.shape == (0,)
    lp.sum().backward()
    assert weight.grad is not None and torch.count_nonzero(weight.grad) == 0
