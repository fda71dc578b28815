"""The pure parts: reasoning normal form, unit keys and seeds, what is pending, prompt rows, retry policy."""

from __future__ import annotations

import random

import pytest

from klear.common.records import Located, RecordError, Source
from klear.sample.reasoning import Parsed, from_message, from_text, render
from klear.sample.retry import backoff_delay, classify_status, parse_retry_after
from klear.sample.settings import settings_difference
from klear.sample.units import (
    DuplicatePromptError,
    canonical_hash,
    check_unique,
    pending_units,
    prompt_from_row,
    shipped_responses,
    unit_seed,
    wanted_keys,
)

NORMAL = "<think>\nstep one\n</think>\n\nthe answer"


@pytest.mark.parametrize("message", [
    {"content": "the answer", "reasoning": "step one"},  # vLLM >= 0.10
    {"content": "the answer", "reasoning_content": "\nstep one\n"},  # older servers, transformers serve
    {"content": "<think>\nstep one\n</think>\n\nthe answer"},  # no reasoning parser
    {"content": "step one\n</think>\n\nthe answer"},  # R1's template opens <think> in the prompt
    {"content": "the answer", "reasoning": "step one", "reasoning_content": "ignored"},
])
def test_every_reasoning_shape_gives_one_normal_form(message: dict) -> None:
    assert render(from_message(message, "stop")) == NORMAL


def test_a_cut_response_keeps_no_closing_tag() -> None:
    assert render(from_message({"content": None, "reasoning": "step one, and"}, "length")) == "<think>\nstep one, and"
    assert render(from_message({"content": "", "reasoning_content": "step"}, "length")) == "<think>\nstep"
    assert render(from_text("<think>\nhalf a thou")) == "<think>\nhalf a thou"
    # Cut inside the answer: the reasoning did end.
    assert render(from_message({"content": "the ans", "reasoning": "r"}, "length")) == "<think>\nr\n</think>\n\nthe ans"


def test_no_reasoning_is_kept_apart_from_empty_reasoning() -> None:
    assert from_text("just an answer") == Parsed(None, "just an answer", True)
    assert render(from_text("<think>\n\n</think>\n\nA")) == "<think>\n\n</think>\n\nA"
    assert render(from_message({"content": None}, "stop")) == ""


def test_unit_seeds_are_stable_distinct_and_independent_of_n() -> None:
    seeds = {unit_seed(0, f"p{i}", j) for i in range(100) for j in range(16)}
    assert len(seeds) == 1600 and all(0 <= s < 2**31 for s in seeds)
    assert unit_seed(0, "p1", 3) == unit_seed(0, "p1", 3) != unit_seed(1, "p1", 3)


def _prompt(row: dict, index: int = 0, where: str = "f.jsonl:1", spec: str = "f.jsonl", system: str = ""):
    return prompt_from_row(Located(where, index + 1, row), Source.parse(spec), index, "prompt", "id", system)


def test_seeding_every_unit_keys_the_work_as_before_and_unseeded_work_apart() -> None:
    from klear.common.config import load_config
    from klear.sample.config import SAMPLING_KEYS, SampleConfig, work_area

    seeded, unseeded = (load_config(SampleConfig, "paper", [f"seed_per_unit={on}"]) for on in ("true", "false"))
    # The default adds nothing to what keys a run's work: runs started before the setting find their work areas.
    assert tuple(seeded.sampling_settings()) == SAMPLING_KEYS
    assert seeded.unit_seed_base() == seeded.seed and unseeded.unit_seed_base() is None

    def area(config: SampleConfig) -> str:
        return work_area("s3://bucket/runs", "teacher", "s3://bucket/p", "s3://bucket/m", "", "", "digest", config)

    assert area(seeded) != area(unseeded)


def test_pending_units_skip_done_units_and_redo_changed_prompts() -> None:
    a, b = _prompt({"id": "a", "prompt": "x"}), _prompt({"id": "b", "prompt": "y"}, 1)
    done = {("a", 0): a.hash, ("a", 1): a.hash, ("b", 0): "stale-hash"}
    missing = pending_units([a, b], [2, 2], done)
    assert [(u.prompt, u.sample) for u in missing] == [(1, 0), (1, 1)]
    assert wanted_keys([a, b], [2, 1]) == {("a", 0): a.hash, ("a", 1): a.hash, ("b", 0): b.hash}


def test_prompt_rows_carry_their_record_and_name_what_is_missing() -> None:
    curated = _prompt({"id": "7", "source": "math", "prompt": "Q?", "record": '{"answer": "5"}'})
    assert curated.record == '{"answer": "5"}' and curated.source == "math" and curated.text == "Q?"
    raw = _prompt({"id": 7, "problem": "Q?", "answer": 5}, spec="f.jsonl#prompt=problem")
    assert raw.id == "7" and raw.record == '{"id":7,"answer":5}'
    chat = _prompt({"id": "c", "messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A"}]},
                   system="Be brief.")
    assert [m["role"] for m in chat.messages] == ["system", "user"] and chat.text == "Q?"
    with pytest.raises(RecordError, match=r"f.jsonl:1: no prompt id in field 'id' \(fields present: \['prompt'\]\)"):
        _prompt({"prompt": "Q?"})
    with pytest.raises(RecordError, match=r"f.jsonl:1: prompt field 'prompt' is missing .*#prompt=FIELD"):
        _prompt({"id": "1", "question": "Q?"})
    with pytest.raises(RecordError, match="is empty"):
        _prompt({"id": "1", "prompt": "  "})


