"""LLaDA low-confidence remasking (docs/METHODS.md §1.1): the Archer main table's speed reference.

Three layers, so that the samplers built on LLaDA's schedule share it without sharing
parameters they do not have:

- ``LLaDASchedule``: the blocks and the uniform per-block unmasking schedule (random order
  decodes on it too, §1.4);
- ``ScoredSchedule``: each step scores every response position in one fixed-shape, capturable
  step (dlmpipe/graphs.py) and unmasks the ``k`` best masked positions of the block;
- ``LLaDAConfidence``: the score is a confidence of the model's token (``confidence``:
  LLaDA's probability by default, or Dream's maskgit_plus / topk_margin / entropy).
Certainty-prior decoding (§1.6) and PC-Sampler (§1.7) are other scores on the same schedule.
"""
from __future__ import annotations

from abc import abstractmethod

import torch
from torch import Tensor

from ..graphs import StepRunner
from .base import Sampler, gumbel_noise, perturbed_argmax

#: confidence kinds (docs/METHODS.md §1.1); ``probability`` is LLaDA's released rule
CONFIDENCES = ("probability", "maskgit_plus", "topk_margin", "entropy")


def transfer_schedule(n_masked: int, steps: int) -> list[int]:
    """Uniform split of a block's masks over its steps, the remainder to the first steps."""
    base, rem = divmod(n_masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def token_confidence(logits: Tensor, tokens: Tensor, kind: str, temperature: float) -> Tensor:
    """Per-row confidence of ``kind`` in float64 (higher: unmasked earlier; §1.1).

    ``probability``: LLaDA's, the untempered softmax probability of the token. The others are
    Dream's ``alg`` on the tempered distribution ``softmax(logits / T)`` (``T = 0``: plain
    softmax): ``maskgit_plus`` the token's probability, ``topk_margin`` top-1 minus top-2,
    ``entropy`` ``sum p log(p + 1e-10)`` (the negative entropy). At temperature 0
    ``maskgit_plus`` is ``probability``."""
    logits = logits.to(torch.float64)
    if kind == "probability":
        return torch.gather(torch.softmax(logits, dim=-1), -1, tokens[..., None])[..., 0]
    probs = torch.softmax(logits / temperature if temperature > 0 else logits, dim=-1)
    if kind == "maskgit_plus":
        return torch.gather(probs, -1, tokens[..., None])[..., 0]
    if kind == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if kind == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    raise ValueError(f"unknown confidence {kind!r}; use one of {', '.join(CONFIDENCES)}")


class LLaDASchedule(Sampler):
    """LLaDA's blocks and per-block schedule; subclasses decide which positions a step takes."""

    def __init__(self, *, block_length: int | None, steps: int | None, temperature: float):
        self.block_length_opt, self.steps_opt, self.temperature = block_length, steps, temperature

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

    def _end_step(self, response: Tensor) -> None:
        """Count the step, track revisions, and move to the next block after its last step."""
        self.steps += 1
        self._track(response)
        self.block_step += 1
        if self.block_step == self.steps_per_block:
            self.block_index, self.block_step = self.block_index + 1, 0
            self.done = self.block_index == self.num_blocks


class ScoredSchedule(LLaDASchedule):
    """Each step: a token and a score per response position (``_score``, a capturable step),
    then the ``k`` best-scoring masked positions of the block take their tokens."""

    def __init__(self, **schedule):
        super().__init__(**schedule)
        self.scoring = StepRunner(self._score)
        self.state_version = 0  # bumped whenever state ``_score`` reads is reallocated

    def use_compile(self, mode: str) -> None:
        super().use_compile(mode)
        self.scoring = StepRunner(self._score, mode)

    @abstractmethod
    def _score(self, logits: Tensor, response: Tensor, *noise: Tensor) -> tuple[Tensor, Tensor]:
        """Each position's token ``[G]`` and score ``[G]`` (-inf at visible positions): fixed
        shapes, no host reads, the same for every block (dlmpipe/graphs.py)."""

    def _tokens(self, logits: Tensor, noise: tuple[Tensor, ...]) -> Tensor:
        """LLaDA's token: argmax, or the float64 Gumbel-perturbed argmax at temperature > 0."""
        return perturbed_argmax(logits, self.temperature, noise[0]) if noise else logits.argmax(-1)

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
        x0, confidence = self.scoring(logits, response, *noise,
                                      state_key=(self.mask_id, self.state_version))
        confidence[:lo] = float("-inf")
        confidence[hi:] = float("-inf")
        k = self.schedule[self.block_step]
        if k > 0:
            chosen = torch.topk(confidence, k).indices
            response[chosen] = x0[chosen]
        self._end_step(response)


class LLaDAConfidence(ScoredSchedule):
    def __init__(self, *, confidence: str, **schedule):
        if confidence not in CONFIDENCES:
            raise ValueError(f"unknown confidence {confidence!r}; use one of {', '.join(CONFIDENCES)}")
        super().__init__(**schedule)
        self.confidence = confidence

    def _score(self, logits: Tensor, response: Tensor, *noise: Tensor) -> tuple[Tensor, Tensor]:
        """Each position's token and its confidence (float64, ``token_confidence``), -inf at
        visible positions."""
        x0 = self._tokens(logits, noise)
        confidence = token_confidence(logits, x0, self.confidence, self.temperature)
        return x0, confidence.masked_fill(response != self.mask_id, float("-inf"))
