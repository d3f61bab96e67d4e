"""A backbone's layers placed across the GPUs a job got (a model larger than one GPU).

The layers are split into contiguous stages of (nearly) equal size, one per device, in order:
the embedding on the first device, the final norm and the head on the last. The model's
layer-indexed primitives (backbones/model.py) move their inputs to their layer's device
(``Backbone.to_layer``); the decode loops move the hidden rows once per layer boundary; each
layer's K/V buffer is allocated on its layer's device (engine/kv.py); the logits come back to
the first device, where the sampler's tensors live. So every cache runs unchanged, one stage at a
time (no pipelining: the GPUs hold the weights, they do not decode in parallel).

``place(model, devices)`` moves the parameters and sets ``model.placement``; a one-device job
has no placement (``model.placement is None``) and every move is skipped.
"""
from __future__ import annotations

import torch
from torch import Tensor


def stages(n_layers: int, n_devices: int) -> list[int]:
    """Each layer's stage: contiguous, the first ``n_layers % n_devices`` stages one longer."""
    per, extra = divmod(n_layers, n_devices)
    out: list[int] = []
    for s in range(n_devices):
        out += [s] * (per + (s < extra))
    return out


class Placement:
    """Which device each layer runs on, and the moves between them."""

    def __init__(self, devices: list[torch.device], n_layers: int):
        if not devices:
            raise ValueError("a placement needs at least one device")
        self.devices = [torch.device(d) for d in devices]
        self.layer_stage = stages(n_layers, len(self.devices))

    @property
    def last(self) -> int:
        return len(self.devices) - 1

    def stage(self, layer: int) -> int:
        return self.layer_stage[layer]

    def device(self, layer: int) -> torch.device:
        return self.devices[self.stage(layer)]

    def stage_of(self, x: Tensor) -> int:
        """The stage whose device holds ``x``."""
        return self.devices.index(x.device)

    def to(self, x: Tensor, stage: int) -> Tensor:
        """``x`` on ``stage``'s device (itself when it is there)."""
        return x.to(self.devices[stage])

    def empty(self, stage: int, shape, dtype: torch.dtype) -> Tensor:
        """An uninitialised tensor on ``stage``'s device (a layer's K/V buffer)."""
        return torch.empty(shape, dtype=dtype, device=self.devices[stage])


def place(model, devices: list[torch.device | str], placement: Placement | None = None):
    """Place ``model``'s layers across ``devices`` (in place; returns the model): stage s's
    blocks on ``devices[s]``, the embedding on the first, final norm and head on the last.
    ``placement``: one already built over these devices (tests record its moves)."""
    p = placement or Placement(list(devices), model.cfg.n_layers)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied head is the embedding (first)
            param.data = param.data.to(p.devices[parameter_stage(name, p)])
    model._rope_cache.clear()
    model.placement = p
    return model


#: the environment variable a model job's rule sets to the GPUs it asked for (common.smk's
#: ``model_job_resources``: ``DLMPIPE_GPUS={resources.gpu}``)
GPUS_ENV = "DLMPIPE_GPUS"


def job_gpus() -> int:
    """The GPUs this job asked for (``GPUS_ENV``; 1 when unset: one device)."""
    import os

    return int(os.environ.get(GPUS_ENV) or 1)


def job_placement(device: torch.device, gpus: int, n_layers: int) -> Placement | None:
    """The placement of a job's layers over the ``gpus`` CUDA devices it got (SLURM's
    CUDA_VISIBLE_DEVICES numbers them from 0); None on one device."""
    if device.type != "cuda" or gpus <= 1:
        return None
    have = torch.cuda.device_count()
    if have < gpus:
        raise RuntimeError(f"the job asked for {gpus} GPUs ({GPUS_ENV}) but sees {have} "
                           "(CUDA_VISIBLE_DEVICES); the model's layers need them all")
    return Placement([torch.device("cuda", i) for i in range(gpus)], n_layers)


def parameter_stage(name: str, p: Placement) -> int:
    """The stage holding parameter ``name`` of the native model: a block's its layer's, the
    embedding the first, the final norm and the head the last."""
    if name.startswith("blocks."):
        return p.stage(int(name.split(".")[1]))
    return 0 if name.startswith("embed.") else p.last
