"""The KFP components of judge, sft-data and rl-filter, wired as a small pipeline and run under kfp.local
(the way the full DAG runs on CPU): sample output -> judge (with the settings sft-data hands over) -> sft-data
(judged rows in) and rl-filter."""

# No `from __future__ import annotations`: kfp reads the pipeline's parameter types at run time.

import json
from pathlib import Path

import pytest

from klear.common import storage
from tests.judge.samples import CORRECT, WRONG, boxed, code_record, math_record, publish_samples, sample_row


@pytest.mark.slow
def test_components_under_kfp_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KLEAR_RUN_ID", "r1")  # what the cluster takes from the pod's pipeline/runid label
    from kfp import dsl, local

    from klear.judge.component import judge
    from klear.rl_filter.component import rl_filter
    from klear.sft_data.component import sft_data, sft_data_judge_settings

    rows = [sample_row("m", k, boxed(a), math_record("m", "6")) for k, a in enumerate("667")]
    rows += [sample_row("c", k, CORRECT if k else WRONG, code_record("c", 16)) for k in range(3)]
    samples = publish_samples(rows, str(tmp_path / "samples"))
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps(math_record("m", "6")) + "\n" + json.dumps(code_record("c", 16)) + "\n")

    @dsl.pipeline(name="klear-data-test")
    def data_stages(samples_uri: str, problems_uri: str, run_root: str) -> None:
        imported = dsl.importer(artifact_uri=samples_uri, artifact_class=dsl.Dataset, reimport=False)
        found = dsl.importer(artifact_uri=problems_uri, artifact_class=dsl.Dataset, reimport=False)
        # Judged with the judge settings sft-data hands over, as the recipe's judge step in front of it is.
        settings = sft_data_judge_settings(preset="tiny", overrides=["judge.verifier.math_timeout_s=4"])
        judged = judge(samples=imported.output, settings=settings.output, run_root=run_root)
        sft_data(teacher_samples=judged.outputs["judged"], preset="tiny", overrides=[], run_root=run_root)
        rl_filter(problems=found.output, filter_samples=judged.outputs["judged"], task="", preset="tiny",
                  overrides=["decontaminate=false"], benchmark_uris=[], run_root=run_root)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    data_stages(samples_uri=samples, problems_uri=str(problems), run_root=str(tmp_path / "runs"))
    judged = json.loads(storage.read_bytes(str(tmp_path / "runs/r1/judge/report.json")))
    assert judged["totals"]["samples"] == 6 and judged["totals"]["correct"] == 4
    assert judged["config"]["verifier"]["math_timeout_s"] == 4  # sft-data's judge section, not a judge preset
    sft = json.loads(storage.read_bytes(str(tmp_path / "runs/r1/sft-data/report.json")))
    assert sft["totals"]["kept"] == 6 and sft["per_source"]["mathsrc"]["unknown"] == {"correct": 2, "incorrect": 1}
    rl = json.loads(storage.read_bytes(str(tmp_path / "runs/r1/rl-filter/report.json")))
    assert rl["totals"]["kept"] == 2 and rl["samples_judged"] == 6  # the judged rows passed through, not re-judged
