"""What a registration writes, from the published model and its evaluation (klear.register.entries, pure): metric
names MLflow accepts, only changed metrics logged again, the card cut to a version's description, the version's
source, the evaluated label found or refused by name, links without credentials, a summary that renders as text."""

from __future__ import annotations

import json
import sys

import pytest

from klear.common import tracking
from klear.evaluate.metrics import benchmark_scores
from klear.register import entries
from klear.register.entries import PublishedModel, RegisterError
from klear.register.stage import tracking_address
from tests.common.test_markdown import FORGED_STAGE, rendered_markup


def _model(**changes: object) -> PublishedModel:
    values: dict[str, object] = {
        "uri": "s3://runs/r1/gppo-code", "stage": "gppo", "digest": "ab" * 32, "created": "2026-12-06T00:00:00Z",
        "global_step": 40, "card": "# card\n", "card_uri": "s3://runs/r1/gppo-code/README.md",
        "inputs": {"model": ["s3://runs/r1/gppo-math"], "data": ["s3://runs/r1/rl-filter-code"]},
        "lineage": [{"stage": "gppo", "uri": "s3://runs/r1/gppo-math", "digest": "cd" * 32}],
        "base_model": "s3://models/qwen3-8b-base", "run": {"mlflow": "run1", "mlflow_experiment_id": "3"}}
    return PublishedModel(**{**values, **changes})  # type: ignore[arg-type]


def test_evaluation_scores_become_metric_names_mlflow_accepts() -> None:
    from mlflow.utils.validation import _validate_metric_name

    block = {"title": "AIME 2024", **benchmark_scores([8, 4, 1, 0], 8), "truncated": 0.0625, "verdicts": {"wrong": 3}}
    metrics = entries.evaluation_metrics({"aime24": block, "lcb v5@x": {"pass@1": 50, "stderr": None}})
    assert metrics["eval/aime24/pass_at_1"] == pytest.approx(100 * 13 / 32)
    assert metrics["eval/aime24/stderr"] == pytest.approx(block["stderr"])
    assert metrics["eval/aime24/truncated"] == 0.0625
    for k in (2, 4, 8):  # pass@k of every k the block has (pass@1 above)
        assert metrics[f"eval/aime24/pass_at_{k}"] == pytest.approx(block["pass@k"][str(k)])
    assert metrics["eval/lcb v5_at_x/pass_at_1"] == 50.0 and "eval/lcb v5_at_x/stderr" not in metrics  # None: no metric
    for name in metrics:
        _validate_metric_name(name)  # raises on a name the server would refuse
    # Logged again, only what changed goes in: a retried registration adds no duplicate history.
    assert entries.changed_metrics(metrics, metrics) == {}
    assert entries.changed_metrics({**metrics, "eval/aime24/stderr": 0.0}, metrics) == {
        "eval/aime24/stderr": metrics["eval/aime24/stderr"]}


def test_the_card_is_the_description_cut_to_mlflows_limit_naming_the_whole_card() -> None:
    assert entries.version_description("short card", "s3://m/README.md") == "short card"
    long = "x" * 12000
    cut = entries.version_description(long, "s3://m/README.md")
    assert len(cut) <= entries.DESCRIPTION_LIMIT and cut.endswith("the whole card: s3://m/README.md)")
    assert cut.startswith("x" * 4000)


def test_the_source_is_the_published_location_or_the_logged_model_for_a_local_path() -> None:
    assert entries.mlflow_source("s3://runs/r1/sft", "m-1") == "s3://runs/r1/sft"
    assert entries.mlflow_source("gs://b/m", "m-1") == "gs://b/m"
    assert entries.mlflow_source("/data/runs/r1/sft", "m-1") == "models:/m-1"
    assert entries.mlflow_source("file:///data/runs/r1/sft", "m-1") == "models:/m-1"


def test_the_evaluated_label_is_found_through_the_lineage_or_refused_by_name() -> None:
    evaluated = [("s3://r/gppo-code", "rl"), ("s3://r/sft", "sft")]
    assert entries.label_of(evaluated, "s3://r/sft", ["rl", "sft", "base"], "s3://r/evaluate") == "sft"
    with pytest.raises(RegisterError, match=r"s3://r/evaluate did not evaluate s3://r/other .*rl=s3://r/gppo-code.*--label"):
        entries.label_of(evaluated, "s3://r/other", ["rl", "sft", "base"], "s3://r/evaluate")
    with pytest.raises(RegisterError, match="under several labels \\(a, b\\)"):
        entries.label_of([("m", "a"), ("m", "b")], "m", ["a", "b"], "e")


