"""Per-layer key/value buffers of one sample: the storage every cache shares.

Allocated once per sample for all N rows and every layer (``[L, 1, Hkv, N, hd]``) and written in
place, so a cached step allocates no K/V (docs/ARCHITECTURE.md, performance shape). Archer writes
the response range, the row caches (Fast-dLLM, dKV-Cache) and the selective caches (SPA-Cache,
dLLM-Cache) scattered rows; attention always reads a layer's whole buffer.
"""
from __future__ import annotations

import torch
from torch import Tensor

#: rows of a write: a contiguous range, or ascending absolute row indices
Rows = slice | Tensor


class KVBuffer:
    """Keys and values of all rows of one sample, every layer, updated in place."""

    def __init__(self, n_layers: int, n_kv_heads: int, n_rows: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (n_layers, 1, n_kv_heads, n_rows, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)

    @classmethod
    def for_model(cls, model, n_rows: int) -> KVBuffer:
        cfg, w = model.cfg, model.embed.weight
        return cls(cfg.n_layers, cfg.n_kv_heads, n_rows, cfg.head_dim, w.dtype, w.device)

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer ``i``'s keys and values ``[1, Hkv, N, hd]`` (views), as attention reads them."""
        return self.keys[i], self.values[i]

    def write(self, i: int, rows: Rows, keys: Tensor | None = None,
              values: Tensor | None = None) -> None:
        """Overwrite the K and/or V of ``rows`` of layer ``i`` (``[1, Hkv, len(rows), hd]``)."""
        for buffer, new in ((self.keys, keys), (self.values, values)):
            if new is None:
                continue
            if isinstance(rows, slice):
                buffer[i][:, :, rows] = new
            else:
                buffer[i].index_copy_(2, rows, new)
