"""The tiny model: Qwen3 architecture, byte-level BPE, Qwen3 chat format with <|im_end|> as EOS."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from klear.cli import main
from klear.common import storage
from klear.common.chat import END_OF_TURN

CHAT = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "<think>\n2 + 3 = 5\n</think>\n\nThe answer is $\\boxed{5}$."},
]


def test_special_tokens_are_single_tokens_and_eos_is_end_of_turn(tiny_model: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    for special in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    assert tok.eos_token == END_OF_TURN and tok.pad_token == "<|endoftext|>"
    text = "Größe: ∑ x² → 42 🙂"  # byte-level: anything encodes and decodes back
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert model.config.model_type == "qwen3"
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids(END_OF_TURN)
    assert sum(p.numel() for p in model.parameters()) < 500_000


def test_assistant_mask_is_the_reply_and_its_end_of_turn(tiny_model: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    out = tok.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert tok.decode(ids) == (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
        + CHAT[1]["content"] + "<|im_end|>\n"
    )
    trained = [i for i, m in zip(ids, mask) if m]
    assert tok.decode(trained) == CHAT[1]["content"] + END_OF_TURN
    # The prompt for generation opens the assistant turn; enable_thinking=False closes an empty think block.
    prompt = tok.apply_chat_template(CHAT[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_cli_publishes_a_loadable_model(tmp_path: Path) -> None:
    assert main(["tiny-model", "--output", str(tmp_path / "m"), "--layers", "1", "--hidden", "32", "--vocab", "600"]) == 0
    manifest = storage.read_manifest(tmp_path / "m")
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= set(manifest.files)
    with storage.fetch_published(str(tmp_path / "m")) as (local, _):
        model = AutoModelForCausalLM.from_pretrained(local)
        tok = AutoTokenizer.from_pretrained(local)
        assert model.config.num_hidden_layers == 1 and model.config.hidden_size == 32 and len(tok) == 600
        logits = model(torch.tensor([tok.encode("The answer is 5.")])).logits
        assert logits.shape[-1] == len(tok)
