"""Random tiny backbones of both families, built in memory (no checkpoint) for engine tests."""
from __future__ import annotations

import torch

from dlmpipe.backbones.model import Backbone, BackboneConfig

VOCAB = 64
MASK_ID = 63
STOP_ID = 0


def tiny_backbone(family: str = "llada", seed: int = 0, n_layers: int = 3, d_model: int = 64,
                  n_heads: int = 4, n_kv_heads: int | None = None, scale: float = 0.3) -> Backbone:
    """A random model whose logits are peaked enough for decoding decisions to matter."""
    dream = family == "dream"
    cfg = BackboneConfig(family=family, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                         n_kv_heads=n_kv_heads or (2 if dream else n_heads), mlp_hidden=2 * d_model,
                         vocab_size=VOCAB, rope_theta=10000.0, norm_eps=1e-5, qkv_bias=dream,
                         mask_id=MASK_ID, stop_ids=[STOP_ID], pad_id=STOP_ID, logit_shift=dream)
    g = torch.Generator().manual_seed(seed)
    model = Backbone(cfg)
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
