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

    <think>\n{reasoning}\n</think>\n\n{final}

with `<think>\n{reasoning}` for a response cut inside its reasoning and the bare final text for one without any
(`final`: the text after the thinking, the model's answer; a sample row's column of that name holds it);
`render_response` writes it and `split_response` reads it (and raw model text with inline tags) back.

Where thinking ends is decided here only (`answer_start`): sampling, judging, the verifiers, sft-data and the
rewards all read a response's answer through it, so a response with two `</think>` has one answer everywhere.
The checks of the think tags that the rewards' format rule makes (`format_fault`) live here too.
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
    final: str  # the text after the thinking: the model's answer
    closed: bool  # the reasoning ended (a `</think>` belongs in the normal form)


def answer_start(text: str, think_end: str = THINK_CLOSE) -> int | None:
    """Where a response's answer starts: just after the LAST `think_end` (`</think>`) in it; None when it has none
    (thinking never ended: the response was cut inside its reasoning, or has none).

    The one rule for where thinking ends. It is the released reward's (verl/utils/reward_score/math_dapo.py,
    compute_score: `solution_str.split("</think>")[-1]`) and its judge's (benchmarks/judge_math.py,
    `remove_think`); a `</think>` a model writes inside its reasoning, or a server's reasoning parser leaves in
    the answer (vLLM's deepseek_r1 ends the reasoning at the first one), is reasoning, not answer. (The released
    code reward's regex, which code_rules=release keeps, anchors at the first `</think>`: see
    klear.verifiers.code_verifier.extract_program_release.)"""
    if not think_end:
        raise ValueError("think_end is empty: no end of thinking to find")
    at = text.rfind(think_end)
    return None if at < 0 else at + len(think_end)


def split_response(text: str) -> ResponseParts:
    """The parts of a response in normal form, or of raw model text with inline think tags, by `answer_start`:
    the reasoning is everything before the end of thinking, less the `<think>` it opens with (a template may open
    it in the prompt; text before a `<think>` stays in the reasoning); without an end, text that opens with
    `<think>` is a reasoning cut short, and any other text is an answer without reasoning."""
    start = answer_start(text)
    if start is not None:
        head = text[: start - len(THINK_CLOSE)].lstrip()
        return ResponseParts(head.removeprefix(THINK_OPEN).strip(), text[start:].lstrip(), True)
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return ResponseParts(stripped[len(THINK_OPEN):].strip(), "", False)
    return ResponseParts(None, text, True)


def answer_section(response: str, think_end: str = THINK_CLOSE, require_think_end: bool = True) -> str | None:
    """The text a verifier judges: what follows the end of thinking (`answer_start`), as the model wrote it (not
    stripped: math-verify reads it as the release does); the whole response when `think_end` is '' or, unless
    `require_think_end`, when thinking never ended; None when it is required and never ended (cut at max tokens)."""
    if not think_end:
        return response
    start = answer_start(response, think_end)
    if start is None:
        return None if require_think_end else response
    return response[start:]


def format_fault(response: str, think_start_in_prompt: bool = False) -> str | None:
    """What keeps a response's reasoning from being one `<think>...</think>` block at its start, checked in the
    released reward's order (math_dapo / code_r1_compute.compute_score(is_longcot=True): `</think>` first):
    "no_think_end" without `</think>`, "no_think_start" without `<think>` (unless the chat template opened it in
    the prompt: `think_start_in_prompt`), "malformed" for tags repeated, out of order, text before `<think>` or a
    block with nothing inside; None for a well-formed response."""
    if THINK_CLOSE not in response:
        return "no_think_end"
    if not think_start_in_prompt and THINK_OPEN not in response:
        return "no_think_start"
    text = (THINK_OPEN if think_start_in_prompt else "") + response.lstrip()
    if (not text.startswith(THINK_OPEN) or text.count(THINK_OPEN) != 1 or text.count(THINK_CLOSE) != 1
            or text.index(THINK_CLOSE) == len(THINK_OPEN)):
        return "malformed"
    return None


def render_response(parts: ResponseParts) -> str:
    """The normal form of a response's parts (split_response reads it back to the same parts, unless the final text
    holds a `</think>`: by the rule, all before it is reasoning)."""
    if parts.reasoning is None:
        return parts.final
    if not parts.closed:
        return f"{THINK_OPEN}\n{parts.reasoning}"
    return f"{THINK_OPEN}\n{parts.reasoning}\n{THINK_CLOSE}\n\n{parts.final}"
