"""Chat prompts per family, and the code-task prompt conventions the papers used.

A prompt is a user turn, an optional system turn, and an optional ``response_prefix``: text
placed after the assistant header, so the response is a continuation of it (how Saber, and
Archer after it, prompt code tasks: the model continues an opened code block). The chat text
comes from the tokenizer's own template when the checkpoint ships one, else from the family's
template string (docs/MODELS.md; ``Family.chat_template``); it is tokenized with
``add_special_tokens=False`` because the template already holds every special token.
"""
from __future__ import annotations

from .chat import ChatPrompt, messages
from .families import family as family_named
from .families.llada import chat_template as llada_template
from .families.qwen import DEFAULT_SYSTEM_PROMPT
from .families.qwen import qwen25_template as qwen_template

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ChatPrompt", "chat_ids", "chat_text", "humaneval_prompt",
           "llada_template", "mbpp_problem", "mbpp_prompt", "qwen_template"]


def chat_text(tokenizer, family: str, prompt: str | ChatPrompt) -> str:
    """The full prompt text: chat template with a generation prompt, then the response prefix."""
    p = prompt if isinstance(prompt, ChatPrompt) else ChatPrompt(user=prompt)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages(p), tokenize=False, add_generation_prompt=True)
    else:
        text = family_named(family).chat_template(p)
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
