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
        self.placement = None
        self._index_layers()

    def _index_layers(self) -> None:
        """Each layer's K and V views, made once: indexing ``keys`` per read and write was two
        of a cached step's ~400 ops per layer on the CPU (issue 46)."""
        self.key_layers, self.value_layers = tuple(self.keys), tuple(self.values)

    @classmethod
    def for_model(cls, model, n_rows: int) -> KVBuffer:
        """The buffer of ``model``'s layers: on its device, or each layer's K/V on its layer's
        device when the layers are placed across several (dlmpipe/placement.py; ``keys`` and
        ``values`` are then lists of per-layer tensors, indexed alike)."""
        cfg, w = model.cfg, model.embed.weight
        p = getattr(model, "placement", None)
        if p is None:
            return cls(cfg.n_layers, cfg.n_kv_heads, n_rows, cfg.head_dim, w.dtype, w.device)
        buffer = cls.__new__(cls)
        buffer.placement = p
        shape = (1, cfg.n_kv_heads, n_rows, cfg.head_dim)
        buffer.keys = [p.empty(p.stage(i), shape, w.dtype) for i in range(cfg.n_layers)]
        buffer.values = [p.empty(p.stage(i), shape, w.dtype) for i in range(cfg.n_layers)]
        buffer._index_layers()
        return buffer

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer ``i``'s keys and values ``[1, Hkv, N, hd]`` (views), as attention reads them."""
        return self.key_layers[i], self.value_layers[i]

    def write(self, i: int, rows: Rows, keys: Tensor | None = None,
              values: Tensor | None = None) -> None:
        """Overwrite the K and/or V of ``rows`` of layer ``i`` (``[1, Hkv, len(rows), hd]``)."""
        for layers, new in ((self.key_layers, keys), (self.value_layers, values)):
            if new is None:
                continue
            if isinstance(rows, slice):
                layers[i][:, :, rows] = new
            else:
                p = self.placement
                layers[i].index_copy_(2, rows if p is None else p.to(rows, p.stage(i)), new)
