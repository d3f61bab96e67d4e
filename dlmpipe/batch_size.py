"""The samples a job decodes together, without torch: the generate and timing jobs resolve their
``batch_size`` here, and so do ``dlmpipe plan`` (plan.py) and the GPU plan (gpus.py), which size
jobs before any model is loaded and import neither torch nor the jobs' modules.
"""
from __future__ import annotations

#: ``batch_size: auto`` per device type (batching.default_batch_size says why)
AUTO = {"cuda": 16, "cpu": 8}


def device_type(device) -> str:
    """``"cuda"`` / ``"cpu"`` of a torch.device or a device name (``"cuda:1"``)."""
    return getattr(device, "type", None) or str(device).split(":", 1)[0]


def default_batch_size(device) -> int:
    return AUTO["cuda"] if device_type(device) == "cuda" else AUTO["cpu"]


def resolve_batch_size(batch_size: int | str, device, compile: str = "none",
                       shadow: dict | None = None) -> int:
    """The samples a generate job decodes together. ``auto``: ``default_batch_size`` of the
    device (a torch.device or its name), or 1 when steps are compiled or a shadow probe runs
    (both need one sample at a time: a captured graph or compiled step cannot pause mid-step for
    the other slots, and the probe's clones run their own forwards). An explicit size above 1
    with a compile mode is refused (the campaign refuses it at config time)."""
    if batch_size == "auto":
        return 1 if compile != "none" or shadow is not None else default_batch_size(device)
    b = int(batch_size)
    if b < 1:
        raise ValueError(f"batch_size: {batch_size!r}; use a positive integer or auto")
    if b > 1 and compile != "none":
        raise ValueError(f"batch_size {b} with compile: {compile}: batched decoding runs eagerly "
                         "(a captured or compiled step cannot wait for the other slots); use "
                         "batch_size 1 (or auto) with compile modes")
    return 1 if shadow is not None else b
