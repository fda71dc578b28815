"""The files `make new-stage` writes for a new stage, by kind, and the names they use (pipelines/new_stage.py
inserts the registry lines). Every template is the smallest stage that does real work end to end on its skeleton:

- data: `klear.common.data_stage.DataStage`, the CPU image; copies its input's records (the work to replace);
- training: `klear.training.stage.TrainingStage`, the GPU image, launched on CPU, one node or several by
  `klear.training.launch`; trains a causal LM on a text field of its records (the dataset and trainer hooks to
  replace), with the checkpoints, resume and publishing every training stage has.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass

NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class ScaffoldError(ValueError):
    """A name or repository the scaffold cannot add a stage to; the message says why and where."""


@dataclass(frozen=True)
class Names:
    command: str  # word-count: the `klear` subcommand, meta.stage, the STAGES key
    package: str  # word_count: klear.word_count, tests/word_count
    config_class: str  # WordCountConfig
    keys_alias: str  # WORD_COUNT_KEYS: its OVERRIDE_KEYS as imported by pipelines/definitions.py
    pipeline: str  # klear-word-count

    @classmethod
    def of(cls, command: str) -> Names:
        if not NAME.match(command):
            raise ScaffoldError(f"stage name {command!r}: lower-case words joined by '-', e.g. word-count")
        package = command.replace("-", "_")
        if keyword.iskeyword(package):
            raise ScaffoldError(f"stage name {command!r}: {package} is a Python keyword")
        camel = "".join(part.capitalize() for part in command.split("-"))
        return cls(command, package, f"{camel}Config", f"{package.upper()}_KEYS", f"klear-{command}")

    @property
    def error_class(self) -> str:  # WordCountError: a training stage's bad-input error
        return self.config_class.removesuffix("Config") + "Error"


# --------------------------------------------------------------------------- the stage's own files


def data_files(names: Names, summary: str) -> dict[str, str]:
    """Path (from the repository root) -> text of every new file of a data stage."""
    n = names
    package = f"components/klear/{n.package}"
    return {
        f"{package}/__init__.py": f'"""{n.command}: {summary}"""\n',
        f"{package}/config.py": f'''"""Config of the {n.command} stage."""

from __future__ import annotations

import pydantic

from klear.common.config import StageConfig


class {n.config_class}(StageConfig):
    preset_package = "klear.{n.package}"

    max_records: int = pydantic.Field(0, ge=0, description="records read at most, in input order; 0 = all")
''',
        f"{package}/presets/paper.yaml": f"# {n.command} as the recipe runs it.\nmax_records: 0\n",
        f"{package}/presets/tiny.yaml": "# CPU demo and tests: the same rules on a few records.\nmax_records: 1000\n",
        f"{package}/stage.py": f'''"""Entry point of the {n.command} stage.

    klear {n.command} --input URI [URI ...] --output URI [--config paper|tiny|FILE]

Reads the records of every input in order (JSONL, Parquet, a published output) and publishes

    records.jsonl            the records read, up to max_records
    report.json, report.md   counts

atomically: nothing is visible as complete until the manifest is written, last.
"""

from __future__ import annotations

import argparse
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from klear.common.data_stage import DataStage
from klear.common.markdown import escape
from klear.common.records import iter_records, parse_sources, write_records
from klear.{n.package}.config import {n.config_class}

log = logging.getLogger("klear.{n.package}")


def render_markdown(report: dict[str, Any]) -> str:
    return f"# {n.command}\\n\\n{{report['records']}} records from {{', '.join(escape(i) for i in report['inputs'])}}\\n"


STAGE = DataStage("{n.command}", {n.config_class}, render_markdown)


def run(inputs: Sequence[str], output: str, config: {n.config_class}) -> dict[str, Any]:
    """Read `inputs`, publish to `output`; returns the report."""
    # A bad output fails now, not after the work; the manifest's lineage is these inputs and this config.
    checked = STAGE.check(output, {{"input": list(inputs)}}, config=config)
    located = (row for source in parse_sources(inputs) for row in iter_records(source))
    records = [row.record for row in itertools.islice(located, config.max_records or None)]
    with checked.open() as out:
        write_records(records, out.staging / "records.jsonl")
        report = {{"stage": "{n.command}", "inputs": list(inputs), "records": len(records),
                  "config": config.model_dump(mode="json")}}
        out.publish(report, {{"records": len(records)}})
    log.info("published %s: %d records", output, len(records))
    return report


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("{n.command}", help="{summary}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", action="extend", required=True, metavar="URI",
                        help="records to read, URI[#field=NAME]; repeat the flag or list several")
    parser.add_argument("--output", required=True, metavar="URI", help="output location (path, file:// or s3://)")
    STAGE.add_main(parser, lambda args, config: run(args.input, args.output, config),
                   lambda report: {{"records": report["records"]}})
''',
        f"{package}/component.py": f'''"""KFP component of the {n.command} stage: a thin wrapper around `klear.{n.package}.stage.run`."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from klear.common.config import keys_text
