"""PC-Sampler, position-aware calibration of decoding bias (Huang et al.; docs/METHODS.md §1.7).

On LLaDA's blocks and schedule, each masked position of the block is scored

    score(i) = exp(-lambd * (i - block start)) * min(p(i) * -log(f(x0_i) + 1e-9), alpha)

where ``x0_i`` is the model's token (LLaDA's, Gumbel noise at temperature > 0), ``p(i)`` its
softmax probability and ``f`` the token-frequency prior of a reference corpus: the position
weight steers the trajectory towards the left, the calibration demotes tokens that are merely
frequent (punctuation, whitespace, filler). Without a reference corpus (``baseline_name: null``)
there is no calibration: ``min(p(i), alpha)``. At ``lambd: 0`` without a corpus the sampler is
LLaDA confidence.

The prior is data (the released format, ``load_reference_corpus``): a JSON object with the
corpus size ``num_token`` and per-token counts ``p_baseline_dict`` (``{"token id": count}``);
tokens not listed get ``1 / num_token``. ``reference_corpus`` builds one from token ids.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable

import torch
from torch import Tensor

from .base import to_device
from .llada_confidence import ScoredSchedule, token_confidence

#: inside the released calibration's logarithm
EPSILON = 1e-9
#: the counts' key in the released corpora; the released counting script writes the other
COUNT_KEYS = ("p_baseline_dict", "token_frequency_dict")


def reference_corpus(token_ids: Iterable[Iterable[int]]) -> dict:
    """A reference corpus in the released format from tokenized documents: ``num_token`` (the
    number of tokens) and ``p_baseline_dict`` (each token's count, keyed by its id as text)."""
    counts: Counter[int] = Counter()
    for document in token_ids:
        counts.update(int(t) for t in document)
    return {"num_token": sum(counts.values()),
            "p_baseline_dict": {str(t): c for t, c in sorted(counts.items())}}


def count_jsonl(paths: Iterable[str | Path], keys: list[str], encode) -> dict:
    """A reference corpus from JSON-lines files, as the released counting script reads them:
    per line, the string values of ``keys`` (in that order, each followed by a space) are encoded
    by ``encode`` (the backbone tokenizer's, without special tokens); lines with none of them
    count nothing. Returns the released format (``reference_corpus``)."""
    def documents():
        for path in paths:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{number}: not a JSON line ({e})") from None
                    text = "".join(f"{obj[k]} " for k in keys
                                   if isinstance(obj, dict) and isinstance(obj.get(k), str))
                    if text:
                        yield encode(text)
    return reference_corpus(documents())


def load_reference_corpus(path: str | Path) -> tuple[int, dict[int, int]]:
    """``(num_token, {token id: count})`` from a reference-corpus JSON file (the released
    ``data/baseline/reference_corpus*.json`` format; the counts may also be under
    ``token_frequency_dict``, the key the released counting script writes)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pc_sampler: reference corpus {str(path.absolute())!r} not found "
                                f"(baseline_name; docs/METHODS.md §1.7)")
    data = json.loads(path.read_text(encoding="utf-8"))
    key = next((k for k in COUNT_KEYS if isinstance(data, dict) and k in data), None)
    if key is None or not isinstance(data.get("num_token"), int) or data["num_token"] <= 0:
        raise ValueError(f"pc_sampler: {path} is not a reference corpus: expected a JSON object "
                         f"with a positive integer num_token and counts under {COUNT_KEYS[0]!r}")
    counts = {int(t): int(c) for t, c in data[key].items()}
    if any(t < 0 or c < 0 for t, c in counts.items()):
        raise ValueError(f"pc_sampler: {path}: negative token id or count")
    return data["num_token"], counts


def frequency_prior(num_token: int, counts: dict[int, int], vocab_size: int,
                    device: torch.device | str = "cpu") -> Tensor:
    """Each token's corpus frequency ``count / num_token`` (``1 / num_token`` when it is not
    listed), float64 ``[vocab_size]``."""
    beyond = [t for t in counts if t >= vocab_size]
    if beyond:
        raise ValueError(f"pc_sampler: the reference corpus counts token ids up to {max(beyond)}, "
                         f"beyond the model's vocabulary of {vocab_size} (a corpus of another "
                         f"tokenizer?)")
    prior = torch.full((vocab_size,), 1 / num_token, dtype=torch.float64)
    if counts:
        ids = torch.tensor(list(counts), dtype=torch.long)
        prior[ids] = torch.tensor([c / num_token for c in counts.values()], dtype=torch.float64)
    return prior.to(device)


class PCSampler(ScoredSchedule):
    def __init__(self, *, lambd: float, alpha: float, baseline_name: str | None, **schedule):
        super().__init__(**schedule)
        self.lambd, self.alpha, self.baseline_name = lambd, alpha, baseline_name
        self.weights: Tensor | None = None      # [G] position weights
        self.weights_key: tuple | None = None
        # with a corpus: -log(f + eps) of the token ids up to one past the largest one counted
        # (built here, on the host, so that no step copies it); every larger id is not listed
        # either and reads the last entry, the background's
        self.table: Tensor | None = None
        self.calibration: Tensor | None = None  # the table on the model's device
        if baseline_name is not None:
            num_token, counts = load_reference_corpus(baseline_name)
            self.max_id = max(counts, default=-1)
            prior = frequency_prior(num_token, counts, self.max_id + 2)
            self.table = -torch.log(prior + EPSILON)
            self.vocab_checked: int | None = None

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        key = (gen_len, self.block_length, self.device)
        if self.weights is None or self.weights_key != key:
            # the released code weights positions from the block's start (the same ranking as
            # from the response's start, without underflow in late blocks; §1.7)
            offsets = torch.arange(gen_len, dtype=torch.float64) % self.block_length
            self.weights = to_device(torch.exp(-self.lambd * offsets), self.device)
            self.weights_key = key
            self.state_version += 1  # a captured scoring step must see the new weights
        if self.table is not None and (self.calibration is None
                                       or self.calibration.device != self.weights.device):
            self.calibration = to_device(self.table, self.device)
            self.state_version += 1

    def step(self, x: Tensor, logits: Tensor) -> None:
        vocab = logits.shape[-1]  # host metadata: no read
        if self.table is not None and self.vocab_checked != vocab:
            if self.max_id >= vocab:
                raise ValueError(f"pc_sampler: the reference corpus counts token ids up to "
                                 f"{self.max_id}, beyond the model's vocabulary of {vocab} (a "
                                 f"corpus of another tokenizer?)")
            self.vocab_checked = vocab
        super().step(x, logits)

    def _score(self, logits: Tensor, response: Tensor, *noise: Tensor) -> tuple[Tensor, Tensor]:
        """Token and PC score per position (float64), -inf at visible positions."""
        x0 = self._tokens(logits, noise)
        salience = token_confidence(logits, x0, "probability", self.temperature)
        if self.calibration is not None:
            last = self.calibration.shape[0] - 1
            salience = salience * self.calibration[x0.clamp_max(last)]
        score = self.weights * torch.clamp_max(salience, self.alpha)
        return x0, score.masked_fill(response != self.mask_id, float("-inf"))
