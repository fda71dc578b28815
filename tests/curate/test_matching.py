"""Normalization, dedup keys and n-gram matching on the real AIME/HMMT sets."""

import random

import pytest

from klear import testsets as benchmarks
from klear.common.records import read_records
from klear.curate.matching import (
    BenchmarkItem,
    Match,
    NgramIndex,
    baseline_contaminated,
    dedup_key,
    normalize,
    normalize_batch,
    pack_normalized,
    words,
)
from klear.demo.generate import math_items


@pytest.fixture(scope="module")
def items() -> list[BenchmarkItem]:
    out = []
    for name in benchmarks.NAMES:
        for row in read_records(str(benchmarks.path(name))):
            out.append(BenchmarkItem(row["id"], row["benchmark"], row["problem"]))
    return out


@pytest.fixture(scope="module")
def index(items: list[BenchmarkItem]) -> NgramIndex:
    return NgramIndex(items, n=9)


def test_normalize_folds_case_unicode_and_math_delimiters() -> None:
    assert normalize("Find  $x^2$, if \\(x = 3\\)!") == "find x 2 if x 3"
    assert normalize("ＦＩＮＤ the ﬁrst １２ primes") == "find the first 12 primes"  # NFKC: full-width, ligature
    assert normalize("a_b—c…d") == "a b c d"
    assert normalize("  \t\n ") == ""
    assert words("Élan Vital: déjà vu") == ["élan", "vital", "déjà", "vu"]


def test_batch_normalization_equals_single_text_normalization() -> None:
    rng = random.Random(7)
    alphabet = "abcXYZ019 _-$\\{}()[].,;:!?\t\n éÉßΣσ１２ﬁ—…√∑π∞"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(2000)]
    texts += ["", " ", "$$", "plain ascii only", "ÄÖÜ äöü"]
    assert normalize_batch(texts).to_pylist() == [normalize(t).split() for t in texts]


def test_dedup_key_ignores_formatting_only() -> None:
    assert dedup_key(normalize("What is 2+2?")) == dedup_key(normalize("  WHAT is 2 + 2 ?"))
    assert dedup_key(normalize("What is 2+2?")) != dedup_key(normalize("What is 2+3?"))


def _variants(problem: str) -> dict[str, str]:
    tokens = problem.split()
    return {
        "verbatim": problem,
        "upper": problem.upper(),
        "lower-no-dollars": problem.replace("$", "").lower(),
        "respaced": "   ".join(tokens),
        "punctuation": problem.replace(",", " ; ").replace(".", "!").replace("$", "\\("),
        "embedded": f"Solve this for me step by step please. {problem} Give only the final number at the end.",
        "first-60-percent": " ".join(tokens[: int(len(tokens) * 0.6)]),
    }


def test_every_benchmark_problem_is_caught_in_every_rewording(index: NgramIndex, items: list[BenchmarkItem]) -> None:
    texts, expected = [], []
    for item in items:
        for how, text in _variants(item.text).items():
            if how == "first-60-percent" and len(words(text)) < index.n:
                continue
            texts.append(text)
            expected.append((item.id, how))
    matches = index.match_batch(normalize_batch(texts))
    missed = [exp for exp, match in zip(expected, matches) if match is None or exp[0] not in match.item_ids]
    assert not missed, f"{len(missed)} reworded benchmark problems not caught, e.g. {missed[:5]}"


def test_unrelated_problems_are_kept(index: NgramIndex) -> None:
    clean = [row["problem"] for row in math_items(300, random.Random(1))]
    clean.append("Let x be a real number such that the sum of its digits is a prime; describe all such x.")
    assert index.match_batch(normalize_batch(clean)) == [None] * len(clean)


def test_match_reports_the_shared_ngram(index: NgramIndex, items: list[BenchmarkItem]) -> None:
    item = items[5]
    match = index.match_batch(normalize_batch([f"Intro words here. {item.text}"]))[0]
    assert match is not None and item.id in match.item_ids
    assert len(match.ngram.split()) == 9 and match.ngram in " ".join(words(item.text))


