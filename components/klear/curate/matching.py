"""Text normalization, exact-duplicate keys and word n-gram contamination matching.

Normalization (used for both dedup and decontamination):
  0. default-ignorable characters (soft hyphen, zero-width space and joiners, bidi controls, variation
     selectors, tags, Hangul fillers, ...) are deleted: they are invisible, so a copy with one inside
     every word reads the same, and they must not split (or, for fillers, lengthen) words;
  1. Unicode NFKC (full-width digits, ligatures, superscripts fold to plain forms);
  2. lowercase;
  3. every run of characters that is not a letter or a digit -- punctuation, math delimiters
     (`$`, `\\(`, `\\[`), LaTeX backslashes and braces, symbols, whitespace -- becomes one space.
Matching then runs on the resulting word sequence, so reformatted copies of a problem (case,
spacing, punctuation, `$` removed) still share their word n-grams with the original.

Speed: a batch is normalized with a byte-translation fast path for ASCII text into one buffer
(`pack_normalized`: runs of spaces folded by numpy, every word's place found by numpy), its words
looked up in the benchmark vocabulary by Arrow's C++ hash kernel straight from that buffer (words become
Python objects only in hash hits and prompts under n words), and its n-grams hashed with numpy. Any n-gram containing a word absent from
every benchmark cannot match, so only the rest are hashed and looked up; each hash hit is confirmed on
the actual words, so a hash collision can never remove a prompt. Dedup keys hash each text's slice of
the same buffer. (`normalize_batch` and `match_batch`, the word-list path, give the same matches.)
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from klear.curate.arrays import bool_array, int64_array, text_array

__all__ = [
    "BenchmarkItem",
    "Match",
    "NgramIndex",
    "PackedTexts",
    "dedup_key",
    "normalize",
    "normalize_batch",
    "pack_normalized",
    "words",
]

_NOT_WORD = re.compile(r"[\W_]+")  # \w is letters and digits (any script) plus "_", which we fold too

# Unicode's Default_Ignorable_Code_Point, which Python's unicodedata lacks, built from its definition in
# DerivedCoreProperties.txt (Unicode 15.1 and 16.0, https://www.unicode.org/reports/tr44/#Default_Ignorable_Code_Point):
#     Other_Default_Ignorable_Code_Point + Cf + Variation_Selector
#     - White_Space - FFF9..FFFB - 13430..1343F - Prepended_Concatenation_Mark
# (no Cf character is White_Space since U+180E left it in Unicode 6.3). 4,174 code points. Ranges are inclusive.
_OTHER_DEFAULT_IGNORABLE = (  # PropList.txt: fillers, invisible vowels, the combining grapheme joiner, reserved blocks
    (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x2065, 0x2065), (0x3164, 0x3164), (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8), (0xE0000, 0xE0000), (0xE0002, 0xE001F), (0xE0080, 0xE00FF), (0xE01F0, 0xE0FFF),
)
_FORMAT_CHARACTERS = (  # General_Category=Cf (DerivedGeneralCategory.txt, Unicode 15.1): 170 code points
    (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891),
    (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F),
    (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)
_VARIATION_SELECTORS = ((0x180B, 0x180D), (0x180F, 0x180F), (0xFE00, 0xFE0F), (0xE0100, 0xE01EF))  # PropList.txt
_VISIBLE_FORMAT_CHARACTERS = (  # the exceptions: interlinear annotation, Egyptian hieroglyph format controls, and
    (0xFFF9, 0xFFFB), (0x13430, 0x1343F),  # Prepended_Concatenation_Mark (PropList.txt), which are visible
    (0x0600, 0x0605), (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
)


def _code_points(ranges: Sequence[tuple[int, int]]) -> set[int]:
    return {c for first, last in ranges for c in range(first, last + 1)}


DEFAULT_IGNORABLE = frozenset(
    (_code_points(_OTHER_DEFAULT_IGNORABLE) | _code_points(_FORMAT_CHARACTERS) | _code_points(_VARIATION_SELECTORS))
    - _code_points(_VISIBLE_FORMAT_CHARACTERS)
)


def _character_class(code_points: frozenset[int]) -> str:
    """A regex character class matching exactly `code_points`, as ranges."""
    ranges: list[list[int]] = []
    for c in sorted(code_points):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return "[" + "".join(re.escape(chr(a)) + (f"-{re.escape(chr(b))}" if b > a else "") for a, b in ranges) + "]"


# A regex rather than str.translate, which looks each character up in a dict: on 1,600-character non-ASCII
# prompts the regex costs ~10-20 us (about a fifth of the rest of the non-ASCII path), translate ~80 us. One
# character per match: sre then scans for the class's first character fast, which `[...]+` defeats.
_IGNORABLE = re.compile(_character_class(DEFAULT_IGNORABLE))
_ASCII_TABLE = bytes(c if chr(c).isalnum() and c < 128 else 32 for c in range(256)).lower()


def _normalize_bytes(text: str) -> bytes:
    if text.isascii():
        # Same result as the general path for ASCII (NFKC is the identity there), ~20x faster.
        return text.encode().translate(_ASCII_TABLE).strip()
    # Ignorables go before NFKC: one between a letter and its accent (U+034F) would block their composition.
    return _NOT_WORD.sub(" ", unicodedata.normalize("NFKC", _IGNORABLE.sub("", text)).lower()).strip().encode()


def normalize(text: str) -> str:
    """The normalized form of one text: words separated by single spaces."""
    return " ".join(_normalize_bytes(text).decode().split())


def words(text: str) -> list[str]:
    return _normalize_bytes(text).decode().split()


def normalize_batch(texts: Sequence[str]) -> pa.ListArray:
    """Word lists of many texts at once (a list<string> Arrow array, one entry per text)."""
    # The bytes are UTF-8 by construction (ASCII, or encoded from str): view them as text unvalidated.
    folded = text_array([_normalize_bytes(t) for t in texts], pa.large_string())
    # Only single ASCII spaces remain between words and none at the ends, so this split is exact,
    # except that Arrow splits "" into [""]: such (rare) lists are rebuilt empty.
    lists = pc.ascii_split_whitespace(folded)
    blank = pc.equal(pc.binary_length(folded), 0).to_numpy(zero_copy_only=False)
    if not blank.any():
        return lists
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(lists).filter(bool_array(np.repeat(~blank, lengths)))
    offsets = np.concatenate(([0], np.cumsum(np.where(blank, 0, lengths))))
    return type(lists).from_arrays(int64_array(offsets).cast(lists.offsets.type), values)


def _values_or_minus_one(positions: pa.Int32Array) -> np.ndarray:
    """An int32 Arrow array's values with -1 where it is null, read from its buffers (fill_null costs a copy more)."""
    validity, values = positions.buffers()[:2]
    out = np.frombuffer(values, dtype=np.int32, count=positions.offset + len(positions))[positions.offset :]
    if validity is None or positions.null_count == 0:
        return out
    bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
    return np.where(bits[positions.offset : positions.offset + len(positions)].view(bool), out, -1)


