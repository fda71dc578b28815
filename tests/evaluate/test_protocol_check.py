"""The protocol check sees what was sent, through the real commands: `klear sample` against the tests' own
endpoint, then `klear evaluate` (directly, or after `klear judge`). The recorded settings are the request's
(extra_body included), judged samples keep their sampling settings, and the rows' prompts are compared with
the protocol's template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klear.cli import main
from klear.common import storage
from tests.evaluate.helpers import write_jsonl
from tests.sample.fake_server import FakeServer

EVAL = ["--config", "tiny", "--set", "benchmarks.toy.kind=math", "--set", "benchmarks.toy.k=2", "--set",
        "benchmarks.toy.title=Toy", "--set", "only=[toy]"]
SAMPLE = ["--config", "tiny", "--set", "n=2", "--set", "backoff_initial_s=0.01", "--set", "backoff_max_s=0.05"]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Samples of a two-problem benchmark: with the protocol's prompts (ok), with the bare problem text as the
    prompt (bare), at temperature 1.0 (hot), with top_k 20 sent through extra_body (top_k); and judge outputs."""
    tmp = tmp_path_factory.mktemp("protocol")
    bench = write_jsonl([{"id": f"t{i}", "benchmark": "toy", "problem": f"Compute {i} + {i}.", "answer": str(2 * i)}
                         for i in (1, 2)], tmp / "toy.jsonl")
    assert main(["evaluate-prompts", "--output", str(tmp / "prompts"), "--benchmark", bench, *EVAL]) == 0
    protocol_prompts = str(tmp / "prompts" / "math-k2.jsonl")
    runs = {"ok": (protocol_prompts, []), "bare": (f"{bench}#prompt=problem", []),
            "hot": (protocol_prompts, ["--set", "temperature=1.0"]),
            "top_k": (protocol_prompts, ["--set", "api_flavor=openai", "--set", 'extra_body={"top_k": 20}'])}
    paths = {"bench": bench}
    with FakeServer() as server:
        for name, (prompts, extra) in runs.items():
            paths[name] = str(tmp / f"samples-{name}")
            assert main(["sample", "--prompts", prompts, "--output", paths[name], "--endpoint", server.url,
                         "--served-model", server.served_model, *SAMPLE, *extra]) == 0
    for name in ("ok", "hot"):
        paths[f"judged-{name}"] = str(tmp / f"judged-{name}")
        assert main(["judge", "--samples", paths[name], "--output", paths[f"judged-{name}"], "--problems", bench,
                     "--config", "tiny"]) == 0
    return paths


def _evaluate(sampled: dict[str, str], samples: str, out: Path, *extra: str) -> int:
    return main(["evaluate", "--samples", samples, "--output", str(out), "--benchmark", sampled["bench"], *EVAL,
                 *extra])


def test_samples_taken_as_the_protocol_says_match(sampled: dict[str, str], tmp_path: Path) -> None:
    for name in ("ok", "judged-ok"):
        assert _evaluate(sampled, sampled[name], tmp_path / name) == 0
        source = json.loads((tmp_path / name / "report.json").read_text())["settings"]["samples"]["model"][0]
        assert source["check"] == "matches the protocol", name
        assert source["prompts"]["check"] == "the protocol's prompts (4 scored rows)"
        assert source["sampling"]["temperature"] == 0.6
        assert "| the protocol's prompts (4 scored rows) | matches the protocol |" in \
            (tmp_path / name / "report.md").read_text()


def test_samples_without_the_template_are_refused_or_reported(sampled: dict[str, str], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert _evaluate(sampled, sampled["bare"], tmp_path / "refused") == 2
    error = capsys.readouterr().err
    assert "samples taken with other prompts than the protocol's template" in error
    assert ("prompts: 4 of 4 scored rows were not asked the protocol's prompt (e.g. t1: 'Compute 1 + 1.', where the "
            "protocol asks 'Compute 1 + 1.\\nPlease reason step by step") in error
    assert not storage.exists(str(tmp_path / "refused" / storage.MANIFEST_NAME))
    assert _evaluate(sampled, sampled["bare"], tmp_path / "warned", "--set", "settings_check=warn") == 0
    report = json.loads((tmp_path / "warned" / "report.json").read_text())
    source = report["settings"]["samples"]["model"][0]
    assert source["state"] == "differs" and source["prompts"]["differ"] == 4
    assert any("4 of 4 scored rows were not asked the protocol's prompt" in note for note in report["notes"])


def test_settings_sent_through_extra_body_are_checked(sampled: dict[str, str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert _evaluate(sampled, sampled["top_k"], tmp_path / "out") == 2
    assert "top_k=20 (protocol 0)" in capsys.readouterr().err


def test_judged_samples_keep_their_sampling_settings(sampled: dict[str, str], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    meta = storage.read_manifest(sampled["judged-hot"]).meta
    assert meta["stage"] == "judge" and meta["sample_settings"]["sampling"]["temperature"] == 1.0
    for name in ("hot", "judged-hot"):
        assert _evaluate(sampled, sampled[name], tmp_path / name) == 2
        assert "temperature=1.0 (protocol 0.6)" in capsys.readouterr().err, name
    # A judge of the judge output carries them on too.
    again = str(tmp_path / "judged-twice")
    assert main(["judge", "--samples", sampled["judged-hot"], "--output", again, "--problems", sampled["bench"],
                 "--config", "tiny"]) == 0
    assert storage.read_manifest(again).meta["sample_settings"] == meta["sample_settings"]
