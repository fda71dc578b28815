"""The command line: repeated flags add up, the API key never leaves the Authorization header, errors are plain."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from klear.cli import build_parser
from tests.sample.conftest import write_prompts
from tests.sample.fake_server import FakeServer


def test_repeated_prompts_flags_add_up() -> None:
    argv = ["sample", "--prompts", "a.jsonl", "--prompts", "b.jsonl", "c.jsonl", "--output", "o", "--set", "n=2",
            "--set", "seed=3"]
    args = build_parser(argv).parse_args(argv)
    assert args.prompts == ["a.jsonl", "b.jsonl", "c.jsonl"] and args.overrides == ["n=2", "seed=3"]


def _files(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots if root.exists() for p in root.rglob("*") if p.is_file()}


def test_the_api_key_never_appears_in_logs_outputs_or_reports(tmp_path: Path) -> None:
    key = f"sk-klear-{secrets.token_hex(16)}"
    prompts = write_prompts(tmp_path / "p.jsonl", [
        {"id": "a", "prompt": "fine"}, {"id": "b", "prompt": "flaky [[plan:500,429,ok]]"},
        {"id": "c", "prompt": "too long [[plan:400]]"}, {"id": "d", "prompt": "dropped [[plan:drop,ok]]"}])
    out = tmp_path / "out"
    command = [sys.executable, "-m", "klear.cli", "-v", "sample", "--prompts", prompts, "--output", str(out),
               "--config", "tiny", "--set", "n=2", "--set", "max_failed_fraction=0.5", "--set", "backoff_initial_s=0.01",
               "--set", "progress_seconds=0.2"]
    with FakeServer(api_key=key, retry_after="0") as server:
        env = {**os.environ, "OPENAI_API_KEY": key}
        result = subprocess.run([*command, "--endpoint", server.url, "--served-model", "fake-teacher"], env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        assert server.auth_seen and all(seen == f"Bearer {key}" for seen in server.auth_seen)  # the key was used
        # A wrong key: refused by name, and the wrong key is not echoed either.
        wrong = f"sk-wrong-{secrets.token_hex(16)}"
        refused = subprocess.run([*command, "--endpoint", server.url, "--served-model", "fake-teacher", "--set",
                                  "api_key_env=TEACHER_KEY"], env={**env, "TEACHER_KEY": wrong}, capture_output=True,
                                 text=True, timeout=120)
    assert refused.returncode == 2 and "refused the API key from $TEACHER_KEY (401)" in refused.stderr
    assert "DEBUG" in result.stderr and "progress:" in result.stderr  # verbose logging was on
    texts = {"stdout": result.stdout.encode(), "stderr": result.stderr.encode(), "refused": refused.stderr.encode(),
             **_files(out, tmp_path / "out.work")}
    assert str(out / "report.json") in texts and str(out / "failed" / "part-00000.parquet") in texts
    leaked = [name for name, data in texts.items() if key.encode() in data or wrong.encode() in data]
    assert not leaked, f"the API key appears in {leaked}"
    assert b'"api_key_set": true' in texts[str(out / "report.json")]


def test_errors_are_reported_plainly_on_the_command_line(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "q"}])
    result = subprocess.run([sys.executable, "-m", "klear.cli", "sample", "--prompts", prompts, "--output",
                             str(tmp_path / "o"), "--config", "tiny", "--set", "top_p=1.5"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "klear sample: error: SampleConfig from preset 'tiny'" in result.stderr
    assert "top_p: Input should be less than or equal to 1" in result.stderr
    result = subprocess.run([sys.executable, "-m", "klear.cli", "sample", "--prompts", prompts, "--output",
                             str(tmp_path / "o"), "--config", "tiny"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "nothing to sample from: give --model URI or --endpoint URL" in result.stderr
