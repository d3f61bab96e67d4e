"""Load a local Hugging Face checkpoint directory of any registered family natively (families/).

Everything is checked before a single weight is materialized (config fields, tokenizer, shards
present, safetensors headers, key set, shapes), so a bad checkpoint gives one ``CheckpointError``
naming the problem and the file, and nothing is half-loaded.

Weights are then read tensor by tensor with plain file reads into tensors allocated once in the
target dtype on the target device; the model is built on the meta device and the tensors are
assigned into it. Host memory stays at one copy of the weights plus one staging tensor (when the
dtype or device differs from the file's). We do not use ``safetensors.safe_open(...).get_tensor``:
on the CPU it returns tensors that share the file's memory map, so "loaded" weights would be
file-backed pages that change (or fault) when the checkpoint file is rewritten, and a dtype cast
on top of them doubles the resident peak.

No remote code is ever executed and no loader may prompt: config.json is read as JSON, the
tokenizer classes are named explicitly (never ``AutoTokenizer``, never ``trust_remote_code``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint_config import CheckpointError, read_config
from .model import Backbone, BackboneConfig
from .prompts import ChatPrompt, chat_ids
from ..placement import job_gpus, job_placement, parameter_stage
from .pins import check_sha256
from .tokenizer import load_tokenizer, resolve_special_ids
from .weights import checkpoint_key_map, plan_reads, read_tensors, shard_files

__all__ = ["CheckpointError", "LoadedBackbone", "check_checkpoint", "load_backbone"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class LoadedBackbone:
    """A native backbone with its tokenizer and the checkpoint's special ids."""
    model: Backbone
    tokenizer: object
    path: Path

    @property
    def cfg(self) -> BackboneConfig:
        return self.model.cfg

    @property
    def family(self) -> str:
        return self.cfg.family

    @property
    def mask_id(self) -> int:
        return self.cfg.mask_id

    @property
    def stop_ids(self) -> list[int]:
        return self.cfg.stop_ids

    @property
    def pad_id(self) -> int:
        return self.cfg.pad_id

    @property
    def logit_shift(self) -> bool:
        return self.cfg.logit_shift

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` ids -> raw logits ``[B, N, V]`` (unshifted; see ``model.shift``)."""
        return self.model(input_ids)

    __call__ = forward

    def chat_prompt(self, prompt: str | ChatPrompt, system: str | None = None) -> list[int]:
        """Token ids of a user turn in the checkpoint's chat template (see ``prompts``)."""
        if self.tokenizer is None:
            raise RuntimeError("loaded with with_tokenizer=False: no chat prompts")
        p = prompt if isinstance(prompt, ChatPrompt) else ChatPrompt(user=prompt, system=system)
        return chat_ids(self.tokenizer, self.family, p)

    def encode(self, text: str) -> list[int]:
        """Plain (non-chat) prompt ids, without added special tokens."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def check_checkpoint(path: str | Path) -> BackboneConfig:
    """Validate a checkpoint directory without materializing weights; returns its config."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    cfg = read_config(path)
    resolve_special_ids(cfg, load_tokenizer(path, cfg.family), path)
    with torch.device("meta"):
        model = Backbone(cfg)
    plan_reads(model, checkpoint_key_map(cfg), shard_files(path), path)
    return cfg


def load_backbone(path: str | Path, dtype: str | torch.dtype = "float32",
                  device: str | torch.device = "cpu", with_tokenizer: bool = True,
                  sha256: dict[str, str] | None = None, gpus: int | None = None,
                  light_tokenizer: bool = False) -> LoadedBackbone:
    """Load a local checkpoint directory into the native backbone (see the module docstring).
    ``sha256``: {safetensors file: hash} the weight files must have, checked first. ``gpus``
    (None: the job's, ``placement.job_gpus``): on CUDA with more than one, each tensor is read
    straight onto the GPU of its layer's stage (dlmpipe/placement.py). ``light_tokenizer``: the
    tokenizer without transformers where the checkpoint allows (tokenizer.py; the model jobs)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    check_sha256(path, sha256)
    if isinstance(dtype, str) and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    device = torch.device(device)
    cfg = read_config(path)
    tokenizer = load_tokenizer(path, cfg.family, light=light_tokenizer) if with_tokenizer else None
    resolve_special_ids(cfg, tokenizer, path)
    with torch.device("meta"):
        model = Backbone(cfg)
    plan = plan_reads(model, checkpoint_key_map(cfg), shard_files(path), path)
    placement = job_placement(device, job_gpus() if gpus is None else gpus, cfg.n_layers)
    if placement is None:
        state = read_tensors(plan, torch_dtype, device)
    else:  # each stage's tensors read onto its GPU
        state = {}
        for stage, dev in enumerate(placement.devices):
            state.update(read_tensors({n: e for n, e in plan.items()
                                       if parameter_stage(n, placement) == stage}, torch_dtype, dev))
    if cfg.tie_embeddings:  # one tensor, both names (the checkpoint stores it once)
        state["head.weight"] = state["embed.weight"]
    model.load_state_dict(state, assign=True, strict=True)
    model.eval().requires_grad_(False)
    model.placement = placement
    return LoadedBackbone(model=model, tokenizer=tokenizer, path=path)
