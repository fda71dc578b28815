"""The Qwen3 chat format with `{% generation %}` markers, for assistant-only loss.

Qwen3's own template, minus tool calls, plus the markers: `apply_chat_template(...,
return_assistant_tokens_mask=True)` then marks exactly the assistant's reply *and* its
`<|im_end|>`, so the model is trained to end its turn (the EOS of an SFT'd Qwen model is
`<|im_end|>`, not the base model's `<|endoftext|>`). The newline after `<|im_end|>` belongs
to the frame, not the reply. An assistant message may carry its reasoning either inline
(`<think>...</think>` at the start of `content`, as the teacher data does) or in
`reasoning_content`. `enable_thinking=False` at inference appends an empty think block, as
Qwen3 does.

A response's normal form (what `klear sample` writes, what SFT records hold) is

    <think>\n{reasoning}\n</think>\n\n{answer}

with `<think>\n{reasoning}` for a response cut inside its reasoning and the bare answer for one without any;
`render_response` writes it and `split_response` reads it (and raw model text with inline tags) back.
"""

from __future__ import annotations

from dataclasses import dataclass

END_OF_TURN = "<|im_end|>"
START_OF_TURN = "<|im_start|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if message.get('reasoning_content') %}"
    "{{- '<think>\\n' + message['reasoning_content'].strip('\\n') + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message['content'] + '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


@dataclass(frozen=True, slots=True)
class ResponseParts:
    reasoning: str | None  # None: the response has no reasoning part
    answer: str
    closed: bool  # the reasoning ended (a `</think>` belongs in the normal form)


def split_response(text: str) -> ResponseParts:
    """The parts of a response in normal form, or of raw model text with inline think tags: the reasoning is what
    lies before the first `</think>` (after a `<think>`, if any: a template may open it in the prompt)."""
    if THINK_CLOSE in text:
        head, _, answer = text.partition(THINK_CLOSE)
        head = head.split(THINK_OPEN, 1)[1] if THINK_OPEN in head else head
        return ResponseParts(head.strip(), answer.lstrip(), True)
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return ResponseParts(stripped[len(THINK_OPEN):].strip(), "", False)
    return ResponseParts(None, text, True)


def render_response(parts: ResponseParts) -> str:
    """The normal form of a response's parts (split_response reads it back to the same parts)."""
    if parts.reasoning is None:
        return parts.answer
    if not parts.closed:
        return f"{THINK_OPEN}\n{parts.reasoning}"
    return f"{THINK_OPEN}\n{parts.reasoning}\n{THINK_CLOSE}\n\n{parts.answer}"
