"""Per-token log-probs (and entropy) straight from hidden states and the LM-head weight, one chunk of tokens at a time.

The naive path materialises logits for every token ([N, V] in the compute dtype, then float32 copies for the
log-softmax, and the same again in backward): with V = 151936 that is most of a micro-batch's memory traffic.
``linear_log_probs`` never holds more than one [chunk, V] block of logits (float32 only inside the chunk), and its
backward recomputes each chunk's logits instead of keeping them, then turns them into gradients for the hidden
states and the weight right away. The weight may be tied to the input embedding: the gradient returned here is the
weight's, and autograd adds it to the embedding's own.

For logits z = h W^T, p = softmax(z), label y and upstream gradients g (log-prob) and e (entropy):
    log p_y = z_y - logsumexp(z)          d/dz_j = [j = y] - p_j
    H       = logsumexp(z) - sum_j p_j z_j   d/dz_j = -p_j (z_j - sum_k p_k z_k)
so dL/dz = g ([j = y] - p_j) - e p_j (z_j - E_p[z]), then dL/dh = dL/dz W and dL/dW = (dL/dz)^T h.

At a sampling temperature T the softmax is taken of z / T (z divided in float32, as the full-logits path and
vLLM's sampler do): the formulas above hold for z / T, and the chain rule divides dL/d(z / T) by T once more.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor


def _chunk_logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """float32 logits of one chunk: the matmul runs in the inputs' dtype (bf16 on GPU), the softmax maths in fp32."""
    return (hidden @ weight.t()).float()


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """sum_j a[i, j] * b[i, j] for each row i, without an [n, V] temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


class ChunkedLinearLogProb(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], labels [N], chunk_size, with_entropy, temperature) -> (log p(label) [N],
    entropy [N] or an empty tensor), float32, of softmax(hidden @ weight^T / temperature)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int, with_entropy: bool,
                temperature: float = 1.0):
        rows = hidden.shape[0]
        log_probs = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(rows if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, rows, chunk_size):
            end = min(start + chunk_size, rows)
            logits = _chunk_logits(hidden[start:end], weight)
            if temperature != 1.0:
                logits.div_(temperature)
            lse = torch.logsumexp(logits, dim=-1)
            log_probs[start:end] = logits.gather(-1, labels[start:end, None]).squeeze(-1) - lse
            if with_entropy:
                probs = torch.softmax(logits, dim=-1)
                entropy[start:end] = lse - _row_dot(probs, logits)
            del logits
        ctx.save_for_backward(hidden, weight, labels)
        ctx.chunk_size, ctx.with_entropy, ctx.temperature = chunk_size, with_entropy, temperature
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None, not a tensor of zeros
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: Optional[Tensor], grad_entropy: Optional[Tensor]):
        hidden, weight, labels = ctx.saved_tensors
        if not ctx.with_entropy or (grad_entropy is not None and not bool(grad_entropy.any())):
            grad_entropy = None  # entropy kept for a metric only (its zero gradient arrives through a stack)
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_log_probs is None and grad_entropy is None) or not (want_hidden or want_weight):
            return None, None, None, None, None, None
        temperature = ctx.temperature
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, hidden.shape[0])
            h = hidden[start:end]
            logits = h @ weight.t()  # the compute dtype; softmax reads it and writes float32 without an fp32 copy
            if temperature != 1.0:  # z / T in float32, as in forward
                logits = logits.float().div_(temperature)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            g = grad_log_probs[start:end, None] if grad_log_probs is not None else None
            if grad_entropy is None:  # the update without an entropy bonus: dL/dz = -g p, then + g at y
                del logits
                grad_logits = probs.mul_(-g)
            else:  # dL/dz = p (-e (z - E_p[z]) - g), then + g at y; built in the float32 logits' buffer
                logits = logits.float()
                e = grad_entropy[start:end, None]
                offset = e * _row_dot(probs, logits)[:, None] - (g if g is not None else 0.0)
                grad_logits = logits.mul_(-e).add_(offset).mul_(probs)
            del probs
            if g is not None:
                grad_logits.scatter_add_(-1, labels[start:end, None], g)
            if temperature != 1.0:  # dL/dz = dL/d(z / T) / T
                grad_logits.div_(temperature)
            grad_logits = grad_logits.to(hidden.dtype)
            if want_hidden:
                grad_hidden[start:end] = grad_logits @ weight.to(hidden.dtype)
            if want_weight:
                grad_weight += (grad_logits.t() @ h).float()
            del grad_logits
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def linear_log_probs(hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int = 2048,
                     with_entropy: bool = False, temperature: float = 1.0) -> Tuple[Tensor, Optional[Tensor]]:
    """log softmax(hidden @ weight^T / temperature)[labels] and, optionally, the entropy of that softmax, float32.

    ``hidden`` [..., H], ``weight`` [V, H] (an LM head without bias), ``labels`` [...] with 0 <= id < V everywhere
    (padding included: use the pad id). At most ``chunk_size`` tokens' logits exist at once, forward and backward.
    ``temperature``: the sampling temperature the log-probs are taken at, > 0 (1: the model's own distribution).
    Returns tensors shaped like ``labels``; entropy is None unless ``with_entropy``.
    """
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} does not match labels {tuple(labels.shape)}")
    vocab = weight.shape[0]
    if labels.numel() and (labels.min() < 0 or labels.max() >= vocab):
        raise ValueError(f"labels must lie in [0, {vocab}); got min {labels.min().item()}, max {labels.max().item()}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1).long()
    log_probs, entropy = ChunkedLinearLogProb.apply(flat_hidden, weight, flat_labels, max(1, int(chunk_size)),
                                                    with_entropy, float(temperature))
    return log_probs.view(labels.shape), (entropy.view(labels.shape) if with_entropy else None)
