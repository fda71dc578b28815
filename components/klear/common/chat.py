"""The Qwen3 chat format with `{% generation %}` markers, for assistant-only loss.

Qwen3's own template, minus tool calls, plus the markers: `apply_chat_template(...,
return_assistant_tokens_mask=True)` then marks exactly the assistant's reply *and* its
`<|im_end|>`, so the model is trained to end its turn (the EOS of an SFT'd Qwen model is
`<|im_end|>`, not the base model's `<|endoftext|>`). The newline after `<|im_end|>` belongs
to the frame, not the reply. An assistant message may carry its reasoning either inline
(`<think>...</think>` at the start of `content`, as the teacher data does) or in
`reasoning_content`. `enable_thinking=False` at inference appends an empty think block, as
Qwen3 does.
"""

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
