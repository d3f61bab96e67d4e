"""Any dlmpipe backbone + method as an lm-eval model (``--model dlmpipe``; docs/SCORING.md).

``generate_until`` decodes every request as a generate job decodes a task row: the prompt
encoded without added special tokens (lm-eval's ``--apply_chat_template`` renders the
checkpoint's chat template through ``apply_chat_template``), the method built and bound to the
checkpoint as ``dlmpipe decode`` builds it, ``batch_size`` requests decoded together (each with
the tokens it gets alone, dlmpipe/batching.py), the response cut at the first stop token, then at
lm-eval's ``until`` strings. A diffusion decoder fills a fixed number of response positions:
``gen_length`` (model argument), else the method's own, else the request's ``max_gen_toks``.
The method's sampler decides how tokens are chosen; lm-eval's sampling kwargs do not change it.

``loglikelihood`` is refused (``LOGLIKELIHOOD_REFUSAL`` says why). ``speed()`` reports what the
decoding cost: tokens per second and NFE, one pass (a campaign's timing stage gives paired
speedups, docs/METHODS.md §3).
"""
from __future__ import annotations

import time

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from .verdicts import LOGLIKELIHOOD_REFUSAL, _cut  # noqa: F401  (lmeval/campaign.py reads them there)

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default when a task names none
#: every model built in this process, in order: ``python -m dlmpipe lm-eval`` prints their speed
CREATED: list["DlmpipeLM"] = []


def _method(method: str | None, config: str | None, sampler: str | None, cache: str | None,
            params: dict) -> dict:
    """The method as configured: a campaign's expanded method ``method`` (of ``config``), or
    ``sampler`` + ``cache`` with ``sampler.<p>=``/``cache.<p>=`` parameters."""
    if method is not None:
        if sampler is not None or params:
            raise ValueError("model_args: give method= (with config=) or sampler=/cache= with "
                             "their parameters, not both")
        from ..campaign import load_campaign

        campaign = load_campaign([config or "config.yaml"], check_paths=False)
        if method not in campaign.methods:
            raise ValueError(f"model_args method={method}: not a method of {config or 'config.yaml'} "
                             f"(its methods: {', '.join(campaign.methods)})")
        return dict(campaign.methods[method])
    if sampler is None:
        raise ValueError("model_args: name a method (method=NAME,config=FILE) or a sampler "
                         "(sampler=NAME[,cache=NAME][,sampler.P=V][,cache.P=V])")
    from ..quick_decode import parse_sets

    sets = parse_sets([f"{k}={v}" for k, v in params.items()])
    return {"name": f"{sampler}+{cache or 'none'}", "sampler": {"name": sampler, **sets["sampler"]},
            "cache": {"name": cache or "none", **sets["cache"]}}