def test_ngrams_do_not_span_two_prompts(index: NgramIndex, items: list[BenchmarkItem]) -> None:
    ws = words(items[0].text)[:9]
    # The 9 words split across two neighbouring prompts of one batch must not match.
    first, second = " ".join(ws[:5]) + " alpha beta gamma delta", " ".join(ws[5:])
    assert index.match_batch(normalize_batch([first, second])) == [None, None]


def test_short_prompts_match_only_inside_a_benchmark_text(index: NgramIndex, items: list[BenchmarkItem]) -> None:
    inside = words(items[3].text)[2:7]
    match = index.match_short(inside)
    assert match is not None and items[3].id in match.item_ids
    assert index.match_short(["zebra", "quantum", "teapot"]) is None
    # Word boundaries: a benchmark word matches, its prefix (not itself a word of any item) does not.
    every_word = {w for item in items for w in words(item.text)}
    word = next(w for w in words(items[3].text) if len(w) >= 4 and w[:-1] not in every_word)
    assert index.match_short([word]) is not None
    assert index.match_short([word[:-1]]) is None


def test_agrees_with_the_straightforward_baseline(index: NgramIndex, items: list[BenchmarkItem]) -> None:
    rng = random.Random(3)
    bench_ngrams = set(index._ngrams)
    prompts = [row["problem"] for row in math_items(200, rng)]
    for item in rng.sample(items, 20):
        prompts.append(rng.choice(list(_variants(item.text).values())))
    ours = [m is not None for m in index.match_batch(normalize_batch(prompts))]
    theirs = [baseline_contaminated(p, bench_ngrams) for p in prompts]
    assert ours == theirs
    assert sum(ours) >= 15


def test_ngram_size_is_configurable(items: list[BenchmarkItem]) -> None:
    index13 = NgramIndex(items[:3], n=13)
    text = " ".join(words(items[0].text)[:12])
    assert index13.match_batch(normalize_batch([text])) == [None]
    assert NgramIndex(items[:3], n=5).match_batch(normalize_batch([text]))[0] is not None


def test_empty_prompts_anywhere_in_a_batch(index: NgramIndex, items: list[BenchmarkItem]) -> None:
    batch = ["", items[0].text, "", "!!!", items[1].text, "", ""]
    matches = index.match_batch(normalize_batch(batch))
    assert [m is not None for m in matches] == [False, True, False, False, True, False, False]
    assert items[0].id in matches[1].item_ids and items[1].id in matches[4].item_ids


# --- invisible characters: Unicode's default-ignorable code points -------------------------------------------

