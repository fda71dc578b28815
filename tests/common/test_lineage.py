"""Lineage: manifests record inputs, config, code and KFP ids; `klear lineage` walks them back to the source prompts;
a model folder's card (README.md) parses as a Hugging Face model card and stays outside the model's digest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from klear.cli import main as klear
from klear.common import lineage, model_card, storage
from klear.common.config import StageConfig, load_config
from klear.sft.config import SftConfig
from tests.commands import klear as command  # the real command, in a process of its own
from tests.common.test_markdown import FORGED_STAGE


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _curate(tmp_path: Path, name: str, prompts: str, bench: str) -> str:
    out = str(tmp_path / name)
    assert klear(["curate", "--input", prompts, "--benchmark", bench, "--output", out, "--config", "tiny"]) == 0
    return out


def test_lineage_walks_back_to_the_source_prompts_and_a_changed_input_changes_the_digests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lineage.RUN_ID_ENV, "run-7")
    monkeypatch.setenv(lineage.TASK_ENV, "klear-reasoner-abc-curate-pod")
    monkeypatch.setenv(lineage.CODE_COMMIT_ENV, "0123abc")
    prompts = _jsonl(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"how many apples are {i} and {i}"}
                                            for i in range(3)])
    bench = _jsonl(tmp_path / "b.jsonl", [{"id": "b0", "problem": "find the sum of all primes below ten"}])
    curated = _curate(tmp_path, "curated", prompts, bench)
    record = storage.read_manifest(curated).meta["lineage"]
    assert [entry["uri"] for entry in record["inputs"]] == [prompts, bench]
    assert record["inputs"][0]["digest"] == storage.sha256_file(prompts)
    assert record["config"]["ngram_size"] > 0  # the full config, not a summary
    assert record["code"]["commit"] == "0123abc" and record["code"]["version"]
    assert record["kfp"] == {"run_id": "run-7", "task": "klear-reasoner-abc-curate-pod"}

    # A second step made from the first: the chain reaches the prompts through it.
    again = _curate(tmp_path, "again", str(Path(curated) / "prompts.jsonl") if (Path(curated) / "prompts.jsonl").exists()
                    else curated, bench)
    capsys.readouterr()
    assert klear(["lineage", again]) == 0
    text = capsys.readouterr().out
    assert f"<- input: {curated}" in text and f"source  {prompts}" in text and "flowchart TD" in text
    steps = lineage.trace(again)
    assert {step.uri for step in lineage.sources(steps)} >= {prompts, bench}

    # Changed prompts: curate's input digest, then its own digest, differ; the older consumer is flagged.
    _jsonl(Path(prompts), [{"id": "p9", "prompt": "how many pears are nine and nine"}])
    before = storage.content_digest(curated)
    _curate(tmp_path, "curated", prompts, bench)
    assert storage.read_manifest(curated).meta["lineage"]["inputs"][0]["digest"] != record["inputs"][0]["digest"]
    assert storage.content_digest(curated) != before
    first_edge = lineage.trace(again)[0].inputs[0]
    assert first_edge.changed
    assert klear(["lineage", again, "--format", "mermaid"]) == 0
    assert "-. changed .->" in capsys.readouterr().out
    assert klear(["lineage", str(tmp_path / "nothing")]) == 2  # no manifest: an error, not a one-step chain


def test_a_model_card_parses_names_base_model_and_data_and_stays_outside_the_digest(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    data = _jsonl(tmp_path / "sft.jsonl", [{"messages": []}])
    model = str(tmp_path / "model")
    storage.check_writes([storage.Write("--output", model, "sft")], [str(base), data])
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"weights")
    overrides = ["learning_rate=8e-5", "min_learning_rate=8e-6", "num_epochs=4"]
    config = load_config(SftConfig, "tiny", overrides)  # its preset goes into the manifest
    storage.publish_dir(staging, model, meta={"stage": "sft", "inputs": {"model": [str(base)], "data": [data]},
                                              "lineage": lineage.RunLineage([str(base), data], config).record()})
    model_card.write(model)
    digest = storage.content_digest(model)
    model_card.write(model, ("s3://b/run/evaluate", "sft", {"aime24": 12.5}))
    assert storage.content_digest(model) == digest  # a card update leaves the model's identity alone
    with storage.fetch_published(model) as (_, manifest):
        assert model_card.CARD_NAME not in manifest.files
    text = (Path(model) / model_card.CARD_NAME).read_text()
    header = yaml.safe_load(text.split("---\n")[1])
    assert header["base_model"] == str(base)
    assert header["klear"]["data"] == [{"uri": data, "digest": storage.sha256_file(data)}]
    assert header["klear"]["hyperparameters"]["learning_rate"] == 8e-5
    assert header["klear"]["preset"] == {"preset": "tiny", "bases": [], "overrides": overrides}
    assert "preset tiny + learning_rate=8e-5 min_learning_rate=8e-6 num_epochs=4." in text
    assert header["model-index"][0]["results"][0]["metrics"][0]["value"] == 12.5
    assert "## Lineage" in text and "flowchart TD" in text
    hub = pytest.importorskip("huggingface_hub")
    card = hub.ModelCard(text)
    assert card.data.base_model == str(base) and card.data.eval_results[0].metric_value == 12.5


def _chain(tmp_path: Path, prompts: str) -> dict[str, str]:
    """curate -> sample (the records backend: the rows' shipped responses) -> judge, each through its command."""
    outs = {stage: str(tmp_path / stage) for stage in ("curate", "sample", "judge")}
    assert klear(["curate", "--input", f"{prompts}#prompt=problem", "--output", outs["curate"], "--config", "tiny"]) == 0
    assert klear(["sample", "--prompts", outs["curate"], "--output", outs["sample"], "--config", "tiny",
                  "--set", "backend=records", "--set", "n=1"]) == 0
    assert klear(["judge", "--samples", outs["sample"], "--output", outs["judge"], "--config", "tiny"]) == 0
    return outs


def test_a_changed_source_changes_every_digest_along_a_chain_of_real_stages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def rows(answers: list[int]) -> list[dict[str, Any]]:
        return [{"id": f"p{i}", "problem": f"What is {i} plus one hundred and {i}?", "answer": str(a),
                 "generations": [f"<think>\nadd\n</think>\n\nThe answer is $\\boxed{{{a}}}$."]}
                for i, a in enumerate(answers)]

    prompts = _jsonl(tmp_path / "prompts.jsonl", rows([100, 102, 104]))
    outs = _chain(tmp_path, prompts)
    source = f"{prompts}#prompt=problem"
    steps = lineage.trace(outs["judge"])
    assert [step.stage for step in steps[:4]] == ["judge", "sample", "curate", ""]
    assert [step.uri for step in steps[:4]] == [outs["judge"], outs["sample"], outs["curate"], source]
    assert steps[3].digest == storage.sha256_file(prompts) and steps[3].note == "source (no manifest)"
    # The presets each stage was loaded from, with the base a preset builds on and the overrides given.
    assert steps[1].settings["preset"] == "tiny (on paper) + backend=records n=1"
    assert storage.read_manifest(outs["judge"]).meta["lineage"]["preset"] == {"preset": "tiny", "bases": ["paper"],
                                                                               "overrides": []}
    before = {stage: storage.content_digest(uri) for stage, uri in outs.items()}
    chain = [(outs["judge"], outs["sample"]), (outs["sample"], outs["curate"]), (outs["curate"], source)]

    def recorded() -> list[str]:  # the digest each consumer recorded of its input on the chain
        by_uri = {step.uri: step for step in lineage.trace(outs["judge"])}
        return [next(edge.digest for edge in by_uri[consumer].inputs if edge.uri == uri) for consumer, uri in chain]

    first = recorded()
    assert first == [before["sample"], before["curate"], storage.sha256_file(prompts)]

    # One answer (and its shipped response) changed in the source file: every output's digest changes, and so does
    # every input digest its consumer recorded, down to the judge.
    _jsonl(Path(prompts), rows([100, 102, 105]))
    _chain(tmp_path, prompts)
    after = {stage: storage.content_digest(uri) for stage, uri in outs.items()}
    assert all(after[stage] != before[stage] for stage in outs), (before, after)
    assert all(new != old for new, old in zip(recorded(), first, strict=True))
    assert not any(edge.changed for step in lineage.trace(outs["judge"]) for edge in step.inputs)  # all remade
    capsys.readouterr()
    assert klear(["lineage", outs["judge"], "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [step["digest"] for step in printed[:3]] == [after["judge"], after["sample"], after["curate"]]


def _preset(config: StageConfig) -> dict[str, Any]:
    assert config.provenance is not None, f"{type(config).__name__} carries no provenance"
    return config.provenance.to_json()


def test_load_config_keeps_the_presets_a_config_was_built_from(tmp_path: Path) -> None:
    from klear.common.config import describe_preset
    from klear.rl_filter.config import RlFilterConfig
    from klear.sample.config import SampleConfig

    own = tmp_path / "mine.yaml"
    own.write_text("base: tiny\nn: 3\n")
    config = load_config(SampleConfig, str(own), ["seed=5"])
    assert _preset(config) == {"preset": str(own), "bases": ["tiny", "paper"], "overrides": ["seed=5"]}
    assert config.provenance is not None and config.provenance.files == (str(own),)  # the file read, not the presets
    assert describe_preset(_preset(config)) == f"{own} (on tiny on paper) + seed=5"
    again = load_config(SampleConfig, str(own), ["seed=5"])
    assert again == config and _preset(load_config(SampleConfig, str(own), ["seed=6"]))["overrides"] == ["seed=6"]
    # A section of a loaded config (the judge settings rl-filter hands a judge step): its preset, and which section.
    judge = load_config(RlFilterConfig, "tiny", ["judge.task=math"]).judge
    assert describe_preset(_preset(judge)) == "tiny + judge.task=math, section RlFilterConfig.judge"
    assert describe_preset(_preset(load_config(SampleConfig))) == "defaults"
    # Only a config load_config built says where it came from: not one made in code, nor a copy with other values.
    assert SampleConfig().provenance is None and SampleConfig() == load_config(SampleConfig)
    assert config.model_copy(update={"n": 9}).provenance is None
    assert config.model_copy(update={"n": config.n}).provenance == config.provenance


# --------------------------------------------------------------------------- hostile, malformed and moved manifests


def _forge(output: str, change: Any) -> None:
    """Edit the meta of a published output's manifest in place, as a tampered or buggy upstream writer would (the
    manifest's file checksums, and so the output's digest, stay what they were)."""
    path = Path(output) / storage.MANIFEST_NAME
    body = json.loads(path.read_text())
    change(body["meta"])
    path.write_text(json.dumps(body))


def _two_curations(tmp_path: Path) -> tuple[str, str]:
    """curate, then curate again from the first's output: a chain with one upstream manifest."""
    prompts = _jsonl(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"how many apples are {i} and {i} together"}
                                            for i in range(3)])
    curated = str(tmp_path / "curated")
    assert klear(["curate", "--input", prompts, "--output", curated, "--config", "tiny"]) == 0
    again = str(tmp_path / "again")
    assert klear(["curate", "--input", curated, "--output", again, "--config", "tiny"]) == 0
    return curated, again


def test_a_stage_forged_upstream_shows_as_one_line_of_text_and_plain_mermaid(tmp_path: Path) -> None:
    curated, again = _two_curations(tmp_path)
    _forge(curated, lambda meta: meta.update(stage=FORGED_STAGE))
    mermaid = command("lineage", again, "--format", "mermaid")
    assert mermaid.returncode == 0, mermaid.stderr[-3000:]
    assert "<" not in mermaid.stdout and "`" not in mermaid.stdout, mermaid.stdout
    assert all(line == "flowchart TD" or line.startswith("  n") for line in mermaid.stdout.splitlines())
    done = command("lineage", again)  # the text, then the graph
    assert done.returncode == 0, done.stderr[-3000:]
    shown = FORGED_STAGE.replace("\n", "\\n")
    assert f"{shown}  {curated}  digest" in done.stdout  # the value, on its own step's line
    assert not any(line.startswith(("`", "<")) for line in done.stdout.splitlines()), done.stdout


@pytest.mark.parametrize(("change", "message"), [
    pytest.param(lambda meta: meta["lineage"].update(inputs="notalist"),
                 "meta.lineage.inputs must be a list, not str 'notalist'", id="inputs-not-a-list"),
    pytest.param(lambda meta: meta["lineage"]["inputs"][0].pop("uri"), "meta.lineage.inputs[0] has no uri",
                 id="input-without-uri"),
    pytest.param(lambda meta: meta["lineage"]["inputs"].insert(0, 7), "meta.lineage.inputs[0] must be a mapping, not int 7",
                 id="input-not-a-mapping"),
    pytest.param(lambda meta: meta.update(lineage=["x"]), "meta.lineage must be a mapping, not list", id="lineage"),
    pytest.param(lambda meta: meta.update(inputs="x"), "meta.inputs must be a mapping of role to URIs", id="roles"),
    pytest.param(lambda meta: meta["lineage"]["preset"].update(bases=3), "meta.lineage.preset must be", id="preset"),
    pytest.param(lambda meta: meta["lineage"].update(code=["x"]), "meta.lineage.code must be a mapping of strings",
                 id="code"),
    pytest.param(lambda meta: meta.update(stage=["curate"]), "meta.stage must be a string, not list", id="stage"),
])
def test_malformed_lineage_upstream_is_named_not_a_crash(tmp_path: Path, change: Any, message: str) -> None:
    """`klear lineage` prints the chain as far as it is recorded; the malformed field is named with its manifest."""
    curated, again = _two_curations(tmp_path)
    _forge(curated, change)
    named = f"{curated}/{storage.MANIFEST_NAME}: {message}"
    for form in ("text", "json", "mermaid"):
        done = command("lineage", again, "--format", form)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert named in done.stderr, done.stderr[-3000:]  # the warning
        if form == "json":
            (step,) = [step for step in json.loads(done.stdout) if step["uri"] == curated]
            assert named in step["note"]
        elif form == "text":
            assert f"note: malformed lineage: {named}" in done.stdout


def test_lineage_records_absolute_locations_and_flags_an_edited_source(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs typed relative to one folder, the chain read from another: the same files, one step per place, and a
    source edited since is flagged as a republished input is."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (elsewhere / "out" / "curated").mkdir(parents=True)
    work.mkdir()
    monkeypatch.chdir(work)
    rows = [{"id": f"p{i}", "prompt": f"how many pears are {i} and {i} together"} for i in range(3)]
    _jsonl(work / "p.jsonl", rows)
    _jsonl(elsewhere / "p.jsonl", rows[:1])  # same name, other folder: an unrelated file
    assert klear(["curate", "--input", "p.jsonl", "--output", "out/curated", "--config", "tiny"]) == 0
    assert klear(["curate", "--input", "./out/curated/", "--output", "out/again", "--config", "tiny"]) == 0
    curated, again, prompts = str(work / "out" / "curated"), str(work / "out" / "again"), str(work / "p.jsonl")
    recorded = storage.read_manifest(again).meta["lineage"]["inputs"][0]
    assert (recorded["uri"], recorded["given"]) == (curated, "./out/curated/")

    monkeypatch.chdir(elsewhere)
    done = command("lineage", "../work/out/again", "../work/out/./curated/", "--format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads(done.stdout)
    assert [step["uri"] for step in steps if step["stage"]] == [again, curated]  # one step per place
    by_uri = {step["uri"]: step for step in steps}
    assert by_uri[again]["inputs"][0] == {"role": "input", "uri": curated, "digest": storage.content_digest(curated),
                                          "changed": False}
    assert by_uri[prompts]["digest"] == storage.sha256_file(prompts)  # the file curate read, not ./p.jsonl here
    assert not any(edge["changed"] for step in steps for edge in step["inputs"])

    _jsonl(work / "p.jsonl", rows[:2])  # the source edited after curate read it
    done = command("lineage", again, "--format", "json")
    edge = next(edge for edge in json.loads(done.stdout)[1]["inputs"] if edge["uri"] == prompts)
    assert edge["changed"] and edge["digest"] != storage.sha256_file(prompts)
    text = command("lineage", again).stdout
    assert f"<- input: {prompts} (digest {edge['digest'][:12]})  CHANGED since (now " in text
    assert "-. changed .->|input|" in text


def test_a_manifest_names_what_its_run_was_handed_not_what_else_the_process_read(tmp_path: Path) -> None:
    """One process loads the stage's config, then reads an unrelated config of equal content and checks an unrelated
    output over the stage's, with another input: none of that reaches the stage's manifest."""
    from klear.curate.config import CurateConfig
    from klear.curate.stage import run as curate

    prompts = _jsonl(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"how many plums are {i} and {i}"} for i in range(3)])
    bench = _jsonl(tmp_path / "b.jsonl", [{"id": "b0", "problem": "find the sum of all primes below ten"}])
    (tmp_path / "stage.yaml").write_text("base: tiny\n")
    (tmp_path / "unrelated.yaml").write_text("base: tiny\n")  # equal settings, another file
    config = load_config(CurateConfig, str(tmp_path / "stage.yaml"))
    assert load_config(CurateConfig, str(tmp_path / "unrelated.yaml")) == config
    unrelated = _jsonl(tmp_path / "unrelated.jsonl", [{"id": "u0", "prompt": "not this run's"}])
    storage.check_writes([storage.Write("--output", str(tmp_path / "runs"), "curate")], [unrelated])
    output = str(tmp_path / "runs" / "curated")
    curate([prompts], output, config, [bench])
    record = storage.read_manifest(output).meta["lineage"]
    assert [entry["uri"] for entry in record["inputs"]] == [prompts, bench]
    assert record["preset"] == {"preset": str(tmp_path / "stage.yaml"), "bases": ["tiny"], "overrides": []}
    assert "unrelated" not in json.dumps(record)
