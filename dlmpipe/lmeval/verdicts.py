"""What the lm-eval model (model.py) and the campaign's lm-eval verdicts (campaign.py) share,
without lm_eval or the model: the refusal of loglikelihood requests and lm-eval's stop
sequences. Its own module so that campaign.py (which the task registry and the campaign check
import) does not import model.py, which imports the campaign (an import circle).
"""
from __future__ import annotations

#: why a dlmpipe method serves no loglikelihood request
LOGLIKELIHOOD_REFUSAL = (
    "dlmpipe decodes with diffusion language models, which fill masked positions in any order: "
    "they define no left-to-right factorization, so log P(continuation | context), the number "
    "lm-eval's loglikelihood tasks (multiple_choice, perplexity) compare, is not something the "
    "model computes; its masked-token ELBO is only a bound, and no dlmpipe sampler or cache "
    "(whose subject is how tokens are generated) estimates it. Use a generate_until task "
    "(e.g. gsm8k, bbh_cot_fewshot_*, bbh_zeroshot_*, or a task's *_generative/*_cot variant)")


def _cut(text: str, until: list[str]) -> str:
    """lm-eval's stop sequences: the text before the first occurrence of any."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text