from klear.common.images import CPU_IMAGE
from klear.{n.package}.config import {n.config_class}

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text({n.config_class}, "; ")


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def {n.package}(
    data: Input[Dataset],
    preset: str,
    overrides: list,
    run_root: str,
    output: Output[Dataset],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    input_digest: str = "",
):
    """{summary[:1].upper() + summary[1:]}.

    Args:
        data: the records to read (imported by the pipeline).
        preset: {n.command} config preset (paper, tiny) or a YAML file path.
        overrides: {n.command} config overrides, "key=value" strings (`klear {n.command} --help-keys` lists the keys).
        run_root: where stage outputs go, `<run_root>/<run id>/{n.command}`.
        output: the published output: records.jsonl, report.json, report.md.
        summary: report.md, shown in the KFP UI.
        metrics: records read.
        input_digest: the content digest of the inputs read by URI (the digest_inputs step): part of KFP's
            cache key, so a cached result is served only for the same content; recorded in the output's metadata.
    """
    from klear.common import kfp_io
    from klear.common.config import load_config
    from klear.{n.package}.config import {n.config_class}
    from klear.{n.package}.stage import render_markdown, run

    target = kfp_io.output_location(run_root, "{n.command}")
    report = run([kfp_io.input_location(data)], target, load_config({n.config_class}, preset, overrides))
    kfp_io.record_output(output, target, {{"records": report["records"], "input_digest": input_digest}})
    kfp_io.publish_report(summary, render_markdown(report), metrics, [("records", report["records"])])
''',
        f"tests/{n.package}/__init__.py": "",
        f"tests/{n.package}/test_{n.package}.py": f'''"""The {n.command} stage through the real `klear {n.command}` command."""

from __future__ import annotations

import json
from pathlib import Path

from klear.common import storage
from tests.commands import jsonl, klear


def test_publishes_the_records_it_reads(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "data.jsonl", [{{"id": f"r{{i}}", "prompt": f"Compute {{i}} + {{i}}."}} for i in range(5)])
    out = tmp_path / "out"
    done = klear("{n.command}", "--input", data, "--output", str(out), "--config", "tiny", "--set", "max_records=3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {{"records": 3}}
    manifest = json.loads((out / storage.MANIFEST_NAME).read_text())
    assert manifest["meta"]["stage"] == "{n.command}" and manifest["meta"]["records"] == 3
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == ["r0", "r1", "r2"]


def test_a_bad_input_is_refused_by_name(tmp_path: Path) -> None:
    done = klear("{n.command}", "--input", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "out"))
    assert done.returncode == 2 and "missing.jsonl" in done.stderr, done.stderr[-3000:]
''',
    }


def data_pipeline(names: Names, summary: str) -> str:
    """The stage's own `klear-<stage>` pipeline: its input imported by URI, the stage a `cached_stage` task."""
    n = names
    return f'''@dsl.pipeline(name="{n.pipeline}", display_name="{n.command} (rerun)",
              description="Rerun {n.command} alone on existing records")
