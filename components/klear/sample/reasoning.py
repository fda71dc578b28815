"""One normal form for a response's reasoning, whatever shape the server or engine gave it in.

Servers put the reasoning in `message.reasoning` (vLLM >= 0.10 with `--reasoning-parser`), in
`message.reasoning_content` (older vLLM, SGLang, `transformers serve`), or leave it inline in `content` as
`<think>...</think>` (no parser; local engines). DeepSeek-R1's chat template opens `<think>` in the prompt,
so the model's text may hold only the closing tag. The normal form is

    <think>\n{reasoning}\n</think>\n\n{answer}

and a response cut inside its reasoning keeps no `</think>`: `<think>\n{reasoning}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from klear.common.chat import THINK_CLOSE, THINK_OPEN


@dataclass(frozen=True, slots=True)
class Parsed:
    reasoning: str | None  # None: the response has no reasoning part
    answer: str
    closed: bool  # the reasoning ended (a `</think>` belongs in the normal form)


def from_text(text: str) -> Parsed:
    """Split raw model text with inline think tags."""
    if THINK_CLOSE in text:
        head, _, answer = text.partition(THINK_CLOSE)
        head = head.split(THINK_OPEN, 1)[1] if THINK_OPEN in head else head
        return Parsed(head.strip(), answer.lstrip(), True)
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return Parsed(stripped[len(THINK_OPEN):].strip(), "", False)
    return Parsed(None, text, True)


def from_message(message: Mapping[str, Any], finish_reason: str | None) -> Parsed:
    """Split a chat-completion message, reading any of the three reasoning shapes."""
    content = message.get("content")
    for key in ("reasoning", "reasoning_content"):
        reasoning = message.get(key)
        if isinstance(reasoning, str) and reasoning:
            answer = content if isinstance(content, str) else ""
            # vLLM sends content None when the output never left the reasoning; transformers serve sends "".
            # Either way an empty answer on a cut response means the cut fell inside the reasoning.
            closed = content is not None and not (finish_reason == "length" and not answer.strip())
            return Parsed(reasoning.strip(), answer.lstrip(), closed)
    return from_text(content if isinstance(content, str) else "")


def render(parsed: Parsed) -> str:
    if parsed.reasoning is None:
        return parsed.answer
    if not parsed.closed:
        return f"{THINK_OPEN}\n{parsed.reasoning}"
    return f"{THINK_OPEN}\n{parsed.reasoning}\n{THINK_CLOSE}\n\n{parsed.answer}"