def test_duplicate_ids_name_both_places() -> None:
    rows = [_prompt({"id": "x", "prompt": "a"}, 0, "a.jsonl:3"), _prompt({"id": "x", "prompt": "b"}, 1, "b.jsonl:9")]
    with pytest.raises(DuplicatePromptError, match="'x' appears twice: a.jsonl:3 and b.jsonl:9"):
        check_unique(rows)


def test_shipped_responses_are_found_in_each_shape() -> None:
    assert shipped_responses({"response": "r"}) == [{"content": "r"}]
    assert shipped_responses({"generations": ["a", "b"]}) == [{"content": "a"}, {"content": "b"}]
    chat = {"messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": "A", "reasoning_content": "R"}]}
    assert shipped_responses(chat) == [{"content": "A", "reasoning_content": "R"}]
    assert shipped_responses({"messages": [{"role": "user", "content": "q"}]}) == []


def test_retry_policy_retries_only_what_can_succeed() -> None:
    assert [classify_status(s) for s in (200, 429, 500, 503, 408)] == ["ok", "retry", "retry", "retry", "retry"]
    assert [classify_status(s) for s in (401, 403, 404)] == ["fatal"] * 3
    assert [classify_status(s) for s in (400, 413, 422)] == ["unit"] * 3


def test_backoff_grows_is_capped_jittered_and_yields_to_retry_after() -> None:
    rng = random.Random(0)
    delays = [backoff_delay(k, 1.0, 8.0, rng) for k in range(1, 8)]
    assert all(0.5 * min(8.0, 2.0 ** (k - 1)) <= d <= min(8.0, 2.0 ** (k - 1)) for k, d in zip(range(1, 8), delays))
    assert len({round(backoff_delay(3, 1.0, 8.0, rng), 6) for _ in range(20)}) > 1  # jitter
    assert 30.0 <= backoff_delay(1, 1.0, 8.0, rng, retry_after=30.0) <= 33.0
    assert backoff_delay(1, 1.0, 8.0, rng, retry_after=9999.0, retry_after_cap=60.0) <= 66.0
    assert parse_retry_after("7") == 7.0 and parse_retry_after("0.5") == 0.5 and parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None


def test_canonical_hash_ignores_key_order_and_settings_differences_are_named() -> None:
    assert canonical_hash({"a": 1, "b": [1, 2]}) == canonical_hash({"b": [1, 2], "a": 1})
    text = settings_difference({"sampling": {"temperature": 0.6, "seed": 0}}, {"sampling": {"temperature": 0.7, "seed": 0}})
    assert text == "sampling.temperature: 0.6 -> 0.7"


def test_first_copies_keeps_the_first_shard_of_each_unit_sorted_or_not() -> None:
    """The copy kept of each wanted unit, in position order: the first shard of several (racing writers), none of
    the unwanted (-1); keys already one per unit in order (one writer) take the path without a sort."""
    import numpy as np

    from klear.sample.units import first_copies

    rng = random.Random(3)
    for trial in range(40):
        positions = np.array([rng.randrange(-1, 30) for _ in range(rng.randrange(0, 60))], np.int64)
        if trial % 2:  # one writer: each unit once, ascending
            positions = np.unique(positions[positions >= 0])
        shards = np.array([rng.randrange(5) for _ in positions], np.int32)
        best: dict[int, int] = {}
        for i, (p, s) in enumerate(zip(positions.tolist(), shards.tolist(), strict=True)):
            if p >= 0 and (p not in best or (s, i) < (shards[best[p]], best[p])):
                best[p] = i
        assert first_copies(positions, shards).tolist() == [best[p] for p in sorted(best)]


def test_prompts_held_as_columns_give_back_the_same_prompts() -> None:
    """units.Prompts: every field of every prompt back as it went in (chats with a system turn, curated records,
    shipped responses by prompt index), by index, slice, take and iteration, in ~200 bytes a prompt rather than
    ~900 as objects; a duplicate id is still named with both places."""
    import dataclasses

    from klear.sample.units import Plan, Prompts, units_digest

    given = [_prompt({"id": f"p{i}", "prompt": f"question {i} ünï"}, i, f"a.jsonl:{i + 1}") for i in range(5000)]
    given[3] = _prompt({"id": "c", "source": "math", "messages": [{"role": "user", "content": "Q?"}]}, 3,
                       system="Be brief.")
    given[7] = dataclasses.replace(given[7], shipped=({"content": "A", "reasoning_content": "R"},))
    prompts = Prompts.of(iter(given), batch=64)
    assert len(prompts) == 5000 and list(prompts) == given and prompts[7].shipped == given[7].shipped
    assert prompts[3] == given[3] and prompts[-1] == given[-1] and prompts[3].messages[0]["role"] == "system"
    assert list(prompts[10:20]) == given[10:20] and list(prompts.take([7, 2])) == [given[7], given[2]]
    assert prompts.take([7])[0].shipped == given[7].shipped
    with pytest.raises(IndexError):
        prompts[5000]
    assert prompts.table.nbytes / len(prompts) < 200
    assert units_digest(prompts, [2] * 5000) == units_digest(given, [2] * 5000)
    plan, expected = Plan.of(prompts, [2] * 5000), Plan.of(given, [2] * 5000)
    assert plan.ids.equals(expected.ids) and plan.hashes.equals(expected.hashes)
    check_unique(prompts)
    twice = Prompts.of([*given[:2], _prompt({"id": "p0", "prompt": "again"}, 2, "b.jsonl:9")])
    with pytest.raises(DuplicatePromptError, match="'p0' appears twice: a.jsonl:1 and b.jsonl:9"):
        check_unique(twice)