@_run_form(overrides={n.keys_alias})
def {n.package}_pipeline(data_uri: str, run_root: str, preset: str = "paper", overrides: list = [],
{" " * (len(n.package) + 14)}plan_cluster: str = "h100-80gb-x8", plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Dataset:
    """{summary[:1].upper() + summary[1:]}.

    Args:
        data_uri: The records {n.command} reads: a JSONL/Parquet file or a published output (s3://...).
        preset: {n.command} config (paper, tiny) or a YAML path.
    """
    data = _import(data_uri, dsl.Dataset, "records")
    task = cached_stage({n.package}, (data_uri,), what="{n.command} inputs", recompute=recompute, preset=preset,
                        data=data.output, overrides=overrides, run_root=run_root)
    output = _deterministic(task.set_display_name("{n.command}"), "4", "16Gi").outputs["output"]
    _plan_first("{n.pipeline}", plan_cluster, plan_gpu_quota, preset, overrides)
    return output
'''


def training_files(names: Names, summary: str) -> dict[str, str]:
    """Path (from the repository root) -> text of every new file of a training stage."""
    n = names
    package = f"components/klear/{n.package}"
    return {
        f"{package}/__init__.py": f'"""{n.command}: {summary}"""\n',
        f"{package}/config.py": f'''"""Config of the {n.command} stage.

Paper values in presets/paper.yaml; CPU values in presets/tiny.yaml."""

from __future__ import annotations

from typing import Literal

import pydantic

from klear.common.config import StageConfig


class {n.config_class}(StageConfig):
    preset_package = "klear.{n.package}"

    # Data
    text_field: str = pydantic.Field("text", min_length=1, description="the record field trained on")
    max_length: int = pydantic.Field(4096, ge=16, description="tokens per row; a longer text is cut")
    chat_template: Literal["model", "qwen3"] = pydantic.Field(
        "model", description="the tokenizer's template: 'model' (its own) or 'qwen3' (the shipped Qwen3 one)")

    # Schedule
    learning_rate: float = pydantic.Field(1e-5, gt=0, description="learning rate (linear decay)")
    num_epochs: float = pydantic.Field(1, gt=0, description="passes over the data")
    per_device_batch_size: int = pydantic.Field(1, ge=1, description="rows per device per step")
    seed: int = pydantic.Field(42, description="seed of initialisation and data order")

    # Numerics
    bf16: bool = pydantic.Field(True, description="bf16 training (GPU)")
    gradient_checkpointing: bool = pydantic.Field(True, description="recompute activations in the backward pass")
    deepspeed: str = pydantic.Field(
        "", description="DeepSpeed config: 'zero3' (shipped), a JSON path, or '' for none (plain DDP / one process)")

    # Checkpoints on object storage
    save_steps: int = pydantic.Field(500, ge=1, description="checkpoint every N optimizer steps")
    save_minutes: float = pydantic.Field(30.0, ge=0, description="also checkpoint once this many minutes have passed "
                                         "since the last checkpoint (0: by save_steps only)")
    keep_checkpoints: int = pydantic.Field(2, ge=1, description="newest published checkpoints kept on storage")
    resume: bool = pydantic.Field(True, description="resume from the newest complete checkpoint under <output>/checkpoints")
    logging_steps: int = pydantic.Field(10, ge=1, description="log every N optimizer steps")
''',
        f"{package}/presets/paper.yaml": f"""# {n.command} as the recipe runs it (Qwen3-8B-Base, ZeRO-3 on GPU nodes).
text_field: text
max_length: 32768
chat_template: model
learning_rate: 1.0e-5
num_epochs: 1
per_device_batch_size: 1
seed: 42
bf16: true
gradient_checkpointing: true
deepspeed: zero3
save_steps: 500
save_minutes: 30
keep_checkpoints: 2
resume: true
logging_steps: 10
""",
        f"{package}/presets/tiny.yaml": """# CPU tests and demo with the tiny model (`klear tiny-model`): same code path, short rows, fp32.
text_field: text
max_length: 128
chat_template: model
learning_rate: 1.0e-3
num_epochs: 2
per_device_batch_size: 2
seed: 42
bf16: false
gradient_checkpointing: false
deepspeed: ""
save_steps: 10
save_minutes: 0
keep_checkpoints: 2
resume: true
logging_steps: 2
""",
        f"{package}/report.py": f'''"""The {n.command} report as KFP metrics and as Markdown for the run's UI page (torch-free)."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import markdown_report
from klear.training import report as common


def metric_items(report: dict[str, Any]) -> list[tuple[str, float]]:
    return common.metric_items(report, (common.TOKENS_PER_EPOCH,))


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    return "\\n".join(common.records_report_lines("{n.command}", report))
''',
        f"{package}/stage.py": f'''"""Entry point of the {n.command} stage: {summary}.

    klear {n.command} --model URI --data URI [URI ...] --output URI [--config paper|tiny|FILE] [--set KEY=VALUE]
    accelerate launch --config_file components/klear/training/launch_configs/zero3.yaml -m klear.cli {n.command} ...   (many GPUs/nodes)

Trains the model on the `text_field` of every record (next-token loss on each text and the EOS after it, up to
`max_length` tokens) and publishes to `--output`: the model folder (weights, tokenizer), report.json, report.md,
logs/. Checkpoints go to `<output>/checkpoints/step-N`; a restarted run resumes from the newest complete one. The
run is the shared training skeleton (klear/training/stage.py): this module supplies the tokenizer, the dataset and
the trainer (the stage's work: replace the dataset and trainer hooks with its own).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from klear.common.records import iter_records, parse_sources
from klear.{n.package}.config import {n.config_class}
from klear.{n.package}.report import metric_items, render_markdown
from klear.training import hf_model
from klear.training.hf_model import ModelInputError

# After the imports above (none imports transformers): the skeleton sets HF_HUB_OFFLINE before anything does.
from klear.training.stage import Prepared, StageInputs, TrainingStage, load_chat_tokenizer

NO_TEXT = "no_text"  # the skip reason of a record whose text field is missing, not a string or blank


class {n.error_class}(ModelInputError):
    """Bad input to the stage (model without tokenizer, no trainable records); the message says which."""


def load_tokenizer(model_dir: Path, model: str, config: {n.config_class}) -> Any:
    """The training tokenizer with the skeleton's template and EOS rule (EOS = <|im_end|>)."""
    return load_chat_tokenizer(model_dir, model, config.chat_template, {n.error_class})


def encode_text(text: Any, tokenizer: Any, max_length: int) -> list[int] | None:
    """The token ids of `text` and the EOS, cut at `max_length`; None for a text that is not a non-blank string."""
    if not isinstance(text, str) or not text.strip():
        return None
    return tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"][:max_length]


def build_dataset(data: list[str], tokenizer: Any, config: {n.config_class}) -> tuple[Any, dict[str, Any]]:
    """The rows trained on (input_ids) and the counts for the report."""
    import datasets

    rows: list[list[int]] = []
    skipped: Counter[str] = Counter()
    examples: list[str] = []  # where the first skipped records are (file:line)
    for located in (row for source in parse_sources(data) for row in iter_records(source)):
        ids = encode_text(located.record.get(config.text_field), tokenizer, config.max_length)
        if ids is None:
            skipped[NO_TEXT] += 1
            examples += [located.where][:20 - len(examples)]
            continue
        rows.append(ids)
    counts = {{"read": len(rows) + sum(skipped.values()), "kept": len(rows), "skipped": dict(skipped),
              "skipped_examples": examples, "tokens": sum(map(len, rows))}}
    if not rows:
        raise {n.error_class}(
            f"no trainable records in {{', '.join(data)}}: read {{counts['read']}}, none with a text in "
            f"{{config.text_field!r}} (first: {{', '.join(examples[:3]) or 'none'}})")
    return datasets.Dataset.from_dict({{"input_ids": rows}}), counts


def training_arguments(config: {n.config_class}, work: Path) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(work / "trainer"),
        num_train_epochs=config.num_epochs,
        per_device_train_batch_size=config.per_device_batch_size,
        learning_rate=config.learning_rate,
        seed=config.seed,
        bf16=config.bf16,
        gradient_checkpointing=config.gradient_checkpointing,
        deepspeed=hf_model.deepspeed_config(config.deepspeed),
        logging_steps=config.logging_steps,
        report_to="none",
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,
        disable_tqdm=True,
        dataloader_num_workers=0,
        # Without an accelerator, several processes must still form one (gloo) process group, not run alone.
        use_cpu=not hf_model.has_accelerator(),
    )


def _dataset(inputs: StageInputs) -> tuple[Any, dict[str, Any]]:
    return build_dataset(inputs.data, inputs.tokenizer, inputs.config)


def _trainer(inputs: StageInputs, dataset: Any) -> Prepared:
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer

    args = training_arguments(inputs.config, inputs.work)  # before the model: it switches on ZeRO-3's partitioned init
    model = AutoModelForCausalLM.from_pretrained(str(inputs.model_dir),
                                                 dtype="bfloat16" if inputs.config.bf16 else "float32")
    # Labels are the input ids with the padding masked out (the pad token differs from EOS: EOS is learned).
    collator = DataCollatorForLanguageModeling(inputs.tokenizer, mlm=False)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                      processing_class=inputs.tokenizer)
    return Prepared(trainer, lambda result: {{"metrics": {{"train_loss": float(result.training_loss)}}}})


