"""The toy's training objectives (dlmpipe/backbones/toy.py's loop): LLaDA's masked-diffusion
batches and loss (with the stale K/V and reused rows of ``stale_kv``/``stale_rows``, as caches
serve a model), SDAR's block-diffusion batches and loss, and one optimizer step."""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from ..tasks.toy import GENERATORS
from .model import Backbone

def _batch(rng: random.Random, tok, tasks: list[str], batch: int, gen_len: int, pad_id: int):
    """Left-padded prompts + answers padded with EOS to ``gen_len`` (LLaDA SFT layout)."""
    prompts, answers = [], []
    for _ in range(batch):
        ex = GENERATORS[rng.choice(tasks)](rng)
        p = tok(ex["prompt"], add_special_tokens=False)["input_ids"]
        a = tok(ex["answer"], add_special_tokens=False)["input_ids"][:gen_len]
        prompts.append(p)
        answers.append(a + [pad_id] * (gen_len - len(a)))
    plen = max(map(len, prompts))
    ids = torch.full((batch, plen + gen_len), pad_id, dtype=torch.long)
    key_mask = torch.zeros((batch, plen + gen_len), dtype=torch.bool)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        ids[i, plen - len(p):plen] = torch.tensor(p)
        ids[i, plen:] = torch.tensor(a)
        key_mask[i, plen - len(p):] = True
    return ids, key_mask, plen


def _block_batch(rng: random.Random, tok, tasks: list[str], batch: int, gen_len: int, pad_id: int):
    """Prompts + answers padded with EOS to ``gen_len``, each sequence from position 0 (blocks
    count from there, as at inference), right-padded to the longest; the key mask and the
    response positions."""
    rows = []
    for _ in range(batch):
        ex = GENERATORS[rng.choice(tasks)](rng)
        p = tok(ex["prompt"], add_special_tokens=False)["input_ids"]
        a = tok(ex["answer"], add_special_tokens=False)["input_ids"][:gen_len]
        rows.append((p, a + [pad_id] * (gen_len - len(a))))
    t = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((batch, t), pad_id, dtype=torch.long)
    key_mask = torch.zeros((batch, t), dtype=torch.bool)
    response = torch.zeros((batch, t), dtype=torch.bool)
    for i, (p, a) in enumerate(rows):
        ids[i, :len(p) + len(a)] = torch.tensor(p + a)
        key_mask[i, :len(p) + len(a)] = True
        response[i, len(p):len(p) + len(a)] = True
    return ids, key_mask, response


def _block_forward(model: Backbone, noisy: torch.Tensor, clean: torch.Tensor,
                   key_mask: torch.Tensor) -> torch.Tensor:
    """SDAR's training forward: ``[noisy || clean]`` at the same positions; a noisy row of block
    ``b`` attends to the noisy rows of block ``b`` and the clean rows of blocks before ``b``, a
    clean row to the clean rows of blocks up to its own (``model.attention_mask``). Returns the
    noisy rows' logits."""
    t = noisy.shape[1]
    pos = torch.arange(t)
    rope = model.rope(torch.cat([pos, pos]))
    blk = pos // model.cfg.block_size
    same = blk[:, None] == blk[None, :]
    prefix = model.attention_mask(pos, pos)  # the key's block not after the query's
    mask = torch.cat([torch.cat([same, prefix & ~same], 1),
                      torch.cat([torch.zeros_like(same), prefix], 1)], 0)
    attn_mask = mask[None, None] & torch.cat([key_mask, key_mask], 1)[:, None, None, :]
    h = model.embed(torch.cat([noisy, clean], 1))
    for i in range(model.cfg.n_layers):
        q, k, v = model.qkv(i, h, rope)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        b, hh, tt, hd = o.shape
        mid = h + model.attn_output(i, o.transpose(1, 2).reshape(b, tt, hh * hd))
        h = mid + model.ffn(i, mid)
    return model.logits(h[:, :t])


def _masked_forward(model: Backbone, ids: torch.Tensor, key_mask: torch.Tensor,
                    stale: tuple | None = None) -> torch.Tensor:
    """Training forward that ignores left padding (RoPE is relative, so this equals inference
    on the unpadded prompt). ``stale`` = (earlier ids, stale rows ``[B, T]``, per-layer reused
    rows ``[L, B, T]`` or None): the stale rows attend normally but are seen by every row through
    the K/V they had at the earlier, more masked ids, as a cache that has not refreshed them yet
    serves them (``stale_kv``); a reused row of layer l also keeps that layer's earlier output
    (attention + FFN) on top of its current input, as selective caches serve the rows they do
    not recompute (``stale_rows``)."""
    rope = model.rope(torch.arange(ids.shape[1]))
    attn_mask = key_mask[:, None, None, :]
    served = None
    if stale is not None:
        with torch.no_grad():
            _, earlier_kv, earlier_delta = _layers(model, stale[0], rope, attn_mask)
        served = (stale[1][:, None, :, None], earlier_kv, stale[2], earlier_delta)
    h, _, _ = _layers(model, ids, rope, attn_mask, served)
    return model.logits(h)


