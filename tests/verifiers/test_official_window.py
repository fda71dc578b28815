"""Official math judging reads a tail window of long responses (parse_official): its result must be math-verify's
`parse` over the whole response, answer and string alike, on every response; hand-made responses for each
place where a window could go wrong, and generated ones that mix them."""

from __future__ import annotations

import random

import pytest
from math_verify import parse
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, get_extraction_regexes

from klear.verifiers.math_verifier import judge_official, official_window_start, parse_official

FAR = " and then, to be sure, every case was counted again from the start without a single change"
LONG = "Let us count the cases one by one, 12 of them, then 7 more, $x^2 + y^2 = 25$ and \\(a_3 = 9\\).\n" * 40

# (name, response, windowed: whether a window is tried; with no anchored answer in it the whole response is parsed)
HAND_MADE = [
    ("plain", LONG + "</think>\n\nSo the answer is $\\boxed{73}$.", True),
    ("box_in_thought_then_answer", LONG + "Maybe \\boxed{74}.\n" + LONG + "</think>\n\nSo $\\boxed{73}$.", True),
    ("two_boxes_close", LONG + "</think>\n\n\\boxed{73}, or rather \\boxed{74}.", True),
    ("two_boxes_and", LONG + "</think>\n\nThe roots are $\\boxed{2}$ and $\\boxed{3}$.", True),
    ("nested_braces", LONG + "</think>\n\n$\\boxed{\\frac{\\sqrt{3}}{2}}$", True),
    ("fbox_and_boxed", LONG + "\\fbox{5}\n</think>\n\\boxed{6}", True),
    ("boxed_no_brace", LONG + "</think>\n\nThe answer is \\boxed 7.", True),
    ("display_bracket_answer", LONG + "</think>\n\\[\n\\boxed{\\dfrac{1}{4}}\n\\]\n", True),
    ("display_dollars_answer", LONG + "</think>\n$$\\boxed{12}$$", True),
    ("display_dollars_in_thought", "$$x = 1$$\n" + LONG + "</think>\n$\\boxed{12}$", False),
    # a display opened in the thought runs to the end, and math-verify joins all its boxes ("3,4"), not the last
    ("open_display_dollars_in_thought", "$$ x = 1\n" + LONG + "\\boxed{3}" + FAR + "\\boxed{4}\n$$", False),
    ("open_display_bracket_in_thought", "\\[ x = 1\n" + LONG + "\\boxed{3}" + FAR + "\\boxed{4}\n\\]\n", False),
    ("closed_display_bracket_in_thought", "\\[ x = 1 \\]\n" + LONG + "</think>\n$\\boxed{3}$", True),
    ("inline_bracket_at_line_start", LONG + "[\\boxed{4}]\nthen\n[ \\boxed{5} ] \n", True),
    # "\n[...] " is a delimited answer only with the newline before it: the window starts a line earlier
    ("bracket_answer_at_line_start", LONG + "[\\boxed{4}" + FAR + "\\boxed{5}] \n", True),
    ("latex_after_last_box", LONG + "</think>\n\\boxed{8}\nCheck: $8 = 2^3$ and \\(\\frac{16}{2}\\).", True),
    ("final_answer_phrase", LONG + "</think>\nThe final answer is $\\boxed{9}$. I hope it is correct.", True),
    ("final_answer_in_thought", "My final answer is 12.\n" + LONG + "</think>\n\\boxed{10}", False),
    # "final answer ... is $7$" spans lines and ends after the box: math-verify takes 7
    ("final_answer_line_before_box", LONG + "So my final answer\n\\boxed{5} and the count is $7$.", True),
    ("final_answer_unicode_case", "FİNAL ANSWER is 4 \u00e9\n" + LONG + "\\boxed{10}", False),
    ("truncated_right_box", LONG + "So the count is $\\boxed{73}$, but let me double-check the", True),
    ("truncated_inside_box", LONG + "So \\boxed{73}, no \\boxed{7", True),
    ("no_box_final_number", LONG + "</think>\n\nThe answer is 73.", True),
    ("no_box_number_then_other", LONG + "</think>\n\n73 is it. We checked 4 cases.", True),
    ("empty_box", LONG + "</think>\n\\boxed{}", True),
    ("backslash_before_newline", LONG + "x \\\n$\\boxed{11}$", True),
    ("digit_before_dollar", LONG + "2$\\boxed{13}$ and 3$\\boxed{14}$", True),
    ("percent", LONG + "</think>\nThe rate is $\\boxed{15}$\n%", True),
    ("answer_word_then_box", LONG + "Answer: 16\n\\boxed{17}", True),
]


