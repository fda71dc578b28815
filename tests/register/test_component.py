"""The Kubeflow Model Registry through its own client (`model-registry`), against a loopback stub of its REST API
(tests/register/registry_stub.py): `klear register` makes one version per model content, and the register component,
run by kfp.local as the pipeline runs it, finds that version again and says so in its summary."""

# No `from __future__ import annotations`: kfp reads the pipeline's parameter types at run time.

import json
from pathlib import Path

import pytest

from klear.common import storage
from klear.register.entries import DIGEST_TAG, version_description
from tests.register.registry_stub import registry_stub
from tests.register.test_register import _publish_model, _register, _registered

TOKEN = "kf-service-account-token-9b1c"


def test_the_kubeflow_model_registry_gets_one_version_per_content_from_the_command_and_the_component(
        tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kfp import dsl, local

    from klear.register.component import register

    model = str(tmp_path / "sft")
    data = str(tmp_path / "sft.jsonl")
    Path(data).write_text('{"messages": []}\n')
    _publish_model(tiny_model, model, data, {}, tmp_path / "staging")  # trained without a tracker
    token = tmp_path / "token"
    token.write_text(TOKEN)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token))  # where the client reads its bearer token
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the Kubeflow registry only

    @dsl.pipeline(name="klear-register-test")
    def registration(model_uri: str, address: str) -> None:
        imported = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=False)
        register(model=imported.output, name="klear", name_suffix="-tiny", kubeflow_registry=address)

    with registry_stub() as (address, state):
        first = _registered(_register("--model", model, "--name", "klear-tiny", "--kubeflow-registry", address))
        root = tmp_path / "kfp"
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
        registration(model_uri=model, address=address)
    assert first["mlflow"] is None and first["kubeflow"]["created"]
    (task,) = [p for p in root.rglob("register") if (p / "executor_output.json").is_file()]
    summary = (task / "summary").read_text()
    assert "## Kubeflow Model Registry" in summary and "this content's version, registered before" in summary

    # One registered model, one version named by the content, its artifact the published location.
    (registered,) = state.models.values()
    (version,) = state.versions.values()
    (artifact,) = state.artifacts[version["id"]]
    digest = storage.content_digest(model)
    assert registered["name"] == "klear-tiny" and version["name"] == f"sft-{digest[:16]}"
    assert f"klear-tiny (id {registered['id']}) version sft-{digest[:16]} (id {version['id']})" in summary
    assert version["registeredModelId"] == registered["id"] and first["kubeflow"]["version_id"] == version["id"]
    assert version["description"] == version_description(storage.read_bytes(f"{model}/README.md").decode(),
                                                          f"{model}/README.md")
    assert version["customProperties"][DIGEST_TAG]["string_value"] == digest
    assert version["customProperties"]["klear.input.model"]["string_value"] == tiny_model
    assert json.loads(version["customProperties"]["klear.lineage"]["string_value"])[0]["uri"] == tiny_model
    assert artifact["uri"] == model and artifact["modelFormatName"] == "huggingface"
    # Every request carried the service account's token, which no output shows.
    assert state.requests and {auth for _, _, auth in state.requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in json.dumps(first) + summary
