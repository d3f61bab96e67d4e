"""SDAR's generation loop (JetAstra/SDAR ``generate.py``, ``block_diffusion_generate``;
docs/METHODS.md §1.11), the sampler of one active block of a block-causal backbone.

The block loop itself (prompt's whole blocks prefilled, the prompt's tail decoded with the first
active block, a finished block's K/V computed once with its final tokens) is the backbone's
(dlmpipe/blockwise.py); this is what one denoising step of the active block decides. The
block's n positions (its prompt rows included, as the release counts them) are split over
``steps`` (the remainder to the first steps): step s transfers k_s tokens. Each step draws a
token per position from ``softmax(logits / temperature)`` after top-k and top-p filtering
(temperature 0: the most probable), with its probability as confidence, and by
``remasking``:

- ``low_confidence_static``: the k_s most confident masked positions;
- ``low_confidence_dynamic`` (the release's default): every masked position above
  ``confidence_threshold`` when there are at least k_s of them, else the k_s most confident;
- ``sequential``: k_s positions from the first mask on;
- ``entropy_bounded``: masked positions by ascending entropy of their distribution, the largest
  prefix whose entropies sum below ``eb_threshold`` (at least one).

The block ends when it has no masks. ``rule: evaluation`` is the release's OpenCompass loop
(``evaluation/opencompass/opencompass/models/huggingface_bd3.py``): the token is drawn as above
but its confidence is its probability under the *unfiltered* ``softmax(logits / temperature)``
(lines 74-75, 90), only masked positions are transferred (line 233), and temperature must be
positive (line 73). Both loops rank the whole block, its prompt rows and visible positions at
-inf, and so does this sampler (torch.topk's order among equal confidences depends on the vector
ranked). ``rule: released``: the release's ``topk`` also picks visible positions once k_s
exceeds the masks left, and rewrites them with their current draw; the default (the paper's
rule) transfers masked positions only. The release rewrites a picked prompt row too; here the
prompt is kept under every rule (docs/METHODS.md §1.11). The release's ``entropy_bounded``
cannot run (it sums the chosen tokens' p log p over the block and never initialises its
selection), so the registry refuses it with ``released``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Sampler, to_device

REMASKING = ("low_confidence_dynamic", "low_confidence_static", "sequential", "entropy_bounded")


def transfer_counts(block: int, steps: int) -> list[int]:
    """The release's ``get_num_transfer_tokens``: ``block`` split over ``steps``, the remainder
    to the first steps."""
    base, rem = divmod(block, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def filtered_probs(logits: Tensor, temperature: float, top_k: int | None, top_p: float) -> Tensor:
    """float64 ``softmax(logits / T)`` after top-k and top-p (the release's order: top-k, then
    the smallest prefix of the sorted distribution reaching top_p, its first token always kept);
    at T = 0 untempered, the filters still applied (a caller wanting the release's plain softmax
    at T = 0, Fast-dLLM v2's ``sample_with_top_p``, passes no filter)."""
    wide = logits.to(torch.float64)
    if temperature > 0:
        wide = wide / temperature
    if top_k:
        kth = torch.topk(wide, min(top_k, wide.shape[-1]), dim=-1).values[..., -1:]
        wide = wide.masked_fill(wide < kth, float("-inf"))
    if top_p < 1.0:
        ordered, index = torch.sort(wide, descending=True, dim=-1)
        drop = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        wide = wide.masked_fill(torch.zeros_like(drop).scatter(-1, index, drop), float("-inf"))
    return torch.softmax(wide, dim=-1)


def draw(probs: Tensor, temperature: float, generator: torch.Generator | None, mask_id: int,
         fallback: Tensor | None = None) -> Tensor:
    """One token per row: the most probable at T = 0, else by inverse CDF with uniforms from the
    sample's CPU generator (the same tokens on every device). A row that draws MASK gets its most
    probable other token (under ``fallback`` when given: the unfiltered distribution, which a
    top-k of 1 does not reduce to MASK alone): in the releases a drawn MASK leaves its position masked (SDAR's fixed
    steps then end the block with it), while here a block ends when no masks remain, so a model
    that ranks MASK first would never finish (docs/METHODS.md §1.11). Other draws are unchanged."""
    if temperature == 0:
        tokens = probs.argmax(-1)
    else:
        u = to_device(torch.rand(probs.shape[:-1], dtype=torch.float64, generator=generator), probs.device)
        cdf = torch.cumsum(probs, dim=-1)
        tokens = torch.searchsorted(cdf, (u * cdf[..., -1])[..., None], right=True).clamp_max(
            probs.shape[-1] - 1)[..., 0]
    others = (probs if fallback is None else fallback).clone()
    others[..., mask_id] = -1.0
    return torch.where(tokens == mask_id, others.argmax(-1), tokens)


class SDARSampler(Sampler):
    def __init__(self, *, remasking: str, steps: int, confidence_threshold: float,
                 eb_threshold: float, temperature: float, top_k: int | None, top_p: float, rule: str):
        if remasking not in REMASKING:
            raise ValueError(f"remasking must be one of {', '.join(REMASKING)}")
        self.remasking, self.denoising_steps = remasking, steps
        self.threshold, self.eb_threshold = confidence_threshold, eb_threshold
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.released, self.evaluation = rule == "released", rule == "evaluation"
        if self.evaluation and (temperature <= 0 or remasking not in REMASKING[:2]):
            raise ValueError("rule evaluation needs temperature > 0 and a low_confidence remasking")

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        # the release splits the whole block, its prompt rows included (prompt_len + gen_len)
        self.schedule = transfer_counts(prompt_len + gen_len, self.denoising_steps)
        self.block_step = 0

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        masked = response == self.mask_id
        probs = filtered_probs(logits, self.temperature, self.top_k, self.top_p)
        # the unfiltered distribution: the evaluation rule's confidence, and where a row draws
        # MASK its most probable other token (a top-k of 1 leaves MASK alone in ``probs``)
        plain = (filtered_probs(logits, self.temperature, None, 1.0)
                 if self.top_k or self.top_p < 1.0 else probs)
        tokens = draw(probs, self.temperature, self.generator, self.mask_id, plain)
        # huggingface_bd3.py: the token's probability before top-k/top-p; generate.py: after
        confidence = (plain if self.evaluation else probs).gather(-1, tokens[:, None])[:, 0]
        self.last_confidence = (0, confidence)
        k = self.schedule[self.block_step] if self.block_step < len(self.schedule) else 1
        transfer = self._transfer(masked, confidence, probs, min(k, x.shape[0]))
        if not self.released:
            transfer &= masked
        response[transfer] = tokens[transfer]
        self.block_step += 1
        self.steps += 1
        self._track(response)
        self.done = not bool((response == self.mask_id).any())  # the loop's one read per step

    def _transfer(self, masked: Tensor, confidence: Tensor, probs: Tensor, k: int) -> Tensor:
        chosen = torch.zeros_like(masked)
        if self.remasking == "sequential":
            first = int(masked.to(torch.int8).argmax())
            chosen[first:first + k] = True
            return chosen
        if self.remasking == "entropy_bounded":
            entropy = -torch.where(probs > 0, probs * probs.log(), 0.0).sum(-1)
            entropy = entropy.masked_fill(~masked, float("inf"))
            ordered, order = torch.sort(entropy, stable=True)
            n = torch.searchsorted(torch.cumsum(ordered, 0), torch.tensor(
                self.eb_threshold, dtype=ordered.dtype, device=ordered.device), right=False)
            n = n.clamp(min=1, max=masked.sum())
            chosen[order] = torch.arange(order.numel(), device=order.device) < n
            return chosen
        scored = confidence.masked_fill(~masked, float("-inf"))
        # the release ranks the whole block, its prompt rows at -inf (generate.py lines 164-165,
        # 177-178; huggingface_bd3.py 249, 258): topk's order among equal confidences (top_k 1's
        # 1.0 everywhere, the -inf rows once k_s exceeds the masks left) depends on that vector,
        # so the same one is ranked here; prompt rows picked are kept (the module docstring)
        p = self.prompt_len
        top = torch.topk(torch.cat([scored.new_full((p,), float("-inf")), scored]), k).indices - p
        chosen[top[top >= 0]] = True
        if self.remasking == "low_confidence_dynamic":
            high = scored > self.threshold
            chosen = torch.where(high.sum() >= k, high, chosen)
        return chosen
