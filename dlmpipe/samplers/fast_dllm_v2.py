"""Fast-dLLM v2's block loop (NVlabs/Fast-dLLM ``v2/generation_functions.py``, ``batch_sample``,
as its ``v2/eval.py`` calls it; docs/METHODS.md §1.12), the sampler of one active block of a
block-causal backbone.

The blocks themselves (prompt's whole blocks prefilled, a finished block's K/V computed once, a
block's first token the previous block's greedy next token) are the backbone's
(dlmpipe/blockwise.py). Inside the active block, sub-blocks of ``sub_block_length`` positions
counted from the block's start (so a sub-block may hold prompt rows, which count as decoded)
are decoded left to right, each stepped until it has no masks. A step draws a token per
position of the sub-block (temperature 0, the release's default: the most probable, its
confidence the plain softmax, top_p unused as in the release's ``sample_with_top_p``; else drawn
from the top-p filtered ``softmax(logits / T)``), takes its probability as confidence, and unmasks
every masked position whose confidence exceeds ``threshold`` and always the most confident
masked one. The sampler reads the rows of its sub-block (``block``); the block + sub-block
cache (engine/fast_dllm.py, ``fast_dllm_v2``) serves them.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Sampler
from .sdar import draw, filtered_probs


class FastDLLMv2Sampler(Sampler):
    def __init__(self, *, threshold: float, sub_block_length: int, temperature: float, top_p: float):
        self.threshold, self.sub_block_length = threshold, sub_block_length
        self.temperature, self.top_p = temperature, top_p

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        # sub-blocks tile the active block from its first row; those of prompt rows only are done
        self.sub_block = prompt_len // self.sub_block_length
        self._skip_finished_sub_blocks(None)

    @property
    def block(self) -> tuple[int, int]:
        s, p = self.sub_block_length, self.prompt_len
        return (max(self.sub_block * s - p, 0), min((self.sub_block + 1) * s - p, self.gen_len))

    @property
    def block_start(self) -> int:
        """The sub-block's first row, a prompt row where the sub-block begins in the prompt."""
        return self.sub_block * self.sub_block_length

    def _skip_finished_sub_blocks(self, response: Tensor | None) -> None:
        while self.sub_block * self.sub_block_length < self.prompt_len + self.gen_len:
            lo, hi = self.block
            if response is None or bool((response[lo:hi] == self.mask_id).any()):
                return
            self.sub_block += 1
        self.done = True

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        lo, hi = self.block
        span = response[lo:hi]
        masked = span == self.mask_id
        # the release's sample_with_top_p cuts by top_p only at temperature > 0
        top_p = self.top_p if self.temperature > 0 else 1.0
        probs = filtered_probs(logits[lo:hi], self.temperature, None, top_p)
        tokens = draw(probs, self.temperature, self.generator, self.mask_id)
        confidence = probs.gather(-1, tokens[:, None])[:, 0].masked_fill(~masked, float("-inf"))
        self.last_confidence = (lo, confidence)
        unmask = confidence > self.threshold
        unmask[confidence.argmax()] = True
        unmask &= masked
        span[unmask] = tokens[unmask]
        self.steps += 1
        self._track(response)
        self._skip_finished_sub_blocks(response)
