"""Per-layer drift profile of the toy backbone, plotted like the SPA-Cache paper's Figure 2
(run on demand).

Decodes toy-task prompts with LLaDA confidence over full recompute and, at every step after
the first, measures per layer the fraction of response tokens whose state has cosine similarity
below tau (0.95) with the same token's state at the previous step: the layer's output hidden
state (the paper's quantity), the layer's residual delta (attention + FFN output, what SPA-Cache
reuses for non-selected rows) and the value vectors (dLLM-Cache's identifier). Prints the table
and writes a PNG with the uniform budget 0.25 dashed and the adaptive rho(l) of the LLaDA-8B
profile at this depth.

    python benchmarks/bench_drift_profile.py --checkpoint results/checkpoints/toy --out drift_toy.png
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from dlmpipe.decode import decode
from dlmpipe.engine.full import FullRecompute
from dlmpipe.engine.spa import layer_budgets
from dlmpipe.generate import encode_prompt
from dlmpipe.methods import build_sampler

SERIES = ("output", "delta", "value")


class DriftRecorder(FullRecompute):
    """Full recompute that compares each layer's response states with the previous step's."""

    def __init__(self, model, tau: float):
        super().__init__(model)
        self.tau = tau
        n = model.cfg.n_layers
        self.drifting = {s: [0] * n for s in SERIES}  # tokens below tau, summed over steps
        self.compared = 0                              # response tokens compared per layer

    def begin(self, x, prompt_len):
        super().begin(x, prompt_len)
        self.previous = None

    def response_logits(self, x, block):
        self.stats.nfe += 1
        m, P = self.model, self.prompt_len
        rope = m.rope(torch.arange(x.shape[0]))
        h = m.embed(x[None])
        states = []
        for i in range(m.cfg.n_layers):
            _, _, v = m.qkv(i, h, rope)
            out, _, _ = m.layer(i, h, rope)
            value = v[0, :, P:].transpose(0, 1).reshape(x.shape[0] - P, -1)
            states.append({"output": out[0, P:], "delta": (out - h)[0, P:], "value": value})
            h = out
        if self.previous is not None:
            for i, (now, before) in enumerate(zip(states, self.previous)):
                for s in SERIES:
                    sim = F.cosine_similarity(now[s].float(), before[s].float(), dim=-1)
                    self.drifting[s][i] += int((sim < self.tau).sum())
            self.compared += x.shape[0] - P
        self.previous = states
        return m.response_logits_from_rows(h[:, m.first_logit_row(P):])[0]

    def fractions(self) -> dict[str, list[float]]:
        return {s: [d / max(self.compared, 1) for d in counts] for s, counts in self.drifting.items()}


def plot(fractions: dict[str, list[float]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(fractions["output"])
    layers = list(range(n))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.bar(layers, fractions["output"], color="#4C72B0", label="output hidden state")
    ax.plot(layers, fractions["delta"], "o-", color="#DD8452", label="attention+FFN delta")
    ax.plot(layers, fractions["value"], "s-", color="#55A868", label="value vectors")
    ax.plot(layers, layer_budgets(n, "llada-8b-instruct"), "^:", color="#8172B2", label="adaptive rho(l) (LLaDA-8B)")
    ax.axhline(0.25, ls="--", color="gray", label="uniform rho = 0.25")
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction of tokens, cos sim < 0.95")
    ax.set_xticks(layers)
    top = max(max(v) for v in fractions.values())
    ax.set_ylim(0, min(1.0, max(0.3, 1.15 * top)))
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)


@torch.inference_mode()
def main() -> None:
    from dlmpipe.backbones.loading import load_backbone
    from dlmpipe.tasks.toy import make_examples

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="results/checkpoints/toy")
    ap.add_argument("--tasks", default="toy_code,toy_arith")
    ap.add_argument("--n", type=int, default=20, help="prompts per task")
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--out", default="drift_profile.png")
    ap.add_argument("--label", default=None, help="backbone name in the title (default: the directory)")
    a = ap.parse_args()
    ckpt = Path(a.checkpoint)
    if not (ckpt / "config.json").is_file():
        raise SystemExit(f"{ckpt}: no checkpoint (run the workflow, or `python -m dlmpipe train-toy "
                         f"--out {ckpt}`)")
    loaded = load_backbone(ckpt)
    recorder = DriftRecorder(loaded.model, a.tau)
    for task in a.tasks.split(","):
        for row in make_examples(task, a.n, 1000):
            prompt = torch.tensor(encode_prompt(loaded, row, chat=False))
            decode(loaded.model, build_sampler({"name": "llada_confidence"}), recorder, prompt, a.gen)
    fr = recorder.fractions()
    print(f"checkpoint={ckpt} tasks={a.tasks} n={a.n} per task, gen={a.gen}, tau={a.tau}, "
          f"{recorder.compared} token comparisons per layer")
    print(f"{'layer':>5} " + " ".join(f"{s:>8}" for s in SERIES) + f" {'rho(l)':>8}")
    for i, rho in enumerate(layer_budgets(len(fr["output"]), "llada-8b-instruct")):
        print(f"{i:>5} " + " ".join(f"{fr[s][i]:>8.3f}" for s in SERIES) + f" {rho:>8.3f}")
    plot(fr, Path(a.out), f"drift per layer ({a.label or ckpt.name}, tau {a.tau})")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
