"""Where does a non-finite gradient start? Hooks on every module (and on the attention function) of one forward +
backward, and the rule that names the operation; used by ``benchmarks/gpu_nan_probe.py``.

``GradTrace(model)`` records, in execution order, each module's forward output (max |x|, all finite?) and, during the
backward, the gradient reaching each module's tensor inputs and outputs (the same two facts). The attention function
a Hugging Face attention layer calls (``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``, or the model file's
``eager_attention_forward``) is wrapped for the trace as a pseudo-module ``<attention layer>.attention_fn``: its inputs
are query, key and value, its output the attention output, and the mask it was handed is summarised (shape, dtype,
query rows with no key to attend to).

``localize(records)`` names the culprit: a module whose output gradients were all finite and one of whose input
gradients was not, i.e. whose own backward made a non-finite value; of those, the first in the backward, and of its
chain (a layer and its attention share the blame) the deepest. When no module did
(the gradient arriving at the model's outputs is already non-finite), the loss side is named (``"<loss>"``).

``compared(out, ref)`` says whether an operation's output is finite and how far it is from a float32 reference
(``benchmarks/gpu_cap_locate.py``'s model-free checks).

``inject_nan_grad(module)`` makes a module's backward emit NaN (a forward hook; its forward is untouched): the dry
run's stand-in for the real defect. ``padding_facts`` and ``masked_row_sdpa_grads`` answer "are there fully masked
query rows, and does SDPA's backward survive them?" without a model.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

LOSS = "<loss>"
"""The culprit's name when no module's backward made the non-finite gradient (it arrived at the model's outputs)."""


def _tensors(value: Any) -> List[torch.Tensor]:
    """The floating-point tensors in a module's inputs or outputs (tuples, lists, dicts and ``ModelOutput``)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


class GradTrace:
    """Context manager: hooks on every module of ``model`` and on its attention function (see the module docstring).
    ``records`` afterwards: dicts with ``phase`` (forward/backward), ``module``, ``what`` (``input[i]``,
    ``output[i]``, ``query``/``key``/``value``), ``max_abs`` and ``finite``, in the order they happened."""

    def __init__(self, model: torch.nn.Module, attention: bool = True) -> None:
        self.model, self.attention = model, attention
        self.names = {id(m): name or "<model>" for name, m in model.named_modules()}
        self._pending: List[Dict[str, Any]] = []  # facts kept as device scalars until ``records`` (no sync per hook)
        self.masks: List[Dict[str, Any]] = []
        self.dead_queries: Optional[torch.Tensor] = None  # [batch, q]: query positions of the first mask with no key
        self._undo: List[Callable[[], None]] = []

    def _note(self, phase: str, module: str, what: str, t: torch.Tensor) -> None:
        t = t.detach()
        rec = {"phase": phase, "module": module, "what": what,
               "max_abs": t.abs().amax().float() if t.numel() else torch.zeros(()),
               "finite": torch.isfinite(t).all() if t.numel() else torch.ones((), dtype=torch.bool)}
        if phase == "backward" and t.dim() in (3, 4) and t.numel():
            # [batch, seq, hidden] or attention's [batch, heads, seq, head_dim]: which (row, position) went bad
            bad = ~torch.isfinite(t)
            rec["bad_at"] = bad.any(-1) if t.dim() == 3 else bad.any(-1).any(1)
        self._pending.append(rec)

    def _watch_grads(self, module: str, kind: str, tensors: Sequence[torch.Tensor]) -> None:
        for i, t in enumerate(tensors):
            if t.requires_grad:
                what = kind if not kind.endswith("]") else kind[:-1] + str(i) + "]"
                handle = t.register_hook(lambda g, m=module, w=what: self._note("backward", m, w, g))
                self._undo.append(handle.remove)

    def __enter__(self) -> "GradTrace":
        for m in self.model.modules():
            name = self.names[id(m)]

            def pre(mod, args, kwargs, name=name):
                self._watch_grads(name, "input[]", _tensors(args) + _tensors(kwargs))

            def post(mod, args, kwargs, out, name=name):
                outs = _tensors(out)
                for i, t in enumerate(outs):
                    self._note("forward", name, f"output[{i}]", t)
                self._watch_grads(name, "output[]", outs)

            self._undo.append(m.register_forward_pre_hook(pre, with_kwargs=True).remove)
            self._undo.append(m.register_forward_hook(post, with_kwargs=True).remove)
        if self.attention:
            self._wrap_attention()
        return self

    def __exit__(self, *exc: Any) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def _wrap_attention(self) -> None:
        """Route the model's attention function through ``traced`` for the duration of the trace (a local entry of
        transformers' ``ALL_ATTENTION_FUNCTIONS``, removed afterwards)."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        impl = getattr(getattr(self.model, "config", None), "_attn_implementation", None)
        attn_layer = next((m for m in self.model.modules() if type(m).__name__.endswith("Attention")), None)
        if impl is None or attn_layer is None:
            return
        if impl == "eager":
            inner = getattr(sys.modules[type(attn_layer).__module__], "eager_attention_forward", None)
        else:
            inner = ALL_ATTENTION_FUNCTIONS.get(impl)
        if inner is None:
            return

        def traced(module, query, key, value, attention_mask, *args, **kwargs):
            name = self.names.get(id(module), type(module).__name__) + ".attention_fn"
            self.masks.append({"module": name, **mask_facts(attention_mask)})
            if self.dead_queries is None and attention_mask is not None and attention_mask.dim() == 4:
                self.dead_queries = fully_masked_rows(attention_mask).any(1).cpu()  # [batch, q]
            for what, t in (("query", query), ("key", key), ("value", value)):
                self._note("forward", name, what, t)
                self._watch_grads(name, what, [t])
            out = inner(module, query, key, value, attention_mask, *args, **kwargs)
            self._note("forward", name, "output[0]", out[0])
            self._watch_grads(name, "output[0]", [out[0]])
            return out

        had_local = impl in ALL_ATTENTION_FUNCTIONS._local_mapping
        previous = ALL_ATTENTION_FUNCTIONS._local_mapping.get(impl)
        ALL_ATTENTION_FUNCTIONS[impl] = traced

        def restore() -> None:
            if had_local:
                ALL_ATTENTION_FUNCTIONS[impl] = previous
            else:
                del ALL_ATTENTION_FUNCTIONS[impl]

        self._undo.append(restore)

    @property
    def records(self) -> List[Dict[str, Any]]:
        """The recorded facts as plain Python values, in the order they happened. A non-finite gradient of a
        [batch, (heads,) seq, ...] tensor also says where: ``bad_positions`` (count), the first ``bad_at`` (row,
        position) pairs, and ``bad_in_fully_masked_queries``: how many of them are query positions that the first
        attention mask seen left with no key (None when there was no mask or the shapes differ)."""
        out = []
        for r in self._pending:
            rec = {k: v for k, v in r.items() if k != "bad_at"}
            rec["max_abs"], rec["finite"] = float(r["max_abs"]), bool(r["finite"])
            if "bad_at" in r and not rec["finite"]:
                bad = r["bad_at"].cpu()
                rec["bad_positions"] = int(bad.sum())
                rec["bad_at"] = bad.nonzero().tolist()[:16]
                dead = self.dead_queries
                rec["bad_in_fully_masked_queries"] = (int((bad & dead).sum()) if dead is not None
                                                      and dead.shape == bad.shape else None)
            out.append(rec)
        return out


def localize(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The first non-finite gradient and the operation that made it (see the module docstring).

    Returns ``culprit`` (a module name, ``<loss>``, or None when every gradient was finite), ``candidates`` (every
    module that turned finite output gradients into a non-finite input gradient, deepest first),
    ``first_nonfinite_grad`` (the earliest backward record that was not finite) and ``first_nonfinite_forward``."""
    backward = [r for r in records if r["phase"] == "backward"]
    first_bad = next((r for r in backward if not r["finite"]), None)
    first_bad_fwd = next((r for r in records if r["phase"] == "forward" and not r["finite"]), None)
    if first_bad is None:
        return {"culprit": None, "candidates": [], "first_nonfinite_grad": None,
                "first_nonfinite_forward": first_bad_fwd, "backward_records": len(backward)}
    outputs_ok: Dict[str, bool] = {}
    first_bad_input: Dict[str, int] = {}
    for i, r in enumerate(backward):
        if r["what"].startswith("input") or r["what"] in ("query", "key", "value"):
            if not r["finite"]:
                first_bad_input.setdefault(r["module"], i)
        else:
            outputs_ok[r["module"]] = outputs_ok.get(r["module"], True) and r["finite"]
    # a module counts only when gradients reached its outputs (all finite): one whose outputs carry none (the rotary
    # embedding's cos/sin) would otherwise take the blame for a shared input's gradient
    candidates = [m for m in first_bad_input if outputs_ok.get(m, False)]
    candidates.sort(key=lambda m: (-m.count("."), m))
    culprit = LOSS
    if candidates:  # the earliest in the backward, then the deepest module of its chain (its ancestors share the blame)
        early = min(candidates, key=lambda m: first_bad_input[m])
        chain = [m for m in candidates if m == early or m.startswith(early + ".") or early.startswith(m + ".")]
        culprit = chain[0]
    return {"culprit": culprit, "candidates": candidates, "first_nonfinite_grad": first_bad,
            "first_nonfinite_forward": first_bad_fwd,
            "backward_records": len(backward)}


def compared(out: torch.Tensor, ref: torch.Tensor) -> Dict[str, Any]:
    """Is ``out`` finite (how many values are not), is the reference ``ref`` finite, and the largest absolute
    difference between them where both are (None where no position is); both are read as float32."""
    out, ref = out.detach().float(), ref.detach().float()
    both = torch.isfinite(out) & torch.isfinite(ref)
    return {"finite": bool(torch.isfinite(out).all()), "nonfinite_count": int((~torch.isfinite(out)).sum()),
            "ref_finite": bool(torch.isfinite(ref).all()),
            "max_abs_diff": float((out - ref)[both].abs().max()) if both.any() else None,
            "ref_max_abs": float(ref[both].abs().max()) if both.any() else None}


class _NanInBackward(torch.autograd.Function):
    """Identity forward; the backward's gradient times NaN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")


def inject_nan_grad(module: torch.nn.Module):
    """Make ``module``'s backward produce NaN (its forward output is unchanged); returns the hook's handle."""

    def hook(mod, args, out):
        if isinstance(out, torch.Tensor) and out.requires_grad:
            return _NanInBackward.apply(out)
        return out

    return module.register_forward_hook(hook)


def fully_masked_rows(mask: torch.Tensor) -> torch.Tensor:
    """[..., q] booleans: query rows of an attention mask (bool: True attends; float: additive, -inf/min masks) with
    no key to attend to."""
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return ~allowed.any(dim=-1)


def mask_facts(mask: Optional[torch.Tensor]) -> Dict[str, Any]:
    """What an attention function was handed: None (``is_causal``), or its shape, dtype and fully masked query rows
    (in all, rows of the batch having any, and per batch row)."""
    if mask is None:
        return {"mask": None}
    dead = fully_masked_rows(mask)
    return {"mask_shape": list(mask.shape), "mask_dtype": str(mask.dtype),
            "fully_masked_query_rows": int(dead.sum()),
            "rows_with_fully_masked_queries": int(dead.reshape(dead.shape[0], -1).any(-1).sum()),
            "fully_masked_per_row": dead.reshape(dead.shape[0], -1).sum(-1).tolist()}


def padding_facts(attention_mask: torch.Tensor) -> Dict[str, Any]:
    """From a [rows, seq] padding mask (1 = token), with causal attention: query positions that see no key at all
    (left padding before a row's first token; a row of no tokens counts whole), per row and in all."""
    am = attention_mask.bool()
    first = torch.where(am.any(-1), am.float().argmax(-1), torch.full_like(am[:, 0], am.shape[1], dtype=torch.long))
    return {"rows": int(am.shape[0]), "seq_len": int(am.shape[1]),
            "rows_left_padded": int((first > 0).sum()), "fully_masked_query_positions": int(first.sum()),
            "max_left_pad": int(first.max()) if am.shape[0] else 0,
            "left_pad_per_row": first.tolist()}


def masked_row_sdpa_grads(device: str, dtype: torch.dtype, rows: int = 4, heads: int = 3, seq: int = 16,
                          head_dim: int = 64, left_pad: Sequence[int] = (0, 3, 7, 12), seed: int = 0) -> Dict[str, Any]:
    """SDPA alone on left-padded rows (causal + padding, so the pad queries see no key), forward and backward, under
    each backend torch offers (MATH, EFFICIENT_ATTENTION, FLASH_ATTENTION, CUDNN_ATTENTION) and unrestricted.
    Per backend: finite output? finite gradients of q, k, v? the output at the fully masked rows; or the error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, heads, seq, head_dim, generator=gen).to(device, dtype) for _ in range(3))
    pad = torch.zeros(rows, seq, dtype=torch.bool)
    for r, n in enumerate(left_pad[:rows]):
        pad[r, n:] = True
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    mask = (causal[None] & pad[:, None, :])[:, None].to(device)  # [rows, 1, q, k]
    dead = fully_masked_rows(mask)
    out: Dict[str, Any] = {"device": device, "dtype": str(dtype), "fully_masked_query_rows": int(dead.sum())}
    for name in ("default", "MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
        ctx = contextlib.nullcontext() if name == "default" else sdpa_kernel([getattr(SDPBackend, name)])
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        try:
            with ctx:
                o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
                o.float().pow(2).sum().backward()
        except RuntimeError as exc:
            out[name] = {"error": str(exc).splitlines()[0][:200]}
            continue
        dead_out = o.detach().transpose(1, 2)[dead.squeeze(1)] if dead.any() else o.new_zeros(0)
        out[name] = {"output_finite": bool(torch.isfinite(o).all()),
                     "grad_finite": {n: bool(torch.isfinite(t.grad).all()) for n, t in
                                     (("query", qq), ("key", kk), ("value", vv))},
                     "grad_nonfinite_count": sum(int((~torch.isfinite(t.grad)).sum()) for t in (qq, kk, vv)),
                     "masked_rows_output_max_abs": float(dead_out.float().abs().max()) if dead_out.numel() else 0.0}
    return out


@contextlib.contextmanager
def forced_sdpa_backend(name: Optional[str]) -> Iterator[None]:
    """``torch.nn.attention.sdpa_kernel`` restricted to the backend ``name`` (an ``SDPBackend`` member's name);
    None: torch's own choice."""
    if name is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, name)]):
        yield
