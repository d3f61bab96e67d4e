"""Dream's native sampler (docs/METHODS.md §1.5), as Dream's released generation code decodes.

No blocks: at every step every masked response position is a candidate. ``steps`` steps (null:
G) walk the times ``t = linspace(1, eps, steps + 1)``; step ``i`` goes from ``t_i`` to
``t_(i+1)``. Per step, tokens and confidences come from the logits after Dream's filters
(temperature, then nucleus ``top_p``, then ``top_k``; removed logits set to the dtype's minimum),
``probs = softmax``; the token is the most probable one (temperature 0) or a draw from ``probs``
(temperature > 0). ``alg`` decides which candidates are unmasked:

- ``origin``: each masked position independently, with probability ``1 - t_(i+1) / t_i`` (1 at
  the last step); no confidence;
- ``maskgit_plus`` (probability of the token), ``topk_margin`` (top-1 minus top-2 probability)
  or ``entropy`` (``sum p log(p + 1e-10)``, the negative entropy): the
  ``floor(m (1 - t_(i+1) / t_i))`` most confident of the ``m`` masked positions (all ``m`` at the
  last step), or, with ``alg_temp > 0``, that many drawn without replacement with probabilities
  ``softmax(confidence / alg_temp)``.

Like the released code, the MASK token is not excluded: a position given MASK stays masked and
is a candidate again at the next step. The state stays on the logits' device and no step waits
for the device (counts and selections are tensors; the draw without replacement is Gumbel top-k,
the same distribution as ``torch.multinomial`` without replacement; a token is drawn as
``torch.multinomial`` draws it, without its checks' host reads).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Sampler, to_device

def filter_logits(logits: Tensor, temperature: float, top_p: float | None,
                  top_k: int | None) -> Tensor:
    """Dream's filters in its order: ``/ temperature`` (> 0), nucleus ``top_p`` (< 1: keep the
    smallest prefix of the sorted probabilities whose sum exceeds it, the first always), then
    ``top_k``; what is removed gets the dtype's minimum."""
    if temperature > 0:
        logits = logits / temperature
    lowest = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        beyond = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1) > top_p
        beyond = torch.cat([torch.zeros_like(beyond[..., :1]), beyond[..., :-1]], dim=-1)
        logits = logits.masked_fill(torch.zeros_like(beyond).scatter(-1, order, beyond), lowest)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, lowest)
    return logits


def confidence_of(probs: Tensor, tokens: Tensor, alg: str) -> Tensor:
    """Per-row confidence of ``alg`` (higher: unmasked earlier)."""
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    return probs.gather(-1, tokens[..., None])[..., 0]


def draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row from ``probs``, as ``torch.multinomial(probs, 1)`` draws it (its kernel:
    ``argmax(probs / q)``, ``q ~ Exp(1)`` from the same generator, so the same tokens) without
    the kernel's two host reads checking ``probs`` (docs/METHODS.md §1.5)."""
    return (probs / torch.empty_like(probs).exponential_(1, generator=generator)).argmax(-1)


def transfer_fractions(steps: int, eps: float) -> Tensor:
    """``1 - t_(i+1) / t_i`` of each step (float32, as Dream computes them), the last one 1."""
    t = torch.linspace(1, eps, steps + 1)
    fractions = 1 - t[1:] / t[:-1]
    fractions[-1] = 1.0
    return fractions


def transfer_count(masked: Tensor, fraction: Tensor) -> Tensor:
    """How many masks a step unmasks: ``floor(m * fraction)`` in float32 (the last step's
    fraction is 1: all of them)."""
    return (masked.sum().to(torch.float32) * fraction).floor().to(torch.long)


class DreamSampler(Sampler):
    def __init__(self, *, steps: int | None, eps: float, alg: str, temperature: float,
                 top_p: float | None, top_k: int | None, alg_temp: float | None):
        self.steps_opt, self.eps, self.alg = steps, eps, alg
        self.temperature, self.top_p, self.top_k, self.alg_temp = temperature, top_p, top_k, alg_temp

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        self.total_steps = self.steps_opt or gen_len
        self.fractions = to_device(transfer_fractions(self.total_steps, self.eps), self.device)
        self.rng: torch.Generator | None = None
        self.rng_ready = False

    def _generator(self, device: torch.device) -> torch.Generator | None:
        """The sample's generator on the CPU; on an accelerator, a generator of that device seeded
        once per sample from it (draws stay on the device, reproducible per sample)."""
        if not self.rng_ready:
            self.rng_ready = True
            if device.type == "cpu" or self.generator is None:
                self.rng = self.generator
            else:
                seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
                self.rng = torch.Generator(device=device).manual_seed(seed)
        return self.rng

    def _uniform(self, shape, device) -> Tensor:
        return torch.rand(shape, generator=self._generator(device), device=device)

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        device = response.device
        masked = response == self.mask_id
        fraction = self.fractions[self.steps]
        # rows of visible positions may be stale or NaN (caches serve masked rows): neutral rows
        logits = torch.where(masked[:, None], logits, 0.0)
        probs = torch.softmax(filter_logits(logits, self.temperature, self.top_p, self.top_k), -1)
        if self.temperature > 0:
            tokens = draw(probs, self._generator(device))
        else:
            tokens = probs.argmax(-1)

        if self.alg == "origin":
            chosen = masked & (self._uniform(masked.shape, device) < fraction)
        else:
            keys = confidence_of(probs, tokens, self.alg)
            if self.alg_temp:  # Gumbel top-k: n draws without replacement ~ softmax(keys / alg_temp)
                u = self._uniform(keys.shape, device).clamp_min(torch.finfo(torch.float32).tiny)
                keys = keys / self.alg_temp - torch.log(-torch.log(u))
            keys = torch.where(masked, keys, float("-inf"))
            order = torch.argsort(keys, descending=True, stable=True)
            rank = torch.empty_like(order)
            rank[order] = torch.arange(order.numel(), device=device)
            chosen = masked & (rank < transfer_count(masked, fraction))
        response.copy_(torch.where(chosen, tokens, response))
        self.steps += 1
        self._track(response)
        self.done = self.steps == self.total_steps
