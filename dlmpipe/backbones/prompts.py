"""Chat prompts per family, and the code-task prompt conventions the papers used.

A prompt is a user turn, an optional system turn, and an optional ``response_prefix``: text
placed after the assistant header, so the response is a continuation of it (how Saber, and
Archer after it, prompt code tasks: the model continues an opened code block). The chat text
comes from the tokenizer's own template when the checkpoint ships one, else from the template
strings of docs/MODELS.md; it is tokenized with ``add_special_tokens=False`` because
the template already holds every special token.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."  # Qwen2.5's, used by Dream and DiffuCoder


@dataclass(frozen=True)
class ChatPrompt:
    user: str
    response_prefix: str = ""
    system: str | None = None


def _messages(p: ChatPrompt) -> list[dict]:
    return ([{"role": "system", "content": p.system}] if p.system else []) + [{"role": "user", "content": p.user}]


def llada_template(p: ChatPrompt) -> str:
    """LLaDA-8B-Instruct (Llama-3 headers, contents stripped as its template does)."""
    turns = "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>"
                    for m in _messages(p))
    return "<|startoftext|>" + turns + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def qwen_template(p: ChatPrompt) -> str:
    """Qwen2.5 (Dream, DiffuCoder): a system turn always, the default one when none is given."""
    system = p.system or DEFAULT_SYSTEM_PROMPT
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{p.user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


FALLBACK_TEMPLATES = {"llada": llada_template, "dream": qwen_template}


def chat_text(tokenizer, family: str, prompt: str | ChatPrompt) -> str:
    """The full prompt text: chat template with a generation prompt, then the response prefix."""
    p = prompt if isinstance(prompt, ChatPrompt) else ChatPrompt(user=prompt)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(_messages(p), tokenize=False, add_generation_prompt=True)
    else:
        text = FALLBACK_TEMPLATES[family](p)
    return text + p.response_prefix


def chat_ids(tokenizer, family: str, prompt: str | ChatPrompt) -> list[int]:
    return tokenizer(chat_text(tokenizer, family, prompt), add_special_tokens=False)["input_ids"]


# ---- code tasks: Saber's prompts, which Archer reuses for every method and backbone ---------
def humaneval_prompt(problem: str) -> ChatPrompt:
    """HumanEval: ask for a solution to the stub; the response continues the stub in a code block.

    The program to execute is ``problem`` + the generated function body (up to the closing fence).
    """
    return ChatPrompt(
        user=("Write a solution to the following problem and make sure that it passes the tests:\n"
              f"```python\n{problem}\n```"),
        response_prefix=f"Here is the completed function:\n```python\n{problem}\n")


def mbpp_problem(text: str, tests: list[str]) -> str:
    """An MBPP problem statement with its public asserts, in Saber's ``>>>`` layout."""
    return ">>> Problem:\n{}\n>>> Test Cases:\n{}\n".format(text.strip(), "\n".join(tests))


def mbpp_prompt(text: str, tests: list[str]) -> ChatPrompt:
    """MBPP: zero-shot, the task text and its tests; the response opens a python code block."""
    return ChatPrompt(
        user=("You are an expert Python programmer. Please write a python function to solve the "
              "following problem:\n" + mbpp_problem(text, tests)),
        response_prefix=">>> Code:\n```python\n")
