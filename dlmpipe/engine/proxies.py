"""Singular proxies of the value projections (docs/METHODS.md §2.3; SPA-Cache §3.3).

Per layer, the thin SVD of the whole value projection (all KV heads, no per-head split)
``W_v = A S B^T`` in float32. The proxy of a (RMS-normed) attention input ``h`` at rank r is
``f_proxy(h) = S_r B_r^T h``: since ``A`` has orthonormal columns, ``|W_v h| = |S B^T h|`` and
cosine similarities of value vectors (without bias) equal those of the full-rank proxy, and the
rank-r truncation keeps the dominant directions of the drift.

The file ``backbones/{b}/proxies.safetensors`` holds, per layer, ``layers.{i}.singular_values``
``[k]`` and ``layers.{i}.right_vectors_t`` (``B^T``, ``[k, d_model]``), ``k = min(n_kv*hd, d)``,
with metadata naming the backbone and its fingerprint. It depends on the weights only, so one
file serves every SPA method of a backbone; the rank is chosen when it is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

FORMAT = "dlmpipe-singular-proxies/1"


@dataclass
class SingularProxies:
    """Per-layer ``S`` ``[k]`` and ``B^T`` ``[k, d]`` (float32, descending singular values)."""
    singular_values: list[Tensor]
    right_vectors_t: list[Tensor]
    metadata: dict

    @property
    def n_layers(self) -> int:
        return len(self.singular_values)

    @property
    def stored_rank(self) -> int:
        return min(s.shape[0] for s in self.singular_values)

    def projection(self, layer: int, rank: int) -> Tensor:
        """``S_r B_r^T`` ``[r, d]``: ``proxy = h @ projection.T``."""
        self.check_rank(rank)
        return self.singular_values[layer][:rank, None] * self.right_vectors_t[layer][:rank]

    def check_rank(self, rank: int) -> None:
        where = self.metadata.get("source", "the proxies")
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"proxy rank must be a positive integer (got {rank!r})")
        if rank > self.stored_rank:
            raise ValueError(f"proxy rank {rank} exceeds the rank {self.stored_rank} stored in {where} "
                             f"(backbone {self.metadata.get('backbone', '?')}: min(n_kv_heads*head_dim, "
                             f"d_model) = {self.stored_rank}); choose rank <= {self.stored_rank}")


def value_svd(weights: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """Thin float32 SVD of each value projection ``[n_kv*hd, d]``: (S, B^T) per layer."""
    s_all, bt_all = [], []
    for w in weights:
        _, s, bt = torch.linalg.svd(w.detach().to(torch.float32), full_matrices=False)
        s_all.append(s.cpu().contiguous())
        bt_all.append(bt.cpu().contiguous())
    return s_all, bt_all


def proxies_from_model(model, metadata: dict | None = None) -> SingularProxies:
    """In-memory proxies of a live model (tests, benchmarks, library use without the workflow)."""
    s, bt = value_svd([blk.v_proj.weight for blk in model.blocks])
    return SingularProxies(s, bt, {"source": "the in-memory SVD", **(metadata or {})})


def read_value_weights(checkpoint: str | Path) -> list[Tensor]:
    """Only the value projections of a checkpoint directory, in float32 on the CPU (an 8B model
    never has to be loaded whole for its SVD)."""
    from ..backbones import weights
    from ..backbones.checkpoint_config import read_config
    from ..backbones.model import Backbone

    path = Path(checkpoint)
    cfg = read_config(path)
    with torch.device("meta"):
        model = Backbone(cfg)
    plan = weights.plan_reads(model, weights.checkpoint_key_map(cfg), weights.shard_files(path), path)
    names = [f"blocks.{i}.v_proj.weight" for i in range(cfg.n_layers)]
    state = weights.read_tensors({n: plan[n] for n in names}, torch.float32, torch.device("cpu"))
    return [state[n] for n in names]


def write_proxies(manifest: str | Path, out: str | Path) -> dict:
    """The SVD of the manifest's checkpoint (``write_checkpoint_proxies`` with its path, name and
    pinned hashes)."""
    from ..backbones.manifest import read_manifest

    man = read_manifest(manifest)
    return write_checkpoint_proxies(man["path"], out, name=man["name"], sha256=man.get("sha256"))


def write_checkpoint_proxies(path: str | Path, out: str | Path, name: str,
                             sha256: dict[str, str] | None = None) -> dict:
    """The SVD job: read the checkpoint directory's value projections (its pinned sha256 checked,
    as every loader does), write ``proxies.safetensors`` atomically. It records the backbone
    fingerprint its manifest records (``checkpoint_fingerprint``: the same files give the same),
    so it needs no manifest: the workflow runs it beside prepare_backbone, not after it."""
    from safetensors.torch import save_file

    from ..backbones.checkpoint_config import read_config
    from ..backbones.manifest import checkpoint_fingerprint
    from ..backbones.pins import check_sha256
    from ..io import atomic_write

    path = Path(path).resolve()
    check_sha256(path, sha256)  # the pinned weights, as every loader checks
    s_all, bt_all = value_svd(read_value_weights(path))
    tensors = {}
    for i, (s, bt) in enumerate(zip(s_all, bt_all)):
        tensors[f"layers.{i}.singular_values"] = s
        tensors[f"layers.{i}.right_vectors_t"] = bt
    metadata = {"format": FORMAT, "backbone": name, "fingerprint": checkpoint_fingerprint(path),
                "family": read_config(path).family, "n_layers": str(len(s_all)),
                "rank": str(min(s.shape[0] for s in s_all)), "d_model": str(bt_all[0].shape[1])}
    atomic_write(out, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return metadata


def load_proxies(path: str | Path, fingerprint: str | None = None) -> SingularProxies:
    """Read a proxies file; with ``fingerprint``, refuse one computed for other weights."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: proxies file does not exist (run the svd rule)")
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: not a dlmpipe proxies file (format {meta.get('format')!r})")
        n = int(meta["n_layers"])
        # .clone(): own memory, not pages of a file that a rerun of the svd rule may replace
        s = [f.get_tensor(f"layers.{i}.singular_values").clone() for i in range(n)]
        bt = [f.get_tensor(f"layers.{i}.right_vectors_t").clone() for i in range(n)]
    if fingerprint is not None and meta.get("fingerprint") != str(fingerprint):
        raise ValueError(f"{path}: computed for backbone fingerprint {meta.get('fingerprint')}, but the "
                         f"backbone now has fingerprint {fingerprint}; rerun the svd rule")
    return SingularProxies(s, bt, {**meta, "source": str(path)})


def resolve_proxies(proxies, model) -> SingularProxies:
    """A cache's ``proxies`` argument: a loaded object, a file path, or None (SVD in memory)."""
    if proxies is None:
        return proxies_from_model(model)
    if isinstance(proxies, SingularProxies):
        return proxies
    return load_proxies(proxies)


def check_against_model(proxies: SingularProxies, model) -> None:
    cfg = model.cfg
    d = proxies.right_vectors_t[0].shape[1] if proxies.n_layers else None
    if proxies.n_layers != cfg.n_layers or d != cfg.d_model:
        raise ValueError(f"{proxies.metadata.get('source', 'proxies')}: {proxies.n_layers} layers of "
                         f"width {d}, but the backbone has {cfg.n_layers} layers of width "
                         f"{cfg.d_model}; rerun the svd rule")