@register_model("dlmpipe")
class DlmpipeLM(LM):
    """``checkpoint``: a checkpoint directory or ``shipped:toy``; the method: ``method`` of the
    campaign ``config``, or ``sampler``/``cache`` with ``sampler.<p>``/``cache.<p>`` values."""

    def __init__(self, checkpoint: str, method: str | None = None, config: str | None = None,
                 sampler: str | None = None, cache: str | None = None,
                 gen_length: int | None = None, device: str | None = None, dtype: str = "auto",
                 seed: int = 0, batch_size: int | str | None = 1, max_batch_size: int | None = None,
                 **params):
        super().__init__()
        from .. import registry
        from ..backbones.loading import load_backbone
        from ..quick_decode import find_checkpoint

        bad = [k for k in params if not k.startswith(("sampler.", "cache."))]
        if bad:
            raise ValueError(f"model_args: unknown argument(s) {', '.join(bad)} (dlmpipe takes "
                             "checkpoint, method, config, sampler, cache, sampler.<p>, cache.<p>, "
                             "gen_length, device, dtype, seed)")
        self.checkpoint = find_checkpoint(str(checkpoint))
        self.method = registry.bind_method(_method(method, config, sampler, cache, params),
                                           self.checkpoint.identity)
        if (p := registry.pairing_problem(self.method["sampler"]["name"],
                                          self.method["cache"]["name"])):
            raise ValueError(p)
        self.gen_length = int(gen_length) if gen_length else self.method.get("gen_length")
        self._device = _device(device)
        self.dtype = ("bfloat16" if self._device.type == "cuda" else "float32") if dtype == "auto" else dtype
        self.loaded = load_backbone(self.checkpoint.path, dtype=self.dtype, device=self._device,
                                    sha256=self.checkpoint.sha256)
        # a campaign method's own block size (methods.<m>.block_size, or its sweep point's)
        self.loaded.model.use_block_size(self.method.get("block_size"),
                                         f"method {self.method['name']} block_size")
        self.artifacts = {}
        if "proxies" in registry.artifacts(self.method):  # SPA-Cache: from these weights
            from ..engine.proxies import proxies_from_model

            self.artifacts["proxies"] = proxies_from_model(self.loaded.model)
        cfg = self.loaded.model.cfg
        self.stops = cfg.stop_ids + ([cfg.pad_id] if cfg.pad_id is not None else [])
        self.batch_size = self._batch_size(batch_size, max_batch_size)
        self.seed = int(seed)
        self.records: list[dict] = []  # one per decoded request (speed())
        self.wall_s = 0.0
        CREATED.append(self)

    def _batch_size(self, value, largest) -> int:
        from ..batching import default_batch_size

        if value is None or str(value).startswith("auto"):
            size = default_batch_size(self._device)
        else:
            size = int(value)
        return max(1, min(size, int(largest)) if largest else size)

    # ---- lm-eval's interface ------------------------------------------------------------------
    def loglikelihood(self, requests):
        raise NotImplementedError(LOGLIKELIHOOD_REFUSAL)

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError(LOGLIKELIHOOD_REFUSAL)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm import tqdm

        jobs = []
        for context, kwargs in (r.args for r in requests):
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            jobs.append((context, [until] if isinstance(until, str) else list(until),
                         self.gen_length or int(kwargs.get("max_gen_toks") or DEFAULT_MAX_GEN_TOKS)))
        texts: list[str | None] = [None] * len(jobs)
        bar = tqdm(total=len(jobs), disable=disable_tqdm or self.rank != 0,
                   desc=f"dlmpipe {self.method['name']}")
        start = time.perf_counter()
        for gen_length in dict.fromkeys(g for _, _, g in jobs):
            todo = [i for i, job in enumerate(jobs) if job[2] == gen_length]
            self._check(gen_length)
            for i, text in self._decode([jobs[i][0] for i in todo], gen_length, todo):
                texts[i] = _cut(text, jobs[i][1])
                self.cache_hook.add_partial("generate_until", requests[i].args, texts[i])
                bar.update()
        self.wall_s += time.perf_counter() - start
        bar.close()
        return texts

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        """The checkpoint's own chat template, else its family's (one user turn, as dlmpipe's
        tasks prompt chat backbones: docs/MODELS.md)."""
        tok = self.loaded.tokenizer
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(chat_history, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
        from ..backbones.prompts import ChatPrompt, chat_text

        roles = [m["role"] for m in chat_history]
        if roles not in (["user"], ["system", "user"]) or not add_generation_prompt:
            raise ValueError(f"{self.checkpoint.path} has no chat template of its own and its "
                             f"family's ({self.loaded.family}) takes one user turn: run with "
                             "--fewshot_as_multiturn false (few-shot in the user turn)")
        system = chat_history[0]["content"] if roles[0] == "system" else None
        return chat_text(tok, self.loaded.family, ChatPrompt(user=chat_history[-1]["content"],
                                                             system=system))

    @property
    def tokenizer_name(self) -> str:
        return str(self.checkpoint.path)

    def chat_template(self, chat_template: bool | str = False) -> str:
        return getattr(self.loaded.tokenizer, "chat_template", None) or f"dlmpipe:{self.loaded.family}"

    # ---- decoding -------------------------------------------------------------------------------
    def _check(self, gen_length: int) -> None:
        from .. import registry

        if problems := registry.gen_length_problems(self.method, gen_length):
            raise ValueError(f"method {self.method['name']} at gen_length {gen_length}: "
                             f"{'; '.join(problems)} (set gen_length= in model_args)")

    def _decode(self, contexts: list[str], gen_length: int, keys: list[int]):
        """(key, text) per context, as each finishes; every decode recorded for ``speed()``."""
        import torch

        from ..batching import Sample, decode_batched, slot_models
        from ..decode import decode
        from ..generate import cut_at_stop, sample_seed
        from ..methods import build_method

        model = self.loaded.model
        samples = [Sample(k, torch.tensor(self.loaded.encode(c), dtype=torch.long), gen_length,
                          torch.Generator().manual_seed(sample_seed(self.seed, c)))
                   for k, c in zip(keys, contexts)]
        finished = []

        def done(sample, res) -> None:
            kept = cut_at_stop(res.response.tolist(), self.stops)
            self.records.append({"generated": len(kept), "gen_length": gen_length,
                                 "time_s": res.time_s, "nfe": res.stats["nfe"],
                                 "steps": res.stats["steps"]})
            finished.append((sample.key, self.loaded.tokenizer.decode(kept, skip_special_tokens=False)))

        batch = min(self.batch_size, len(samples))
        with torch.inference_mode():
            if batch > 1:
                slots = [build_method(self.method, slot, self.artifacts)
                         for slot in slot_models(model, batch)]
                decode_batched(model, slots, samples, done)
            else:
                sampler, cache = build_method(self.method, model, self.artifacts)
                for s in samples:
                    done(s, decode(model, sampler, cache, s.prompt_ids, gen_length, s.generator))
        return finished

    # ---- speed ----------------------------------------------------------------------------------
    def speed(self) -> dict:
        """What the requests so far cost: samples, wall time, generated tokens (before the first
        stop) per second, response positions per second, mean NFE and steps, batch size."""
        n = len(self.records)
        total = lambda key: sum(r[key] for r in self.records)  # noqa: E731
        wall = self.wall_s
        return {"method": self.method["name"], "checkpoint": str(self.checkpoint.path),
                "device": str(self._device), "batch_size": self.batch_size, "samples": n,
                "wall_s": wall, "generated_tokens": total("generated"),
                "tokens_per_s": total("generated") / wall if wall > 0 else float("nan"),
                "positions_per_s": total("gen_length") / wall if wall > 0 else float("nan"),
                "mean_nfe": total("nfe") / n if n else float("nan"),
                "mean_steps": total("steps") / n if n else float("nan")}


def speed_table(speeds: list[dict]) -> str:
    """The speed figures printed beside lm-eval's table (one row per model instance)."""
    head = ("|method|checkpoint|device|batch|samples|wall (s)|tokens/s|positions/s|mean NFE|"
            "mean steps|\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|")
    rows = [f"|{s['method']}|{s['checkpoint']}|{s['device']}|{s['batch_size']}|{s['samples']}|"
            f"{s['wall_s']:.2f}|{s['tokens_per_s']:.1f}|{s['positions_per_s']:.1f}|"
            f"{s['mean_nfe']:.1f}|{s['mean_steps']:.1f}|" for s in speeds]
    return "\n".join(["dlmpipe speed (one pass over the requests; tokens: generated before the "
                      "first stop; paired speedups come from a campaign's timing stage)", head, *rows])


def _device(device: str | None):
    """The device to decode on: lm-eval's CLI asks for ``cuda:0`` unless told otherwise; where
    CUDA is missing that default means the CPU (said once), as ``auto`` does."""
    import torch

    from ..generate import resolve_device

    if device and device.startswith("cuda") and not torch.cuda.is_available():
        print(f"dlmpipe: device {device} is not available here: decoding on the CPU", flush=True)
        device = "cpu"
    return resolve_device(device or "auto")