STAGE = TrainingStage(name="{n.command}", config_class={n.config_class}, error={n.error_class},
                      load_tokenizer=load_tokenizer, dataset=_dataset, trainer=_trainer,
                      render_markdown=render_markdown, metric_items=metric_items)


def run(model: str, data: list[str], output: str, config: {n.config_class},
        work_dir: str | None = None) -> dict[str, Any]:
    """Train `model` on `data`, publish the model and report to `output`; returns the report."""
    return STAGE.run(model, data, output, config, work_dir)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from klear.common.cli import add_training_stage

    add_training_stage(subparsers, STAGE.name, help="{summary}", description=__doc__,
                       model_help="the model to train: a Hugging Face folder (path, file://, s3://)",
                       data_help="records with a text field: JSONL/Parquet or a published output",
                       default_preset="paper", config_class={n.config_class}, run=run)
''',
        f"{package}/component.py": f'''"""KFP component of the {n.command} stage.

A thin wrapper around the stage's spec (`klear.{n.package}.stage.STAGE`), launched on CPU, one GPU node or several
nodes as `klear.training.launch.run_training_stage` describes."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from klear.common.config import keys_text
from klear.common.images import GPU_IMAGE
from klear.{n.package}.config import {n.config_class}

# The keys `overrides` can set, "key: description; ...": the pipelines list them under their override parameters.
OVERRIDE_KEYS = keys_text({n.config_class}, "; ")


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def {n.package}(
    base_model: Input[Model],
    data: Input[Dataset],
    preset: str,
    overrides: list,
    gpus_per_node: str,
    nodes: int,
    run_root: str,
    model: Output[Model],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    input_digest: str = "",
):
    """{summary[:1].upper() + summary[1:]}.

    Args:
        base_model: the model to train (Hugging Face folder, published or imported).
        data: the records it trains on (JSONL/Parquet, or a published output).
        preset: {n.command} config preset (paper, tiny) or a YAML file path.
        overrides: {n.command} config overrides, "key=value" strings (`klear {n.command} --help-keys` lists the keys).
        gpus_per_node: GPUs per node, a whole number as a string: the pipeline parameter that also sets the pod's
            GPU limit; "0" trains on CPU.
        nodes: nodes of the training job (1 = in this pod; more = a Kubeflow Trainer job this pod launches).
        run_root: where stage outputs go, `<run_root>/<run id>/{n.command}`; checkpoints under it.
        model: the published model: weights, tokenizer, report.json, report.md, logs/.
        summary: report.md, shown in the KFP UI.
        metrics: records read, kept and skipped (per reason), steps, and the final training figures.
        input_digest: the content digest of the inputs read by URI and of the config files (the digest step): only
            part of KFP's cache key, so a new run with the same inputs and settings reuses the trained model.
    """
    from klear.{n.package}.stage import STAGE
    from klear.training.launch import run_training_component

    run_training_component(STAGE, "{n.command}", base_model, data, preset, list(overrides), gpus_per_node, nodes,
                           run_root, model, summary, metrics)
''',
        f"tests/{n.package}/__init__.py": "",
        f"tests/{n.package}/test_{n.package}.py": f'''"""The {n.command} stage through its real command, on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

