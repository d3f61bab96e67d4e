"""dInfer's decoders: hierarchical and credit decoding (inclusionAI/dInfer; docs/METHODS.md §1.13,
§1.14). Both run Fast-dLLM's block loop (§1.2): blocks left to right, each stepped until it has no
masks; per step the candidates are the block's masked positions with their tokens (argmax,
Gumbel noise at temperature > 0, never the MASK id).

- Hierarchical decoding (``HierarchyDecoder``): the block's masked positions fall into runs of
  adjacent masked positions (segments); a step unmasks, in every segment, the positions whose
  confidence equals the segment's maximum, if above ``low_threshold``; every position above
  ``threshold``; and always the block's most confident position (the first on ties).
- Credit decoding (``CreditThresholdParallelDecoder``): a credit matrix ``C [block, V]`` (float32,
  zero at the block's start) decays by ``decay_beta`` at every step of the block but its first;
  each masked position adds ``p_top1 ** boost_gamma`` at its top-1 token (of the step's
  logits); the step decides on the fused logits ``l + credit_alpha * log(1 + C)`` by dInfer's
  threshold rule: every candidate whose fused confidence (float32 softmax) is at least
  ``min(threshold, c_max - 1e-5)``, so the most confident always (and any within 1e-5 of it).

Confidence is the float32 softmax probability of the token, as the release computes it on
float32 logits (it computes hierarchical decoding's in the logits' dtype: bf16 on its models).
Both read only the masked rows of their block, so every cache serves them.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import gumbel_argmax
from .parallel import BlockLoop, block_candidates

#: dInfer's threshold rule accepts everything within this of the best confidence
CREDIT_TIE = 1e-5


def hierarchy_accepts(relative: Tensor, confidence: Tensor, threshold: float,
                      low_threshold: float) -> Tensor:
    """Which candidates (ascending block positions ``relative``, their ``confidence``) one step of
    hierarchical decoding unmasks, a bool mask (no host read)."""
    m = relative.numel()
    if m == 0:
        return torch.zeros(0, dtype=torch.bool, device=relative.device)
    starts = torch.ones_like(relative, dtype=torch.bool)
    starts[1:] = relative[1:] != relative[:-1] + 1  # a gap: the next segment begins
    segment = torch.cumsum(starts.to(torch.int64), 0) - 1
    best = torch.full((m,), float("-inf"), dtype=confidence.dtype, device=confidence.device)
    best = best.scatter_reduce(0, segment, confidence, reduce="amax", include_self=True)
    accepted = (confidence == best[segment]) & (confidence > low_threshold)
    accepted |= confidence > threshold
    accepted |= torch.arange(m, device=relative.device) == confidence.argmax()  # no host read
    return accepted


class DInferBlocks(BlockLoop):
    """The block loop with dInfer's block alignment (``block_alignment``): ``response``, blocks
    of ``block_length`` from the response's first position (``BlockIteratorFactory``'s default);
    ``absolute``, blocks at multiples of ``block_length`` in absolute positions, the first one
    starting in the prompt and cut at the response's start (``start_block_align=True``, as the
    release's benchmark runs), the last cut at the sequence's end. ``block_length`` null is one
    block under either alignment (on a block-causal backbone also where it does not divide the
    active block's positions: the rest of the block after a prompt ending inside it is decoded
    at once, as the release's ``BlockDiffusionLLM`` does)."""

    block_alignment = "absolute"

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        if self.block_alignment == "response":
            super().begin(prompt_len, gen_len, mask_id, generator, device)
        else:
            option = self.block_length_opt
            self.block_length_opt = None  # one block for BlockLoop (no tiling check); restored
            try:
                super().begin(prompt_len, gen_len, mask_id, generator, device)
            finally:
                self.block_length_opt = option
            length = self.block_length = option or gen_len
            if option is None:  # one block (null; on a block-causal backbone, the rest of the
                self.bounds = [0, gen_len]  # active block at once, as BlockDiffusionLLM decodes it)
            else:
                first = length - prompt_len % length  # the end of the block holding the prompt's end
                self.bounds = [0] + list(range(first % length or length, gen_len, length)) + [gen_len]
            self.num_blocks = len(self.bounds) - 1
            self.remaining = self.bounds[1]

    @property
    def block(self) -> tuple[int, int]:
        if self.block_alignment == "response":
            return super().block
        return (self.bounds[self.block_index], self.bounds[self.block_index + 1])

    @property
    def block_start(self) -> int:
        """Under ``absolute`` alignment the block's absolute start, its prompt rows included:
        the release's iterator hands the block from the multiple of ``block_length`` at or
        before the prompt's end (``utils.py`` ``BlockIterator._get_first_block_start`` and
        ``__next__``, lines 195-212; ``BlockDiffusionIterator``'s, lines 232-249), and its
        caches recompute from there (``generate_uniform.py`` line 300: the dual cache's
        ``model(block, ...)``; line 293: the prefix cache's ``x[:, block_loc.start:]``; lines
        619 and 637-639: the vicinity window ``block_start - prefix_look``). The decoder reads
        only the block's masked rows, so only the cache's rows change (their K/V, so the
        logits)."""
        row = self.prompt_len + int(self.block[0])
        length = self.block_length_opt  # (on a block-causal backbone the rest of the active
        if self.block_alignment == "response" or length is None:  # block is one block; its
            return row  # start is still the multiple of block_length before the prompt's end)
        return row - row % length

    def finish_step(self, response: Tensor, accepted: Tensor) -> None:
        index = self.block_index
        super().finish_step(response, accepted)
        if self.block_alignment != "response" and self.block_index != index and not self.done:
            lo, hi = self.block
            self.remaining = hi - lo


class HierarchySampler(DInferBlocks):
    def __init__(self, *, threshold: float, low_threshold: float, block_length: int | None,
                 block_alignment: str, temperature: float):
        self.threshold, self.low_threshold = threshold, low_threshold
        self.block_length_opt, self.temperature = block_length, temperature
        self.block_alignment = block_alignment

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        lo, hi = self.block
        masked, candidates, rows, tokens = block_candidates(
            response[lo:hi], logits[lo:hi], self.remaining, self.mask_id, self.temperature,
            self.generator)
        confidence = torch.softmax(rows.float(), dim=-1).gather(-1, tokens[:, None])[:, 0]
        accepted = hierarchy_accepts(candidates, confidence, self.threshold, self.low_threshold)
        candidates = candidates + lo
        response[candidates] = torch.where(accepted, tokens, response[candidates])
        self.block_step += 1
        self.finish_step(response, accepted.sum())


class CreditSampler(DInferBlocks):
    def __init__(self, *, threshold: float, credit_alpha: float, boost_gamma: float,
                 decay_beta: float, block_length: int | None, block_alignment: str,
                 temperature: float):
        self.threshold, self.alpha = threshold, credit_alpha
        self.gamma, self.beta = boost_gamma, decay_beta
        self.block_length_opt, self.temperature = block_length, temperature
        self.block_alignment = block_alignment

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        self.credit: Tensor | None = None  # [block_length, V], allocated with the vocabulary

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        lo, hi = self.block
        masked = response[lo:hi] == self.mask_id
        m = self.remaining
        candidates = torch.sort((~masked).to(torch.uint8), stable=True).indices[:m]
        rows = logits[lo:hi][candidates].float()
        if self.credit is None:
            self.credit = torch.zeros(self.block_length, rows.shape[-1], dtype=torch.float32,
                                      device=rows.device)
        if self.block_step == 0:
            self.credit.zero_()  # a new block's credit (the release keys it by the block)
        else:
            self.credit.mul_(self.beta)
        top_p, top = torch.softmax(rows, dim=-1).max(-1)
        self.credit[candidates, top] += top_p.pow(self.gamma)
        fused = rows + self.alpha * torch.log(self.credit[candidates] + 1)
        without_mask = fused.clone()
        without_mask[:, self.mask_id] = float("-inf")
        tokens = gumbel_argmax(without_mask, self.temperature, self.generator)
        confidence = torch.softmax(fused, dim=-1).gather(-1, tokens[:, None])[:, 0]
        if m:
            bar = torch.clamp(confidence.max() - CREDIT_TIE, max=self.threshold)
            accepted = confidence >= bar
        else:
            accepted = torch.zeros(0, dtype=torch.bool, device=rows.device)
        candidates = candidates + lo
        response[candidates] = torch.where(accepted, tokens, response[candidates])
        self.block_step += 1
        self.finish_step(response, accepted.sum())
