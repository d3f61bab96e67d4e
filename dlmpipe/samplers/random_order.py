"""Random fixed-order decoding (the order dKV-Cache-Greedy decodes in; docs/METHODS.md §2.6).

Blocks left to right with LLaDA's schedule (``steps`` total, split evenly over the blocks; per
block the masks split uniformly over its steps, the remainder to the first steps). At a block's
start a random order of its positions is drawn and fixed: from the sample's generator, or with
``order_seed`` from a generator seeded with it at the sample's start (block b gets its b-th
permutation, so every sample decodes in the same block orders; docs/METHODS.md §1.4); each step
decodes the next ``k`` positions of that order with the model's token (argmax, Gumbel noise at
temperature > 0, never the MASK id). Since the positions do not depend on the logits, the
sampler announces them ahead of the forward (``due_positions``), so a cache can compute only
their rows.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import gumbel_argmax, to_device
from .llada_confidence import LLaDASchedule, transfer_schedule


class RandomOrder(LLaDASchedule):
    """LLaDA's blocks and per-step schedule; positions in a random order fixed per block."""

    def __init__(self, *, order_seed: int | None, **schedule):
        super().__init__(**schedule)
        self.order_seed = order_seed

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        self.order_generator = (generator if self.order_seed is None
                                else torch.Generator().manual_seed(self.order_seed))
        self.order_block = -1          # block whose order is drawn
        self.order: Tensor | None = None
        self.decoded_in_block = 0

    def _fix_order(self) -> None:
        """Draw the current block's decoding order once, at its start."""
        if self.order_block == self.block_index:
            return
        lo, _ = self.block
        perm = torch.randperm(self.block_length, generator=self.order_generator)  # CPU: every device alike
        self.order = to_device(perm + lo, self.device)
        self.schedule = transfer_schedule(self.block_length, self.steps_per_block)
        self.order_block, self.decoded_in_block = self.block_index, 0

    def due_positions(self) -> Tensor:
        self._fix_order()
        k = self.schedule[self.block_step]
        return self.order[self.decoded_in_block:self.decoded_in_block + k]

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        due = self.due_positions()
        if due.numel():
            rows = logits[due].clone()
            rows[:, self.mask_id] = float("-inf")
            response[due] = gumbel_argmax(rows, self.temperature, self.generator)
        self.decoded_in_block += due.numel()
        self._end_step(response)
