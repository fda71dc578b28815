"""Verifiers shared by rl_filter, gppo and evaluate: math answer checking and sandboxed code execution.

    from klear.verifiers import MathVerifier, CodeVerifier, VerifierConfig
    with MathVerifier(config) as mv:
        results = mv.verify_batch([(response, gold), ...])      # .correct, .extracted, .format_ok
    with CodeVerifier(config) as cv:
        result = cv.verify_response(response, tests, fn_name)   # .pass_fraction, .all_passed, .tests
"""

from klear.verifiers.code_verifier import CodeResult, CodeVerifier, TestCase, compare_stdout, extract_program
from klear.verifiers.config import VerifierConfig
from klear.verifiers.math_verifier import MathResult, MathVerifier, extract_answer, format_ok
from klear.verifiers.sandbox import SandboxPool, SandboxUnavailable

__all__ = [
    "CodeResult", "CodeVerifier", "MathResult", "MathVerifier", "SandboxPool", "SandboxUnavailable", "TestCase",
    "VerifierConfig", "compare_stdout", "extract_answer", "extract_program", "format_ok",
]
