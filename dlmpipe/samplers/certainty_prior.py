"""Certainty-prior decoding (d2Cache, Jiang et al. 2025; docs/METHODS.md §1.6).

A masked position is worth decoding when the model is confident of it and it sits next to
positions already decoded: its score is its confidence (§1.1) times the certainty density of
the decoded positions around it, a Gaussian of width ``sigma``. The best-scoring masked positions
of the block are unmasked on LLaDA's schedule. Small sigma decodes almost left to right, large
sigma like plain confidence; at ``sigma: inf`` the density is the same at every position, and the
sampler is LLaDA confidence.

``CertaintyPrior`` / ``certainty_density`` compute the density; the d2Cache cache selects the
masked rows it recomputes with the same prior.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .llada_confidence import LLaDAConfidence


class CertaintyPrior:
    """The certainty density over a response of ``gen_len`` positions (docs/METHODS.md §1.6),
    precomputed once for ``sigma`` and reused at every step.

    ``prior(decoded)``: ``decoded [..., G]`` (bool: the position holds a token) -> density
    ``[..., G]`` (float64 in [0, 1]), per position ``i``

        d(i) = sum_j m(j) exp(-(i - j)^2 / (2 sigma^2)) / Z,

    over the extended positions ``j`` in ``[-G, 2G)``: ``m(j) = 1`` left of the response (the
    prompt side counts as decoded), ``decoded[j]`` inside it, and ``decoded[G - 1]`` right of it
    (the right side counts as decoded only once the last position is); ``Z`` is the kernel's sum
    over distances ``[-3G, 3G)``. This is the released ``certainty_density`` (which convolves by
    FFT in float32) computed directly in float64. Fixed shapes, no host reads: capturable.
    ``sigma = inf`` gives every position the same density (exactly: the kernel is 1 and the sums
    are whole numbers until the one division)."""

    def __init__(self, gen_len: int, sigma: float | str, device: torch.device | str = "cpu"):
        sigma = float(sigma)
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0 (got {sigma})")
        self.gen_len, self.sigma = gen_len, sigma
        G = gen_len
        d = torch.arange(-3 * G, 3 * G, dtype=torch.float64)
        kernel = torch.exp(-(d * d) / (2 * sigma * sigma))       # kernel[3G + t] = k(t)
        self.norm = float(kernel.sum())
        i = torch.arange(G)
        j = torch.arange(-G, 2 * G)
        weights = kernel[(i[None, :] - j[:, None]) + 3 * G]       # [3G, G]: k(i - j)
        # rows: the left side's total, each response position, the right side's total
        self.weights = torch.cat([weights[:G].sum(0, keepdim=True), weights[G:2 * G],
                                  weights[2 * G:].sum(0, keepdim=True)]).to(device)

    def __call__(self, decoded: Tensor) -> Tensor:
        m = decoded.to(torch.float64)
        extended = torch.cat([torch.ones_like(m[..., :1]), m, m[..., -1:]], dim=-1)
        return (extended @ self.weights) / self.norm


def certainty_density(decoded: Tensor, sigma: float | str) -> Tensor:
    """The certainty density of ``decoded [..., G]`` (bool, True where a position holds a token)
    for ``sigma``: ``CertaintyPrior(G, sigma)(decoded)``, float64 ``[..., G]``. Build a
    ``CertaintyPrior`` once instead when the same length is scored at every step."""
    return CertaintyPrior(decoded.shape[-1], sigma, decoded.device)(decoded)


class CertaintyPriorSampler(LLaDAConfidence):
    """LLaDA's schedule; score = confidence x certainty density of the decoded positions."""

    def __init__(self, *, sigma: float | str, **options):
        super().__init__(**options)
        self.sigma = float(sigma)
        if math.isnan(self.sigma) or self.sigma <= 0:
            raise ValueError(f"sigma must be > 0 or inf (got {sigma})")
        self.prior: CertaintyPrior | None = None  # kept across samples of the same length
        self.prior_key: tuple | None = None

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        if self.prior is None or self.prior_key != (gen_len, self.device):
            self.prior = CertaintyPrior(gen_len, self.sigma, self.device)
            self.prior_key = (gen_len, self.device)
            self.state_version += 1  # a captured scoring step must see the new weights

    def _score(self, logits: Tensor, response: Tensor, *noise: Tensor) -> tuple[Tensor, Tensor]:
        """Token and confidence as LLaDA confidence; the masked positions' confidence times the
        density (-inf at visible positions, where the product could be NaN)."""
        x0, confidence = super()._score(logits, response, *noise)
        masked = response == self.mask_id
        return x0, torch.where(masked, confidence * self.prior(~masked), float("-inf"))