from klear.common import storage
from tests.commands import jsonl, klear


def test_trains_on_the_texts_and_publishes_the_model(tiny_model: str, tmp_path: Path) -> None:
    data = jsonl(tmp_path / "data.jsonl", [{{"text": f"{{i}} + {{i}} = {{2 * i}}"}} for i in range(8)] + [{{"title": "x"}}])
    out = tmp_path / "out"
    done = klear("{n.command}", "--model", tiny_model, "--data", data, "--output", str(out), "--config", "tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert (summary["data"]["kept"], summary["data"]["skipped"]) == (8, {{"no_text": 1}})
    assert summary["training"]["global_step"] == summary["training"]["max_steps"] > 0
    manifest = json.loads((out / storage.MANIFEST_NAME).read_text())
    assert manifest["meta"]["stage"] == "{n.command}"
    assert (out / "model.safetensors").is_file() and "# {n.command}" in (out / "report.md").read_text()


def test_data_without_text_is_refused_by_name(tiny_model: str, tmp_path: Path) -> None:
    data = jsonl(tmp_path / "untitled.jsonl", [{{"title": "x"}}])
    done = klear("{n.command}", "--model", tiny_model, "--data", data, "--output", str(tmp_path / "out"),
                 "--config", "tiny")
    assert done.returncode == 2 and "untitled.jsonl:1" in done.stderr, done.stderr[-3000:]
''',
    }


def training_pipeline(names: Names, summary: str) -> str:
    """The stage's own `klear-<stage>` pipeline: its model and records imported by URI, the stage a `cached_stage`
    task launched as every training stage is (`_launches_training`), after `klear plan` on its arguments."""
    n = names
    indent = " " * (len(n.package) + 14)
    return f'''@dsl.pipeline(name="{n.pipeline}", display_name="{n.command} (rerun)",
              description="Rerun {n.command} alone on an existing model and records")
@_run_form("training", overrides={n.keys_alias})
def {n.package}_pipeline(base_model_uri: str, data_uri: str, run_root: str, preset: str = "paper", overrides: list = [],
{indent}gpus_per_node: str = GPUS, nodes: int = 1, cpu: str = SFT_CPU, memory: str = NODE_MEMORY,
{indent}gpu_node_selector: dict = {{}}, gpu_tolerations: list = [], plan_cluster: str = "h100-80gb-x8",
{indent}plan_gpu_quota: int = 0, recompute: str = "") -> dsl.Model:
    """{summary[:1].upper() + summary[1:]}.

    Args:
        base_model_uri: The model to train, a Hugging Face folder (s3://...).
        data_uri: The records {n.command} trains on: a JSONL/Parquet file or a published output (s3://...).
        preset: {n.command} config (paper, tiny) or a YAML path.
        cpu: CPU per training node.
    """
    base = _import(base_model_uri, dsl.Model, "base model")
    data = _import(data_uri, dsl.Dataset, "{n.command} records")
    task = cached_stage({n.package}, (base_model_uri, data_uri), what="{n.command} inputs", recompute=recompute,
                        preset=preset, base_model=base.output, data=data.output, overrides=overrides,
                        gpus_per_node=gpus_per_node, nodes=nodes, run_root=run_root)
    task.set_display_name("{n.command}")
    model = _launches_training(task, nodes, gpus_per_node, cpu, memory, (gpu_node_selector, gpu_tolerations))
    _plan_first("{n.pipeline}", plan_cluster, plan_gpu_quota, preset, overrides, model_uri=base_model_uri, nodes=nodes,
                gpus_per_node=gpus_per_node)
    return model.set_caching_options(True).outputs["model"]
'''


@dataclass(frozen=True)
class Kind:
    """What a kind of stage gets besides its files: its image, what it may import, the keys `klear lineage` shows
    first, how its rerun pipeline is listed in docs/deploy.md, and the component's model input (README's table)."""

    image: str
    layers: str  # its ALLOWED line's set, as Python
    key_settings: tuple[str, ...]
    files: Callable[[Names, str], dict[str, str]]
    pipeline: Callable[[Names, str], str]
    rerun_arguments: str
    hostile_input: bool  # a command that runs in seconds puts a hostile file name into its report (HOSTILE_INPUTS)
    model_input: str = ""


KINDS = {
    "data": Kind("cpu", '{"common"}', ("max_records",), data_files, data_pipeline, "`data_uri`", True),
    "training": Kind("gpu", '{"common", "training"}', ("learning_rate", "num_epochs", "max_length", "seed"),
                     training_files, training_pipeline, "`base_model_uri` and `data_uri`", False, "base_model"),
}