def test_default_ignorable_set_follows_its_definition() -> None:
    import sys
    import unicodedata

    from klear.curate import matching

    assert len(matching.DEFAULT_IGNORABLE) == 4174
    # The Cf part, against Python's own database (older than the ranges: characters it lacks are unassigned there).
    listed = matching._code_points(matching._FORMAT_CHARACTERS)
    format_chars = {c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"}
    assert format_chars <= listed
    assert all(unicodedata.category(chr(c)) in ("Cf", "Cn") for c in listed)
    exceptions = matching._code_points(matching._VISIBLE_FORMAT_CHARACTERS)
    assert format_chars - exceptions <= matching.DEFAULT_IGNORABLE and not exceptions & matching.DEFAULT_IGNORABLE
    # The whole property, against the `regex` module's Unicode tables when it is installed.
    regex = pytest.importorskip("regex")
    prop = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    expected = {c for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF and prop.match(chr(c))}
    assert matching.DEFAULT_IGNORABLE == expected


def test_invisible_characters_inside_every_word_do_not_hide_a_copy(index: NgramIndex, items: list[BenchmarkItem]) -> None:
    import re

    from klear.curate.matching import DEFAULT_IGNORABLE

    item = next(i for i in items if i.benchmark == "aime24")
    # c=chr(c) binds each loop's character into its lambda.
    texts = [re.sub(r"(\w)(?=\w)", lambda m, c=chr(c): m.group(1) + c, item.text)  # noqa: B008
             for c in sorted(DEFAULT_IGNORABLE)]
    pairs = len(re.findall(r"\w(?=\w)", item.text))  # the character sits between any two letters or digits
    assert texts[0].count(chr(min(DEFAULT_IGNORABLE))) == pairs > 100
    lists = normalize_batch(texts)
    clean = words(item.text)
    differing = [hex(c) for c, ws in zip(sorted(DEFAULT_IGNORABLE), lists.to_pylist()) if ws != clean]
    assert not differing, f"{len(differing)} invisible characters change the words, e.g. {differing[:5]}"
    missed = [hex(c) for c, m in zip(sorted(DEFAULT_IGNORABLE), index.match_batch(lists))
              if m is None or item.id not in m.item_ids]
    assert not missed, f"{len(missed)} invisible characters hide the copy, e.g. {missed[:5]}"
    # The same through the single-text path and the dedup key.
    assert all(dedup_key(normalize(t)) == dedup_key(normalize(item.text)) for t in texts[::97])


# --- the packed path (pack_normalized + match_packed), which the stage runs, against the word-list path ----------

def _word_list_path(index: NgramIndex, texts: list[str]) -> list[Match | None]:
    """What the stage used to compute: match_batch on the word lists, match_short for texts under n words."""
    lists = normalize_batch(texts).to_pylist()
    matches = index.match_batch(normalize_batch(texts))
    return [index.match_short(ws) if len(ws) < index.n else m for ws, m in zip(lists, matches)]


def _mixed_texts(items: list[BenchmarkItem], rng: random.Random) -> list[str]:
    """Random texts of every kind of character, reworded benchmark problems (some hidden in other text, some cut
    under 9 words), blank ones, and one problem with an invisible character inside every word, shuffled."""
    alphabet = "abcXYZ019 _-$\\{}()[].,;:!?\t\n éÉßΣσ１２ﬁ—…√∑π∞\u00ad\u200b"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(500)]
    vocabulary = sorted({w for item in items for w in words(item.text)})
    for item in rng.sample(items, 30):
        texts += list(_variants(item.text).values())
        texts.append(" ".join(rng.choice(vocabulary) for _ in range(60)) + " " + item.text)
        texts.append(" ".join(words(item.text)[3:3 + rng.randint(1, 8)]))
    texts.append("\u2060".join(items[0].text))
    texts += ["", " ", "$$", "\n"]
    rng.shuffle(texts)
    return texts


def test_packed_batches_give_the_word_list_path_s_words_keys_and_matches(
    index: NgramIndex, items: list[BenchmarkItem]
) -> None:
    rng = random.Random(11)
    texts = _mixed_texts(items, rng)
    packed = pack_normalized(texts)
    assert [packed.text(i).decode() for i in range(len(texts))] == [normalize(t) for t in texts]
    assert packed.word_counts().tolist() == [len(words(t)) for t in texts]
    expected = _word_list_path(index, texts)
    assert index.match_packed(packed) == expected
    assert sum(m is not None for m in expected) >= 150
    # Any batch boundary: matches never run from one text into the next.
    for size in (1, 7, 64):
        got = [m for start in range(0, len(texts), size) for m in index.match_packed(pack_normalized(texts[start:start + size]))]
        assert got == expected, size


def test_packed_batches_catch_every_invisible_character_inside_every_word(
    index: NgramIndex, items: list[BenchmarkItem]
) -> None:
    import re

    from klear.curate.matching import DEFAULT_IGNORABLE

    item = next(i for i in items if i.benchmark.startswith("hmmt"))
    texts = [re.sub(r"(\w)(?=\w)", lambda m, c=chr(c): m.group(1) + c, item.text)  # noqa: B008
             for c in sorted(DEFAULT_IGNORABLE)]
    packed = pack_normalized(texts)
    clean = normalize(item.text).encode()
    assert all(packed.text(i) == clean for i in range(len(texts)))
    missed = [hex(c) for c, m in zip(sorted(DEFAULT_IGNORABLE), index.match_packed(packed))
              if m is None or item.id not in m.item_ids]
    assert not missed, f"{len(missed)} invisible characters hide the copy, e.g. {missed[:5]}"


def test_packed_batches_of_nothing_but_blank_texts(index: NgramIndex) -> None:
    for texts in ([], [""], ["", "  ", "!?"]):
        packed = pack_normalized(texts)
        assert packed.word_counts().tolist() == [0] * len(texts)
        assert [packed.text(i) for i in range(len(texts))] == [b""] * len(texts)
        assert index.match_packed(packed) == [None] * len(texts)
