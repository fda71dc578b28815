"""The paper presets carry the released run scripts' optimiser and data values; prompts over max_prompt_length
are cut from the left (data.truncation='left') rather than skipped; the vLLM importance-sampling correction has a
preset of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klear.common.config import load_config
from klear.gppo.config import GppoConfig
from klear.gppo.data import load_rows, truncate_left


def _words(messages: list[dict[str, str]]) -> int:
    """A stand-in tokenizer: 3 template tokens per turn plus one per word."""
    return sum(3 + len(m["content"].split()) for m in messages)


@pytest.mark.parametrize("preset", ["math", "code"])
def test_paper_presets_carry_the_released_values(preset: str) -> None:
    c = load_config(GppoConfig, preset)
    assert (c.warmup_steps, c.weight_decay, c.num_epochs) == (10, 0.1, 5)
    assert (c.max_prompt_length, c.prompt_truncation) == (4096, "left")
    assert (c.reward.mode, c.reward.filter_on, c.vllm_is_correction) == ("paper", "accuracy", False)
    assert load_config(GppoConfig, f"vllm-is-{preset}").vllm_is_correction is True


def test_truncate_left_keeps_the_end_of_the_last_turn() -> None:
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "w1 w2 w3 w4 w5 w6 w7 w8"}]
    assert truncate_left(prompt, _words, 100) is prompt  # fits: the very same prompt
    cut = truncate_left(prompt, _words, 10)
    assert cut is not None and _words(cut) <= 10
    assert cut[0] == prompt[0] and prompt[1]["content"].endswith(cut[1]["content"])
    assert cut[1]["content"].split() == ["w7", "w8"]  # the fewest words cut: (3 + 2) + (3 + 2) = 10 tokens
    assert truncate_left(prompt, _words, 5) is None  # the template alone is longer


def test_load_rows_truncates_or_skips(tmp_path: Path) -> None:
    path = tmp_path / "rl.jsonl"
    rows = [{"prompt": "short question", "answer": "1"}, {"prompt": " ".join(f"w{i}" for i in range(50)), "answer": "2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    skipped, counts = load_rows([str(path)], "math", _words, 20)
    assert len(skipped) == 1 and counts["skipped"] == {"prompt_too_long": 1} and counts["truncated"] == 0
    kept, counts = load_rows([str(path)], "math", _words, 20, "left")
    assert len(kept) == 2 and counts["truncated"] == 1 and counts["skipped"] == {}
    assert _words(kept[1]["prompt"]) <= 20 and kept[1]["prompt"][-1]["content"].endswith("w49")
