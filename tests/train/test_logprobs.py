"""Chunked logprobs equal the ones of the full logits, in value and gradient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from polarproxy.train.logprobs import chunked_logprobs, full_logprobs  # noqa: E402


@pytest.mark.parametrize(
    ("chunk", "temperatures"), [(1, False), (7, False), (64, True), (1000, False), (7, True)]
)
def test_chunked_logprobs_equal_full_logprobs_and_gradients(chunk: int, temperatures: bool) -> None:
    """With temperatures, each token at its own T: log_softmax(logits / T), in value and gradient (the
    reference is autograd through the scaled full logits)."""
    g = torch.Generator().manual_seed(0)
    n, h, v = 53, 16, 301
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    bias = torch.randn(v, generator=g, requires_grad=True)
    targets = torch.randint(v, (n,), generator=g)
    upstream = torch.randn(n, generator=g)
    inv_temp = 1 / (0.3 + torch.rand(n, generator=g)) if temperatures else None

    lp, ent = chunked_logprobs(hidden, weight, targets, chunk=chunk, bias=bias, inv_temp=inv_temp)
    (lp * upstream).sum().backward()
    grads = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    full = full_logprobs(hidden, weight, targets, bias=bias, inv_temp=inv_temp)
    (full * upstream).sum().backward()

    assert torch.allclose(lp, full, atol=1e-5)
    for a, t in zip(grads, (hidden, weight, bias), strict=True):
        assert torch.allclose(a, t.grad, atol=1e-5)
    logits = torch.nn.functional.linear(hidden, weight, bias).detach()
    if inv_temp is not None:
        logits = logits * inv_temp[:, None]
        plain = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias), -1)
        assert (lp - plain.gather(-1, targets[:, None]).squeeze(-1)).abs().max() > 1e-2  # not T = 1
    expected_entropy = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(ent, expected_entropy, atol=1e-4)
    assert not ent.requires_grad


def test_no_tokens_give_empty_logprobs_that_still_backpropagate() -> None:
    weight = torch.randn(5, 3, requires_grad=True)
    lp, ent = chunked_logprobs(torch.zeros(0, 3), weight, torch.zeros(0, dtype=torch.long))
    assert lp.shape == ent.shape == (0,)
    lp.sum().backward()
    assert weight.grad is not None and torch.count_nonzero(weight.grad) == 0


def test_bf16_inputs_get_bf16_gradients_close_to_the_float32_ones() -> None:
    g = torch.Generator().manual_seed(1)
    n, h, v = 40, 16, 64
    hidden32 = torch.randn(n, h, generator=g)
    weight32 = torch.randn(v, h, generator=g)
    targets = torch.randint(v, (n,), generator=g)
    grads = {}
    for dtype in (torch.float32, torch.bfloat16):
        hidden = hidden32.to(dtype, copy=True).requires_grad_()
        weight = weight32.to(dtype, copy=True).requires_grad_()
        lp, _ = chunked_logprobs(hidden, weight, targets, chunk=16)
        assert lp.dtype == torch.float32  # log-softmax in float32 whatever the matmul's dtype
        lp.sum().backward()
        assert hidden.grad.dtype == weight.grad.dtype == dtype
        grads[dtype] = (hidden.grad.float(), weight.grad.float())
    for a, b in zip(grads[torch.float32], grads[torch.bfloat16], strict=True):
        assert torch.allclose(a, b, atol=0.05 * float(a.abs().max()))
