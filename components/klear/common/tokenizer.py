"""The one tokenizer loader: a model folder's tokenizer with the chat template conversations are rendered with.

sft-data measures its records with it in the CPU image (transformers' AutoTokenizer imports without torch, and
only when called); sft and gppo add the end-of-turn rule of training on top (`klear.training.stage`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klear.common.chat import QWEN3_CHAT_TEMPLATE

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def load_tokenizer(model_dir: Path, model: str, chat_template: str, error: type[Exception]) -> Any:
    """The tokenizer in `model_dir` (the local copy of `model`, the URI named in errors, raised as `error`).
    `chat_template`: 'qwen3' (the shipped template) or 'model' (the tokenizer's own, which must exist)."""
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise error(f"{model}: no tokenizer files ({' / '.join(TOKENIZER_FILES)}); save the tokenizer with the model")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if chat_template == "qwen3":
        tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    elif not tokenizer.chat_template:
        raise error(f"{model}: the tokenizer has no chat template; ship one or use --set chat_template=qwen3")
    return tokenizer
