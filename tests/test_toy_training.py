"""The toy trainer's views of stale states (dlmpipe/backbones/toy.py): what ``stale_kv`` and
``stale_rows`` show the model in training is what the caches serve it at decoding time."""
from __future__ import annotations

import random

import pytest
import torch

from dlmpipe.backbones.model import Backbone, BackboneConfig
from dlmpipe.backbones.toy import train_toy
from dlmpipe.backbones.toy_format import build_tokenizer
from dlmpipe.backbones.toy_objectives import (_batch, _layers, _masked_forward, _reused_rows,
                                              _stale_view)

MASK = 2


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("tok"))
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    mask_id = tok.convert_tokens_to_ids("<|mdm_mask|>")
    torch.manual_seed(0)
    ids, key_mask, plen = _batch(random.Random(0), tok, ["toy_code", "toy_arith"], 64, 32, eos)
    masked = (torch.rand(ids.shape) < 0.5) & key_mask
    masked[:, :plen] = False
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    return ids, noisy, key_mask, plen, mask_id


def test_reused_rows_are_what_a_selective_cache_leaves_unrecomputed(batch):
    ids, noisy, key_mask, plen, mask_id = batch
    torch.manual_seed(1)
    view = _stale_view(ids, noisy, key_mask, plen, mask_id, 0.5)
    earlier, rows, reused = _reused_rows(ids, noisy, key_mask, plen, mask_id, 0.5, 4, view)
    case = reused.any(0).any(1)
    assert 0 < case.sum() < ids.shape[0]  # a share of the sequences, not all, not none
    changed = earlier != noisy
    # the earlier state only masks again tokens the response has decoded; the prompt is as now
    assert (earlier[changed] == mask_id).all() and not changed[:, :plen].any()
    assert (noisy[changed] != mask_id).all()
    assert not reused[0].any()                      # layer 0 is always recomputed
    assert not reused[:, :, :plen].any()            # prompt rows are stale through K/V only
    assert not (reused & changed[None]).any()       # a row whose token changed is recomputed
    assert not (reused & ~key_mask[None]).any()     # no padding
    # in those sequences the prompt's K/V are stale (never refreshed between response refreshes)
    in_prompt = (torch.arange(ids.shape[1]) < plen)[None, :] & key_mask
    assert (rows[case] == in_prompt[case]).all()
    # per layer, half to all of the unchanged response rows are reused (SPA/dLLM budgets)
    response = key_mask[case] & ~changed[case]
    response[:, :plen] = False
    share = reused[1:, case].sum((0, 2)) / (3 * response.sum(1))
    assert share.min() > 0.3 and share.max() <= 1.0
    # outside the share the stale_kv view is unchanged
    other = ~case
    assert (earlier[other] == view[0][other]).all() and (rows[other] == view[1][other]).all()


def test_a_reused_row_keeps_its_earlier_output_on_its_current_input():
    torch.manual_seed(0)
    cfg = BackboneConfig(family="llada", d_model=32, n_layers=2, n_heads=2, n_kv_heads=2,
                         mlp_hidden=64, vocab_size=40, rope_theta=10000.0, norm_eps=1e-5,
                         qkv_bias=False, mask_id=MASK, stop_ids=[1], pad_id=1)
    model = Backbone(cfg).eval()
    t = 10
    ids = torch.randint(3, 40, (2, t))
    earlier = ids.clone()
    earlier[:, 6:] = MASK
    rope = model.rope(torch.arange(t))
    attn = torch.ones(2, 1, 1, t, dtype=torch.bool)
    with torch.no_grad():
        fresh, fresh_kv, fresh_delta = _layers(model, ids, rope, attn)
        _, old_kv, old_delta = _layers(model, earlier, rope, attn)
        none = torch.zeros(2, 1, t, 1, dtype=torch.bool)
        reused = torch.zeros(2, 2, t, dtype=torch.bool)
        # nothing served stale: bit for bit the plain forward
        same, _, _ = _layers(model, ids, rope, attn, (none, old_kv, reused, old_delta))
        assert torch.equal(same, fresh)
        reused[1, 0, 4] = True  # row 4 of sequence 0 reused at the last layer
        out, kv, _ = _layers(model, ids, rope, attn, (none, old_kv, reused, old_delta))
    layer_input = fresh - fresh_delta[1]
    torch.testing.assert_close(out[0, 4], layer_input[0, 4] + old_delta[1][0, 4])
    assert not torch.allclose(out[0, 4], fresh[0, 4], atol=1e-4)
    # and every row reads its stale K/V at that layer; layer 0 and sequence 1 are untouched
    assert torch.equal(kv[1][0][0, :, 4], old_kv[1][0][0, :, 4])
    assert torch.equal(kv[0][0], fresh_kv[0][0]) and torch.equal(out[1], fresh[1])


def test_stale_rows_trains_and_is_recorded_only_when_used(tmp_path):
    small = dict(steps=3, batch_size=4, d_model=16, n_layers=2, n_heads=2, mlp_hidden=32,
                 gen_length=8, threads=1, log=lambda *a: None)
    plain = train_toy(tmp_path / "plain", **small)
    stale = train_toy(tmp_path / "stale", stale_kv=0.5, stale_rows=0.5, **small)
    assert "stale_rows" not in plain["options"] and "stale_kv" not in plain["options"]
    assert stale["options"]["stale_rows"] == 0.5 and stale["options"]["stale_kv"] == 0.5
    assert stale["sha256"] != plain["sha256"]
    assert torch.isfinite(torch.tensor(stale["final_loss"]))


def test_the_forward_with_stale_rows_keeps_gradients_to_the_current_state(batch):
    ids, noisy, key_mask, plen, mask_id = batch
    cfg = BackboneConfig(family="llada", d_model=32, n_layers=3, n_heads=2, n_kv_heads=2,
                         mlp_hidden=64, vocab_size=128, rope_theta=10000.0, norm_eps=1e-5,
                         qkv_bias=False, mask_id=mask_id, stop_ids=[0], pad_id=0)
    model = Backbone(cfg)
    torch.manual_seed(2)
    view = _stale_view(ids, noisy, key_mask, plen, mask_id, 0.0)
    stale = _reused_rows(ids, noisy, key_mask, plen, mask_id, 1.0, 3, view)
    logits = _masked_forward(model, noisy, key_mask, stale)
    logits[noisy == mask_id].logsumexp(-1).sum().backward()
    # every layer's weights get gradient through the rows computed now (earlier states: no grad)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters()
               if p.dim() == 2)
