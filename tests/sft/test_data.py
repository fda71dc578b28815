"""Records to training rows: accepted shapes, bad input skipped and counted, clear errors for bad models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from klear.common.config import load_config
from klear.common.records import write_records
from klear.curate.config import CurateConfig
from klear.curate.stage import run as curate
from klear.sft.config import SftConfig
from klear.sft.data import encode_example, iter_conversations, to_messages
from klear.sft.stage import SftError, build_dataset, load_tokenizer

USER = {"role": "user", "content": "Add 2 and 3."}
ASSISTANT = {"role": "assistant", "content": "<think>\n2 + 3 = 5\n</think>\n\nThe answer is $\\boxed{5}$."}


def test_record_shapes() -> None:
    assert to_messages({"messages": [USER, ASSISTANT]}) == [USER, ASSISTANT]
    assert to_messages({"record": json.dumps({"messages": [USER, ASSISTANT], "answer": "5"})}) == [USER, ASSISTANT]
    assert to_messages({"prompt": USER["content"], "record": "{cut off"}) is None  # unreadable, not a bare prompt
    # Curate's prompt with the source row's response: the outer row wins, the inner fills in.
    curated = {"prompt": USER["content"], "record": json.dumps({"question": "x", "response": ASSISTANT["content"]})}
    assert to_messages(curated) == [USER, ASSISTANT]
    assert to_messages({"prompt": USER["content"], "response": ASSISTANT["content"]}) == [USER, ASSISTANT]
    assert to_messages({"prompt": USER["content"]}) == [USER]
    assert to_messages({"problem": "no conversation here"}) == []
    assert to_messages({"messages": [{"role": "robot", "content": "?"}]}) is None
    assert to_messages({"messages": [{"role": "user", "content": 3}]}) is None
    reasoning = {"role": "assistant", "content": "5", "reasoning_content": "2 + 3"}
    assert to_messages({"messages": [USER, reasoning]})[1]["reasoning_content"] == "2 + 3"


def test_encode_skips_without_truncating(tiny_model: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    kept = encode_example(tok, json.dumps([USER, ASSISTANT]), max_length=512)
    assert kept["skip"] == "" and len(kept["input_ids"]) == len(kept["assistant_masks"]) > 10
    assert encode_example(tok, json.dumps([USER, ASSISTANT]), max_length=len(kept["input_ids"]) - 1)["skip"] == "too_long"
    assert encode_example(tok, json.dumps([USER]), max_length=512)["skip"] == "no_assistant"
    assert encode_example(tok, json.dumps([USER, {"role": "assistant", "content": "  "}]), 512)["skip"] == "no_assistant"
    assert encode_example(tok, json.dumps(None), 512)["skip"] == "unreadable"


def test_bad_records_are_counted_and_an_empty_result_is_an_error(tiny_model: str, tmp_path: Path) -> None:
    config = load_config(SftConfig, "tiny", ["max_length=64"])
    tok = load_tokenizer(Path(tiny_model), tiny_model, config)
    long_answer = {"role": "assistant", "content": "<think>\n" + "step " * 200 + "\n</think>\n\nDone."}
    rows = [{"messages": [USER, ASSISTANT]}, {"messages": [USER]}, {"messages": [USER, long_answer]},
            {"problem": "bare"}, {"messages": [{"role": "robot", "content": "x"}]}]
    write_records(rows, tmp_path / "mixed.jsonl")
    dataset, counts = build_dataset([str(tmp_path / "mixed.jsonl")], tok, config, tmp_path / "cache")
    assert counts["read"] == 5 and counts["kept"] == 1 == len(dataset)
    assert counts["skipped"] == {"no_assistant": 2, "too_long": 1, "unreadable": 1}
    assert any(where.endswith("mixed.jsonl:3") for where in counts["skipped_examples"])
    write_records(rows[1:], tmp_path / "bad.jsonl")
    with pytest.raises(SftError, match="no trainable records.*too_long"):
        build_dataset([str(tmp_path / "bad.jsonl")], tok, config, tmp_path / "cache2")


def test_reads_curated_prompts_only(demo: Path, tmp_path: Path) -> None:
    curated = tmp_path / "curated"
    report = curate([f"{demo}/math.jsonl#prompt=problem", f"{demo}/code.jsonl#prompt=question"], str(curated),
                    load_config(CurateConfig, "tiny"))
    conversations = [json.loads(c) for _, c in iter_conversations([str(curated)])]
    # prompts/ only (not removed/): kept rows; of those, the reference solutions carry a conversation.
    assert len(conversations) == report["totals"]["kept"]
    assert sum(1 for c in conversations if c and c[-1]["role"] == "assistant") == 120 + 8


def test_model_without_tokenizer_or_template_is_a_clear_error(tiny_model: str, tmp_path: Path) -> None:
    config = load_config(SftConfig, "tiny")
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(Path(tiny_model) / "config.json", bare)
    with pytest.raises(SftError, match="no tokenizer"):
        load_tokenizer(bare, "bare", config)

    no_template = tmp_path / "no-template"
    shutil.copytree(tiny_model, no_template)
    (no_template / "chat_template.jinja").unlink()
    with pytest.raises(SftError, match="no chat template"):
        load_tokenizer(no_template, "no-template", config)

    plain = tmp_path / "plain-template"
    shutil.copytree(tiny_model, plain)
    text = (plain / "chat_template.jinja").read_text()
    (plain / "chat_template.jinja").write_text(text.replace("{%- generation %}", "").replace("{%- endgeneration %}", ""))
    with pytest.raises(SftError, match="generation"):
        load_tokenizer(plain, "plain", config)
    # The paper preset's choice for base models: the shipped Qwen3 template, and EOS = <|im_end|>.
    tok = load_tokenizer(plain, "plain", load_config(SftConfig, "tiny", ["chat_template=qwen3"]))
    assert tok.eos_token == "<|im_end|>" and "generation" in tok.chat_template


def test_changed_data_at_the_same_uri_is_read_again(tiny_model: str, tmp_path: Path) -> None:
    config = load_config(SftConfig, "tiny")
    tok = load_tokenizer(Path(tiny_model), tiny_model, config)
    write_records([{"messages": [USER, ASSISTANT]}], tmp_path / "data.jsonl")
    _, first = build_dataset([str(tmp_path / "data.jsonl")], tok, config, tmp_path / "cache")
    write_records([{"messages": [USER, ASSISTANT]}] * 3, tmp_path / "data.jsonl")
    _, second = build_dataset([str(tmp_path / "data.jsonl")], tok, config, tmp_path / "cache")
    assert (first["kept"], second["kept"]) == (1, 3)
