"""Random fixed-order decoding (the order dKV-Cache-Greedy decodes in; METHODS.md §2.6).

Blocks left to right with LLaDA's schedule (``steps`` total, split evenly over the blocks; per
block the masks split uniformly over its steps, the remainder to the first steps). At a block's
start a random order of its positions is drawn from the sample's generator and fixed; each step
decodes the next ``k`` positions of that order with the model's token (argmax, Gumbel noise at
temperature > 0, never the MASK id). Since the positions do not depend on the logits, the
sampler announces them ahead of the forward (``due_positions``), so a cache can compute only
their rows.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Sampler, gumbel_argmax
from .llada_confidence import transfer_schedule


class RandomOrder(Sampler):
    name = "random_order"

    def __init__(self, block_length: int | None = None, steps: int | None = None,
                 temperature: float = 0.0):
        self.block_length_opt, self.steps_opt, self.temperature = block_length, steps, temperature

    def begin(self, prompt_len, gen_len, mask_id, generator=None) -> None:
        super().begin(prompt_len, gen_len, mask_id, generator)
        self.block_length = self.block_length_opt or gen_len
        total_steps = self.steps_opt or gen_len
        if gen_len % self.block_length:
            raise ValueError(f"gen_length {gen_len} is not a multiple of block_length {self.block_length}")
        self.num_blocks = gen_len // self.block_length
        if total_steps % self.num_blocks:
            raise ValueError(f"steps {total_steps} is not a multiple of the {self.num_blocks} blocks")
        self.steps_per_block = total_steps // self.num_blocks
        self.block_index, self.block_step = 0, 0
        self.order_block = -1          # block whose order is drawn
        self.order: Tensor | None = None
        self.schedule: list[int] = []
        self.decoded_in_block = 0

    @property
    def block(self) -> tuple[int, int]:
        lo = self.block_index * self.block_length
        return (lo, lo + self.block_length)

    def _fix_order(self) -> None:
        """Draw the current block's decoding order once, at its start."""
        if self.order_block == self.block_index:
            return
        lo, _ = self.block
        perm = torch.randperm(self.block_length, generator=self.generator)
        self.order = perm + lo
        self.schedule = transfer_schedule(self.block_length, self.steps_per_block)
        self.order_block, self.decoded_in_block = self.block_index, 0

    def due_positions(self) -> Tensor:
        self._fix_order()
        k = self.schedule[self.block_step]
        return self.order[self.decoded_in_block:self.decoded_in_block + k]

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        due = self.due_positions().to(response.device)
        if due.numel():
            rows = logits[due].clone()
            rows[:, self.mask_id] = float("-inf")
            response[due] = gumbel_argmax(rows, self.temperature, self.generator)
        self.decoded_in_block += due.numel()
        self.steps += 1
        self._track(response)
        self.block_step += 1
        if self.block_step == self.steps_per_block:
            self.block_index, self.block_step = self.block_index + 1, 0
            self.done = self.block_index == self.num_blocks