@dataclass(frozen=True)
class PackedTexts:
    """The normalized forms of a batch of texts in one buffer: words separated by one space, texts by one newline
    (normalization leaves neither a newline nor a run of spaces inside a text), a newline at the very end, and
    where every text and word lies in it. Words of the whole batch are numbered in order."""

    data: bytes
    text_starts: np.ndarray  # int64 byte offsets; an empty text has start == end
    text_ends: np.ndarray
    word_starts: np.ndarray  # int64 byte offset of every word; each word ends one byte before the next starts
    first_word: np.ndarray  # int64, len(texts) + 1: text i's words are first_word[i]:first_word[i + 1]

    def __len__(self) -> int:
        return len(self.text_starts)

    def word_counts(self) -> np.ndarray:
        return np.diff(self.first_word)

    def text(self, i: int) -> bytes:
        """Text i's normalized form, UTF-8: its words joined by single spaces."""
        return self.data[self.text_starts[i] : self.text_ends[i]]

    def spans(self, first_words: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Byte ranges (starts, ends) of the runs of `count` words beginning at word numbers `first_words`."""
        ends = np.append(self.word_starts, len(self.data))[first_words + count] - 1
        return self.word_starts[first_words], ends


def pack_normalized(texts: Sequence[str], encoded: Sequence[bytes] | None = None) -> PackedTexts:
    """Normalize a batch of texts into one buffer (see PackedTexts): same words as `words` gives for each text.
    `encoded`: the texts as UTF-8, when the caller has them already (a text is ASCII when it has as many bytes)."""
    if encoded is None:
        encoded = [t.encode() for t in texts]
    table = _ASCII_TABLE
    parts = [e.translate(table).strip() if len(e) == len(t) else _normalize_bytes(t) for t, e in zip(texts, encoded)]
    filled = [i for i, part in enumerate(parts) if part]
    if not filled:
        none = np.zeros(len(parts), dtype=np.int64)
        return PackedTexts(b"", none, none, np.zeros(0, dtype=np.int64), np.zeros(len(parts) + 1, dtype=np.int64))
    raw = np.frombuffer(b"\n".join([parts[i] for i in filled]) + b"\n", dtype=np.uint8)
    # Only the ASCII path leaves runs of spaces (one per character it folded): keep the first of each run.
    space = raw == 32
    keep = np.empty(len(raw), dtype=bool)
    keep[0] = True
    np.logical_and(space[1:], space[:-1], out=keep[1:])
    np.logical_not(keep[1:], out=keep[1:])
    packed = raw[keep]
    # Bytes left: newline (10), space (32), and the UTF-8 of letters and digits (from 48 up).
    separator = packed <= 32
    # The first byte begins the first non-empty text's first word; every other word begins after a separator.
    word_starts = np.flatnonzero(separator[:-1] > separator[1:])
    word_starts += 1
    word_starts = np.concatenate(([0], word_starts))
    breaks = np.flatnonzero(packed == 10)  # one after each non-empty text
    text_starts = np.zeros(len(parts), dtype=np.int64)
    text_ends = np.zeros(len(parts), dtype=np.int64)
    filled_at = np.array(filled, dtype=np.int64)
    text_ends[filled_at] = breaks
    text_starts[filled_at] = np.concatenate(([0], breaks[:-1] + 1))
    counts = np.zeros(len(parts), dtype=np.int64)
    counts[filled_at] = np.diff(np.searchsorted(word_starts, np.concatenate((text_starts[filled_at], [len(packed)]))))
    first_word = np.concatenate(([0], np.cumsum(counts)))
    return PackedTexts(packed.tobytes(), text_starts, text_ends, word_starts, first_word)


def dedup_key(normalized: str | bytes | memoryview) -> bytes:
    """A 16-byte key of a normalized text (words joined by single spaces): equal texts, equal keys."""
    data = normalized.encode() if isinstance(normalized, str) else normalized
    return xxhash.xxh3_128_digest(data)


@dataclass(frozen=True)
class BenchmarkItem:
    id: str
    benchmark: str
    text: str


@dataclass(frozen=True)
class Match:
    """Why a prompt is contaminated: the benchmark items it overlaps and the first shared n-gram."""

    item_ids: tuple[str, ...]
    ngram: str


# Odd 64-bit multipliers, one per n-gram position: hash(w_0..w_{n-1}) = sum_k id(w_k) * M_k mod 2^64.
_MULTIPLIERS = np.random.default_rng(0x9E3779B9).integers(1, 2**63, size=64, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


class NgramIndex:
    """The word n-grams of a set of benchmark items, for fast contamination checks of prompt batches."""

    def __init__(self, items: Sequence[BenchmarkItem], n: int = 9) -> None:
        if not 1 <= n <= len(_MULTIPLIERS):
            raise ValueError(f"ngram_size must be between 1 and {len(_MULTIPLIERS)}, got {n}")
        self.n = n
        self.items = list(items)
        self.item_words = [words(item.text) for item in self.items]
        vocabulary = sorted({w for ws in self.item_words for w in ws})
        self._vocab = text_array(vocabulary, pa.large_string())
        # A packed word is looked up with the separator after it (space or newline): each vocabulary word twice.
        encoded = [w.encode() for w in vocabulary]
        self._vocab_separated = text_array([w + b" " for w in encoded] + [w + b"\n" for w in encoded], pa.large_binary())
        # Position in _vocab_separated -> word id; position -1 (not found) -> the last entry, 0.
        self._separated_ids = np.concatenate((np.tile(np.arange(1, len(vocabulary) + 1, dtype=np.uint64), 2),
                                              np.zeros(1, dtype=np.uint64)))
        # Word ids start at 1: 0 marks a word no benchmark contains.
        self._ngrams: dict[tuple[str, ...], list[str]] = {}
        for item, ws in zip(self.items, self.item_words):
            for start in range(len(ws) - n + 1):
                owners = self._ngrams.setdefault(tuple(ws[start : start + n]), [])
                if item.id not in owners:
                    owners.append(item.id)
        hashes = [self._hash_windows(ids, np.arange(len(ids) - n + 1)) for ids in map(self._ids_of, self.item_words)
                  if len(ids) >= n]
        self._hashes = np.unique(np.concatenate(hashes)) if hashes else np.zeros(0, dtype=np.uint64)
        # The same n-grams as UTF-8 text, words joined by single spaces: a packed batch's n-gram is a slice of it.
        self._ngram_bytes = {" ".join(gram).encode(): gram for gram in self._ngrams}
        # Short prompts are matched as substrings of the benchmark texts, on word boundaries.
        self._joined = "\n".join(f" {' '.join(ws)} " for ws in self.item_words)
        self._line_starts = np.cumsum([0] + [len(" ".join(ws)) + 3 for ws in self.item_words])

    @property
    def ngram_count(self) -> int:
        return len(self._ngrams)

    def _ids_of(self, flat_words: pa.Array | list[str]) -> np.ndarray:
        words_array = flat_words if isinstance(flat_words, pa.Array) else text_array(flat_words, pa.large_string())
        positions = pc.index_in(words_array, value_set=self._vocab)
        # Unknown words (null) become 0, benchmark words 1..V.
        return (_values_or_minus_one(positions) + 1).astype(np.uint64)

    def _hash_windows(self, ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Hashes of the windows of n consecutive ids beginning at `starts`."""
        acc = ids[starts] * _MULTIPLIERS[0]
        for k in range(1, self.n):
            acc += ids[starts + k] * _MULTIPLIERS[k]
        return acc

    def _valid_starts(self, ids: np.ndarray, prompt_starts: np.ndarray | None = None) -> np.ndarray:
        """Starts of the windows whose n words are all benchmark words (id > 0) of one prompt."""
        count = len(ids) - self.n + 1
        if count <= 0:
            return np.zeros(0, dtype=np.int64)
        known = ids != 0
        # A window may begin at a prompt's first word, but no later word of it may be one.
        continues = known.copy()
        if prompt_starts is not None:
            continues[prompt_starts[prompt_starts < len(ids)]] = False  # empty trailing prompts start at the end
        ok = known[:count].copy()
        for k in range(1, self.n):
            ok &= continues[k : k + count]
        return np.flatnonzero(ok)

    def match_batch(self, word_lists: pa.ListArray) -> list[Match | None]:
        """For each prompt (its word list), the contamination match or None. Prompts shorter than n: see match_short."""
        results: list[Match | None] = [None] * len(word_lists)
        n = self.n
        if len(word_lists) == 0 or len(self._hashes) == 0:
            return results
        flat = pc.list_flatten(word_lists)
        offsets = word_lists.offsets.to_numpy()
        offsets = offsets - offsets[0]
        ids = self._ids_of(flat)
        starts = self._valid_starts(ids, offsets[1:-1])
        if len(starts) == 0:
            return results
        hashes = self._hash_windows(ids, starts)
        slot = np.minimum(np.searchsorted(self._hashes, hashes), len(self._hashes) - 1)
        hits = starts[self._hashes[slot] == hashes]
        if len(hits) == 0:
            return results
        prompts = np.searchsorted(offsets, hits, side="right") - 1
        for start, prompt in zip(hits.tolist(), prompts.tolist()):
            self._merge(results, prompt, tuple(flat.slice(start, n).to_pylist()))
        return results

    def match_packed(self, packed: PackedTexts) -> list[Match | None]:
        """For each text of a packed batch, the contamination match or None; texts shorter than n words are
        matched as in match_short. Same matches as match_batch (and match_short) on the texts' word lists."""
        results: list[Match | None] = [None] * len(packed)
        n = self.n
        counts = packed.word_counts()
        if len(packed.word_starts) and len(self._hashes):
            # Each word with the one separator byte after it: word i is data[word_starts[i]:word_starts[i + 1]].
            offsets = np.concatenate((packed.word_starts, [len(packed.data)]))
            separated = pa.LargeBinaryArray.from_buffers(
                pa.large_binary(), len(packed.word_starts),
                [None, pa.py_buffer(offsets), pa.py_buffer(packed.data)],
            )
            positions = pc.index_in(separated, value_set=self._vocab_separated)
            ids = self._separated_ids[_values_or_minus_one(positions)]
            starts = self._valid_starts(ids, packed.first_word[1:-1])
            if len(starts):
                hashes = self._hash_windows(ids, starts)
                slot = np.minimum(np.searchsorted(self._hashes, hashes), len(self._hashes) - 1)
                hits = starts[self._hashes[slot] == hashes]
                texts = np.searchsorted(packed.first_word, hits, side="right") - 1
                first_bytes, end_bytes = packed.spans(hits, n)
                data = packed.data
                for a, b, text in zip(first_bytes.tolist(), end_bytes.tolist(), texts.tolist()):
                    gram = self._ngram_bytes.get(data[a:b])  # confirms the hash hit on the words themselves
                    if gram is not None:
                        self._merge(results, text, gram)
        for text in np.flatnonzero((counts > 0) & (counts < n)).tolist():
            results[text] = self.match_short(packed.text(text).decode().split(" "))
        return results

    def _merge(self, results: list[Match | None], prompt: int, gram: tuple[str, ...]) -> None:
        """Add n-gram `gram` of prompt `prompt`, a hash hit, to its match once confirmed on the words themselves."""
        owners = self._ngrams.get(gram)
        if owners is None:
            return
        previous = results[prompt]
        if previous is None:
            results[prompt] = Match(tuple(owners), " ".join(gram))
        else:
            merged = previous.item_ids + tuple(o for o in owners if o not in previous.item_ids)
            results[prompt] = Match(merged, previous.ngram)

    def match_short(self, prompt_words: Sequence[str]) -> Match | None:
        """A prompt shorter than n words matches if its whole normalized text occurs inside a benchmark item."""
        if not prompt_words:
            return None
        needle = f" {' '.join(prompt_words)} "
        owners: list[str] = []
        position = self._joined.find(needle)
        while position != -1:
            line = int(np.searchsorted(self._line_starts, position, side="right") - 1)
            item_id = self.items[line].id
            if item_id not in owners:
                owners.append(item_id)
            position = self._joined.find(needle, position + 1)
        return Match(tuple(owners), needle.strip()) if owners else None


def baseline_contaminated(prompt: str, benchmark_ngrams: set[tuple[str, ...]], n: int = 9) -> bool:
    """The straightforward check common open-source scripts do: a per-prompt set of n-gram tuples,
    intersected with the benchmark's. Kept as the reference the benchmark compares against."""
    ws = _NOT_WORD.sub(" ", unicodedata.normalize("NFKC", prompt).lower()).split()
    return bool(set(zip(*(ws[i:] for i in range(n)))) & benchmark_ngrams)
