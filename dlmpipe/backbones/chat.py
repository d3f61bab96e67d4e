"""A chat prompt as the backbones' templates read it (prompts.py builds and tokenizes it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatPrompt:
    user: str
    response_prefix: str = ""
    system: str | None = None


def messages(p: ChatPrompt) -> list[dict]:
    """The prompt as chat-template messages: the system turn (when given), then the user turn."""
    return ([{"role": "system", "content": p.system}] if p.system else []) + [{"role": "user", "content": p.user}]
