"""Models and logits the engine and sampler tests share.

- random tiny backbones of both families, built in memory (no checkpoint);
- ``decode_method``: one sample decoded with a config method (sampler + cache specs);
- hand-built logits for the sampler rules (a 12-token vocabulary, MASK = 11, a 3-token prompt).
On-disk checkpoints of the real formats live in tests/checkpoints.py.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from dlmpipe.backbones.model import Backbone, BackboneConfig
from dlmpipe.decode import DecodeResult, decode
from dlmpipe.methods import build_method

VOCAB = 64
MASK_ID = 63
STOP_ID = 0
FAMILIES = ["llada", "dream"]
#: block-causal families (docs/MODELS.md): SDAR (Qwen3: q/k norms, unshifted) and Fast-dLLM v2
#: (Qwen2.5: biases, shifted), decoded one active block at a time (dlmpipe/blockwise.py)
BLOCK_FAMILIES = ["sdar", "fast_dllm_v2"]
#: the tiny block-causal models' block sizes (the releases': SDAR 4, Fast-dLLM v2 32, LLaDA2.0 32)
TINY_BLOCK = {"sdar": 4, "fast_dllm_v2": 8, "llada2": 8}
#: mixture-of-experts families (docs/MODELS.md; dlmpipe/backbones/moe.py): LLaDA-MoE
#: (bidirectional, softmax + expert bias, a shared expert), LLaDA2.0 (block-causal, sigmoid
#: grouped routing, scaled weights, a dense first layer, partial RoPE)
MOE_FAMILIES = ["llada_moe", "llada2"]
#: the tiny MoE models' routing: 8 experts, top-2, experts 32 wide, one shared expert
TINY_MOE = {
    "llada_moe": dict(n_experts=8, experts_per_token=2, expert_hidden=32, shared_expert_hidden=32,
                      router="softmax_biased", router_bias=True, qk_norm=True),
    "llada2": dict(n_experts=8, experts_per_token=2, expert_hidden=32, shared_expert_hidden=32,
                   router="sigmoid_grouped", router_bias=True, n_group=4, topk_group=2,
                   routed_scaling=2.5, dense_layers=[0], qk_norm=True),
}


#: the MASK logit of a ``never_mask`` model: no softmax gives it a probability (exp underflows
#: to 0 in float32 and float64) and no Gumbel noise (< 40) lifts it over these models' logits
MASK_LOGIT = -1e4


class NeverMask(Backbone):
    """A tiny model that, like a trained one (MASK is never a training target), gives MASK no
    probability, so no sampler's argmax or draw picks it from any random stream. A random model
    otherwise ranks MASK high at some position now and then, and the released samplers do not
    exclude it (docs/METHODS.md §1.5): a response could keep a MASK."""

    def logits(self, h: Tensor) -> Tensor:
        out = super().logits(h)
        out[..., self.cfg.mask_id] = MASK_LOGIT
        return out


def tiny_backbone(family: str = "llada", seed: int = 0, n_layers: int = 3, d_model: int = 64,
                  n_heads: int = 4, n_kv_heads: int | None = None, scale: float = 0.3,
                  stop_ids: list[int] | None = None, never_mask: bool = False) -> Backbone:
    """A random model whose logits are peaked enough for decoding decisions to matter.
    ``stop_ids``: None is ``[STOP_ID]`` (block-causal models stop after a block holding one);
    ``never_mask``: a ``NeverMask`` model (the same weights)."""
    shifted = family in ("dream", "fast_dllm_v2")
    cfg = BackboneConfig(family=family, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                         n_kv_heads=n_kv_heads or (2 if shifted else n_heads), mlp_hidden=2 * d_model,
                         vocab_size=VOCAB, rope_theta=10000.0, norm_eps=1e-5, qkv_bias=shifted,
                         mask_id=MASK_ID, stop_ids=[STOP_ID] if stop_ids is None else stop_ids,
                         pad_id=STOP_ID if stop_ids is None else None, logit_shift=shifted,
                         qk_norm=family == "sdar", block_size=TINY_BLOCK.get(family))
    if family in TINY_MOE:
        cfg = dataclasses.replace(cfg, **TINY_MOE[family],
                                  rope_dim=cfg.head_dim // 2 if family == "llada2" else None)
    g = torch.Generator().manual_seed(seed)
    model = (NeverMask if never_mask else Backbone)(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5 if p.dim() == 2 else 1))
    return model.eval().requires_grad_(False)


def random_prompt(length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(1, MASK_ID, (length,), generator=g)


def decode_method(model: Backbone, sampler: dict, cache: dict, prompt: torch.Tensor,
                  gen_len: int = 16, seed: int = 0, artifacts: dict | None = None) -> DecodeResult:
    """Decode one sample with ``{"sampler": sampler, "cache": cache}`` (defaults filled by the
    registry); ``seed`` seeds the sampler's generator (temperature > 0, random orders), always:
    two decodes compared by a test never depend on the global RNG's state (Dream's default
    ``alg: origin`` draws which masks to unmask; unseeded, a test's outcome followed the tests
    run before it and the thread count)."""
    s, c = build_method({"sampler": sampler, "cache": cache}, model, artifacts)
    generator = torch.Generator().manual_seed(seed)
    return decode(model, s, c, prompt, gen_len, generator)


# ---- hand-built logits for the sampler rules --------------------------------------------------
HAND_VOCAB, HAND_MASK, HAND_PROMPT = 12, 11, 3


def logits_for(tokens: list[int], probs: list[float]) -> torch.Tensor:
    """Rows whose softmax gives ``probs[i]`` to ``tokens[i]`` (the rest spread evenly, MASK
    included)."""
    rows = []
    for t, p in zip(tokens, probs):
        row = torch.full((HAND_VOCAB,), math.log((1 - p) / (HAND_VOCAB - 1)), dtype=torch.float64)
        row[t] = math.log(p)
        rows.append(row)
    return torch.stack(rows).float()


def start(sampler, gen_len: int) -> torch.Tensor:
    """A sequence of the 3-token prompt and ``gen_len`` masks, the sampler begun on it."""
    x = torch.cat([torch.tensor([1, 2, 3]), torch.full((gen_len,), HAND_MASK)])
    sampler.begin(HAND_PROMPT, gen_len, HAND_MASK)
    return x
