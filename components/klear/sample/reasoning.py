"""One normal form for a response's reasoning, whatever shape the server or engine gave it in.

Servers put the reasoning in `message.reasoning` (vLLM >= 0.10 with `--reasoning-parser`), in
`message.reasoning_content` (older vLLM, SGLang, `transformers serve`), or leave it inline in `content` as
`<think>...</think>` (no parser; local engines). DeepSeek-R1's chat template opens `<think>` in the prompt,
so the model's text may hold only the closing tag. The normal form is

    <think>\n{reasoning}\n</think>\n\n{final}

and a response cut inside its reasoning keeps no `</think>`: `<think>\n{reasoning}`. Thinking ends at the last
`</think>` (klear.common.chat.answer_start), also where a server's parser split the reply at an earlier one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The normal form is the sample-row contract's (klear.common.chat): these are its one reader and one writer.
from klear.common.chat import ResponseParts as Parsed
from klear.common.chat import render_response as render
from klear.common.chat import split_response as from_text

__all__ = ["Parsed", "from_message", "from_text", "render"]


def from_message(message: Mapping[str, Any], finish_reason: str | None) -> Parsed:
    """Split a chat-completion message, reading any of the three reasoning shapes."""
    content = message.get("content")
    for key in ("reasoning", "reasoning_content"):
        reasoning = message.get(key)
        if isinstance(reasoning, str) and reasoning:
            final = content if isinstance(content, str) else ""
            # vLLM sends content None when the output never left the reasoning; transformers serve sends "".
            # Either way an empty final text on a cut response means the cut fell inside the reasoning.
            closed = content is not None and not (finish_reason == "length" and not final.strip())
            parts = Parsed(reasoning.strip(), final.lstrip(), closed)
            # vLLM's deepseek_r1 parser ends the reasoning at the first </think>; the contract's rule is the last,
            # so a final text that still holds one is split again (any other closed reply reads back unchanged).
            return from_text(render(parts)) if closed else parts
    return from_text(content if isinstance(content, str) else "")