def _same(a: list, b: list) -> bool:
    return [(type(x).__name__, str(x)) for x in a] == [(type(x).__name__, str(x)) for x in b]


@pytest.mark.parametrize("name,response,windowed", HAND_MADE, ids=[c[0] for c in HAND_MADE])
def test_window_gives_what_math_verify_gives_on_the_whole_response(name: str, response: str, windowed: bool) -> None:
    assert _same(parse_official(response, 5), parse(response, parsing_timeout=5)), name
    assert (official_window_start(response) > 0) == windowed


def test_window_starts_after_the_thought_when_boxes_are_at_the_end() -> None:
    response = LONG + "</think>\n\nSo the answer is $\\boxed{73}$."
    start = official_window_start(response)
    assert response[start:] == "So the answer is $\\boxed{73}$."
    assert judge_official("73", response, 5) == (True, "73")


# Pieces of generated responses: the delimiters, anchors and numbers math-verify's patterns look for.
PIECES = ["Consider the sum", " of both terms", " 12", " -3.5", " 1,234", " 40%", "$x^2$", "$\\frac{1}{2}$", " \\(y\\)",
          "\\[ z = 4 \\]", "\\[\n w \n\\]", "$$ 5 $$", "$$", "\\[", "\\]", " [ 6 ] ", "[", "]", "\\boxed{7}", "\\boxed{-8}",
          "\\boxed{\\frac{3}{4}}", "\\boxed{a, b}", "\\boxed 9", "\\fbox{10}", "\\boxed{", "}", "{", " and ", " or ", ", ",
          "final answer is ", "Final Answer: ", "the answer is ", "answer: ", " I hope", "\\", "2", "=", " = 11", "\n", "\n",
          "\n", "\n\n", "</think>\n", " percent", "é", "FİNAL answer is "]


def _generated(rng: random.Random) -> str:
    parts = [rng.choice(PIECES) for _ in range(rng.randint(5, 60))]
    text = "".join(parts)
    if rng.random() < 0.5:  # most judged responses end with their answer
        text += rng.choice(["\nSo $\\boxed{42}$.", "\n\\boxed{42}", "\nThe answer is 42.", "\n\\[\\boxed{\\frac{4}{2}}\\]"])
    if rng.random() < 0.2:  # truncated at max tokens
        text = text[: rng.randint(1, len(text))]
    return text


def test_window_matches_math_verify_on_generated_responses() -> None:
    rng = random.Random(25)
    windowed = 0
    for i in range(1500):
        response = _generated(rng)
        fast, whole = parse_official(response, 5), parse(response, parsing_timeout=5)
        assert _same(fast, whole), f"response {i}: {response!r}: window {fast} vs whole {whole}"
        windowed += official_window_start(response) > 0
    assert windowed > 300  # the generator exercises the window, not only the fallback


def test_anchored_patterns_are_those_the_window_argument_covers() -> None:
    """official_window_start's argument holds for these patterns (math-verify 0.9); a new one must be re-checked."""
    for regexes, _ in get_extraction_regexes([LatexExtractionConfig(), ExprExtractionConfig()]):
        for regex, priority in regexes:
            if priority <= 50:
                assert regex.pattern.startswith("(?i:final answer") or "\\\\boxed{" in regex.pattern, regex.pattern