def test_links_carry_no_credentials_and_a_file_store_has_none() -> None:
    uri = "https://trainer:s3cr3t-password@mlflow.example.com:5000/mlflow/?token=abc#x"
    assert tracking.public_address(uri) == "https://mlflow.example.com:5000/mlflow"
    assert tracking.mlflow_run_url(uri, "3", "r1") == "https://mlflow.example.com:5000/mlflow/#/experiments/3/runs/r1"
    assert tracking.mlflow_run_url("file:///tmp/mlruns", "3", "r1") == ""
    assert entries.mlflow_page(uri, "models", "klear reasoner", "versions", "2") == (
        "https://mlflow.example.com:5000/mlflow/#/models/klear%20reasoner/versions/2")
    assert tracking.run_record({"mlflow": "r1", "wandb": "w1"}, "3", uri) == {
        "mlflow": "r1", "wandb": "w1", "mlflow_experiment_id": "3",
        "mlflow_url": "https://mlflow.example.com:5000/mlflow/#/experiments/3/runs/r1"}
    with pytest.raises(RegisterError, match="--tracking-uri holds credentials \\(user:password@, query parameter token\\)") as caught:
        tracking_address(uri, {})
    assert "s3cr3t" not in str(caught.value)
    assert tracking_address(None, {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}) == "http://mlflow:5000"


def test_tags_name_the_model_its_lineage_and_scores() -> None:
    model = _model()
    evaluation = entries.Evaluation("s3://runs/r1/evaluate", "rl", {"aime24": {"pass@1": 12.5, "stderr": 3.25}},
                                    ["report.html"], "evaluate")
    tags = entries.version_tags(model, evaluation)
    assert tags[entries.DIGEST_TAG] == model.digest and tags["klear.uri"] == model.uri
    assert tags["klear.input.model"] == "s3://runs/r1/gppo-math" and tags["klear.base_model"] == model.base_model
    assert json.loads(tags["klear.lineage"]) == model.lineage
    assert tags["klear.mlflow_run"] == "run1" and tags["klear.evaluation.label"] == "rl"
    assert tags["klear.scores"] == "aime24 pass@1 12.5 ± 3.2" and tags["eval/aime24/pass_at_1"] == "12.5"
    assert all(isinstance(value, str) for value in tags.values())
    # A chain too long for a tag keeps its nearest steps and counts the rest.
    chain = [{"stage": "s", "uri": f"s3://runs/r1/step-{i}", "digest": "ef" * 32} for i in range(200)]
    clipped = json.loads(entries.lineage_entries(_model(lineage=chain))["klear.lineage"])
    assert len(json.dumps(clipped, separators=(",", ":"))) <= entries.TAG_LIMIT
    assert clipped[:3] == chain[:3] and clipped[-1] == {"more": 200 - (len(clipped) - 1)}
    assert entries.kubeflow_version(model) == "gppo-" + "ab" * 8
    metadata = entries.kubeflow_metadata(model, evaluation, None)
    assert metadata["eval/aime24/pass_at_1"] == 12.5 and metadata[entries.DIGEST_TAG] == model.digest


def test_names_are_checked_and_the_summary_shows_data_as_text() -> None:
    assert entries.check_name("klear-reasoner_8b.v2") == "klear-reasoner_8b.v2"
    for bad in ("", "it's", "a/b", "-x", "x" * 257):
        with pytest.raises(RegisterError, match="--name"):
            entries.check_name(bad)
    model = _model(uri=f"s3://runs/{FORGED_STAGE}/sft", stage=FORGED_STAGE)
    evaluation = entries.Evaluation("s3://e", "<b>rl</b>", {"[x](http://evil)": {"pass@1": 1.0}}, [], "evaluate")
    mlflow = entries.MlflowRegistration("klear", "3", False, model.uri, "m-1", "1", "run1",
                                        "http://mlflow:5000/#/experiments/1/runs/run1",
                                        "http://mlflow:5000/#/models/klear/versions/3")
    text = entries.render_markdown(model, evaluation, mlflow, None)
    assert "klear version 3: this content's version, registered before" in text
    # The two links are ours; nothing of the data (a forged stage, a label with HTML, a link as a benchmark name)
    # renders as markup.
    assert sorted(rendered_markup(text)) == ["link_open: http://mlflow:5000/#/experiments/1/runs/run1",
                                             "link_open: http://mlflow:5000/#/models/klear/versions/3"]


def test_a_missing_kubeflow_client_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from klear.register import kubeflow_registry

    monkeypatch.setitem(sys.modules, "model_registry", None)  # as in an image without the extra
    with pytest.raises(RegisterError, match=r"--kubeflow-registry needs the Kubeflow Model Registry client: pip install "
                                            r"'klear-pipeline\[register\]'"):
        kubeflow_registry.register("http://127.0.0.1:9", "klear", _model(), None, None, "klear register")
