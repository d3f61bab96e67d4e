"""LLaDA low-confidence remasking (docs/METHODS.md §1.1): the Archer main table's speed reference."""
from __future__ import annotations

import torch
from torch import Tensor

from ..graphs import StepRunner
from .base import Sampler, gumbel_noise, perturbed_argmax


def transfer_schedule(n_masked: int, steps: int) -> list[int]:
    """Uniform split of a block's masks over its steps, the remainder to the first steps."""
    base, rem = divmod(n_masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


class LLaDAConfidence(Sampler):
    def __init__(self, *, block_length: int | None, steps: int | None, temperature: float):
        self.block_length_opt, self.steps_opt, self.temperature = block_length, steps, temperature
        self.scoring = StepRunner(self._score)

    def use_compile(self, mode: str) -> None:
        super().use_compile(mode)
        self.scoring = StepRunner(self._score, mode)

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        self.block_length = self.block_length_opt or gen_len
        total_steps = self.steps_opt or gen_len
        if gen_len % self.block_length:
            raise ValueError(f"gen_length {gen_len} is not a multiple of block_length {self.block_length}")
        self.num_blocks = gen_len // self.block_length
        if total_steps % self.num_blocks:
            raise ValueError(f"steps {total_steps} is not a multiple of the {self.num_blocks} blocks")
        self.steps_per_block = total_steps // self.num_blocks
        self.block_index, self.block_step = 0, 0
        self.schedule: list[int] = []

    @property
    def block(self) -> tuple[int, int]:
        lo = self.block_index * self.block_length
        return (lo, lo + self.block_length)

    def step(self, x: Tensor, logits: Tensor) -> None:
        P = self.prompt_len
        response = x[P:]
        lo, hi = self.block
        if self.block_step == 0:
            # LLaDA splits the masks the block holds at its start over its steps. A step writes
            # only inside its own block, so a block is untouched, all masks, until its first
            # step: the count is block_length, known without reading the sequence back.
            self.schedule = transfer_schedule(self.block_length, self.steps_per_block)
        noise = (gumbel_noise(logits.shape, self.generator, logits.device),) if self.temperature else ()
        x0, confidence = self.scoring(logits, response, *noise, state_key=self.mask_id)
        confidence[:lo] = float("-inf")
        confidence[hi:] = float("-inf")
        k = self.schedule[self.block_step]
        if k > 0:
            chosen = torch.topk(confidence, k).indices
            response[chosen] = x0[chosen]
        self._end_step(response)

    def _score(self, logits: Tensor, response: Tensor, *noise: Tensor) -> tuple[Tensor, Tensor]:
        """Each position's token and its confidence (float64 softmax probability), -inf at
        visible positions. Fixed shapes, no host reads, the same for every block: a capturable
        step (dlmpipe/graphs.py)."""
        x0 = perturbed_argmax(logits, self.temperature, noise[0]) if noise else logits.argmax(-1)
        p = torch.softmax(logits.to(torch.float64), dim=-1)
        confidence = torch.gather(p, -1, x0[:, None])[:, 0]
        return x0, confidence.masked_fill(response != self.mask_id, float("-inf"))

    def _end_step(self, response: Tensor) -> None:
        """Count the step, track revisions, and move to the next block after its last step."""
        self.steps += 1
        self._track(response)
        self.block_step += 1
        if self.block_step == self.steps_per_block:
            self.block_index, self.block_step = self.block_index + 1, 0
            self.done = self.block_index == self.num_blocks