def _layers(model: Backbone, ids: torch.Tensor, rope, attn_mask: torch.Tensor, served=None):
    """Final hidden rows, every layer's K/V and, unless ``served``, its output (attention + FFN);
    ``served`` = (rows mask, per-layer K/V, per-layer reused rows or None, per-layer outputs):
    those rows' K/V are replaced by the given ones before attention, the reused rows' outputs by
    the given ones."""
    h = model.embed(ids)
    kvs, deltas = [], []
    for i in range(model.cfg.n_layers):
        q, k, v = model.qkv(i, h, rope)
        reused = None
        if served is not None:
            rows, (old_k, old_v) = served[0], served[1][i]
            if served[2] is not None:
                reused = served[2][i]
                rows = rows | reused[:, None, :, None]
            k, v = torch.where(rows, old_k, k), torch.where(rows, old_v, v)
        kvs.append((k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        b, hh, t, hd = o.shape
        a = model.attn_output(i, o.transpose(1, 2).reshape(b, t, hh * hd))
        mid = h + a
        out = mid + model.ffn(i, mid)
        if served is None:
            deltas.append(out - h)  # what a later pass reuses (the served pass needs none)
        elif reused is not None:
            out = torch.where(reused[:, :, None], h + served[3][i], out)
        h = out
    return h, kvs, deltas


def _stale_view(ids: torch.Tensor, noisy: torch.Tensor, key_mask: torch.Tensor, plen: int,
                mask_id: int, share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """An earlier decoding state of ``noisy`` and the rows whose K/V come from it, in a ``share``
    of the sequences (none in the others). Half of those see the prompt's rows as a cache filled
    before any token was decoded serves them (the response all masked: Archer without refresh,
    SPA-Cache, dLLM-Cache between prompt refreshes); the other half see random rows (each with a
    per-sequence probability) as they were at a random earlier step (each response token shown
    masked again with a per-sequence probability: dKV-Cache, Fast-dLLM's stale blocks)."""
    b, t = ids.shape
    prompt_case = torch.rand(b, 1) < 0.5
    again = torch.where(prompt_case, torch.ones(b, 1), torch.rand(b, 1))
    remask = (again > torch.rand(b, t)) & (noisy != mask_id) & key_mask
    remask[:, :plen] = False
    earlier = torch.where(remask, torch.full_like(ids, mask_id), noisy)
    in_prompt = (torch.arange(t) < plen)[None, :].expand(b, t)
    rows = torch.where(prompt_case, in_prompt, torch.rand(b, t) < torch.rand(b, 1))
    rows &= (torch.rand(b, 1) < share) & key_mask
    return earlier, rows


def _reused_rows(ids: torch.Tensor, noisy: torch.Tensor, key_mask: torch.Tensor, plen: int,
                 mask_id: int, share: float, n_layers: int, view: tuple[torch.Tensor, torch.Tensor]):
    """``view`` (from ``_stale_view``) with, in a ``share`` of the sequences, a selective cache's
    state between response refreshes: the earlier state shows each decoded response token
    masked again with a per-sequence probability (up to 0.4), the prompt's rows are stale, and at
    every layer >= 1 each response row whose token did not change since is reused (its K/V and
    output from the earlier state) with a per-sequence probability in [0.5, 1] (SPA-Cache,
    dLLM-Cache: a quarter or less of the rows recomputed per layer, the changed ones first)."""
    earlier, rows = view
    b, t = ids.shape
    case = (torch.rand(b, 1) < share)
    again = 0.4 * torch.rand(b, 1)
    remask = (again > torch.rand(b, t)) & (noisy != mask_id) & key_mask
    remask[:, :plen] = False
    earlier = torch.where(case, torch.where(remask, torch.full_like(ids, mask_id), noisy), earlier)
    in_prompt = (torch.arange(t) < plen)[None, :].expand(b, t)
    rows = torch.where(case, in_prompt & key_mask, rows)
    keep = 0.5 + 0.5 * torch.rand(b, 1)
    reused = (torch.rand(n_layers, b, t) < keep) & ~in_prompt & ~remask & case & key_mask
    reused[0] = False
    return earlier, rows, reused


def _block_loss(model: Backbone, ids: torch.Tensor, key_mask: torch.Tensor, response: torch.Tensor,
                mask_id: int) -> torch.Tensor:
    """The block-diffusion loss: every block's response positions masked with the block's own
    ratio t (in [0.05, 1]), cross-entropy / t over the masked ones, per response token."""
    b, t = ids.shape
    blocks = -(-t // model.cfg.block_size)
    ratio = 0.05 + 0.95 * torch.rand(b, blocks)
    ratio = ratio.repeat_interleave(model.cfg.block_size, dim=1)[:, :t]
    masked = (torch.rand(ids.shape) < ratio) & response
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    logits = _block_forward(model, noisy, ids, key_mask)
    ce = F.cross_entropy(logits[masked], ids[masked], reduction="none")
    return (ce / ratio[masked]).sum() / response.sum()


def _masked_loss(model, rng, tok, tasks, batch_size, gen_length, eos, mask_id, pretrain_fraction,
                 stale_kv, stale_rows, n_layers) -> torch.Tensor:
    """One batch's loss for the full-attention toy: LLaDA's masked-diffusion objective."""
    ids, key_mask, plen = _batch(rng, tok, list(tasks), batch_size, gen_length, eos)
    t = 0.05 + 0.95 * torch.rand(batch_size, 1)  # mask ratio; bounded away from 0 so 1/t stays tame
    # SFT-style rows mask only the response; pretraining-style rows mask the whole text,
    # which supervises every position and teaches the copy/lookup circuits much sooner
    masked = (torch.rand(ids.shape) < t) & key_mask
    sft = torch.rand(batch_size, 1) >= pretrain_fraction
    masked[:, :plen] &= ~sft
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    stale = None
    if stale_kv or stale_rows:
        stale = (*_stale_view(ids, noisy, key_mask, plen, mask_id, stale_kv), None)
    if stale_rows:
        stale = _reused_rows(ids, noisy, key_mask, plen, mask_id, stale_rows, n_layers, stale[:2])
    logits = _masked_forward(model, noisy, key_mask, stale)
    ce = F.cross_entropy(logits[masked], ids[masked], reduction="none")
    return (ce / t.expand_as(ids)[masked]).sum() / key_mask.sum()


def _step(model: Backbone, opt, sched, loss: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
