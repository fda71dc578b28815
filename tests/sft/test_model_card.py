"""The model card `klear sft` writes beside the published model, when an upstream manifest (the data's) is hostile or
malformed: the card shows its values as text, and never fails the stage after the model is published."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from klear.common import lineage, model_card, storage
from tests.commands import klear
from tests.common.test_markdown import FORGED_STAGE, fenced_blocks, rendered_markup

CHAT = {"messages": [{"role": "user", "content": "What is 2 + 3?"},
                     {"role": "assistant", "content": "<think>\n2 + 3 = 5\n</think>\n\n\\boxed{5}"}]}


def _data(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> str:
    """A published data folder (as `klear sft-data` leaves one) whose manifest meta `change` then edits in place."""
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "data.jsonl").write_text("".join(json.dumps(CHAT) + "\n" for _ in range(4)))
    data = str(tmp_path / "data")
    storage.publish_dir(staging, data, meta={"stage": "sft-data", "lineage": lineage.record([], None)})
    path = Path(data) / storage.MANIFEST_NAME
    body = json.loads(path.read_text())
    change(body["meta"])
    path.write_text(json.dumps(body))
    return data


def _sft(tiny_model: str, data: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    output = tmp_path / "sft3"
    done = klear("sft", "--model", tiny_model, "--data", data, "--output", str(output), "--config", "tiny",
                 "--work-dir", str(tmp_path / "work"))
    return done, output


def _card(output: Path) -> tuple[dict[str, Any], str]:
    """The card's YAML header and its Markdown body."""
    text = (output / model_card.CARD_NAME).read_text()
    _, header, body = text.split("---\n", 2)
    return yaml.safe_load(header), body


def test_a_stage_forged_in_the_datas_manifest_shows_as_text_in_the_card(tiny_model: str, tmp_path: Path) -> None:
    data = _data(tmp_path, lambda meta: meta.update(stage=FORGED_STAGE))
    done, output = _sft(tiny_model, data, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    header, body = _card(output)
    assert header["datasets"] == [data]
    assert rendered_markup(body) == [], body  # no HTML, link or image a renderer would act on
    blocks = fenced_blocks(body)
    assert [info for info, _ in blocks] == ["json", "", "mermaid"]
    shown = FORGED_STAGE.replace("\n", "\\n")
    assert f"{shown}  {data}  digest" in blocks[1][1]  # the lineage text: the value shown, on its step's one line


def test_malformed_lineage_in_the_datas_manifest_leaves_a_published_model_and_its_card(
        tiny_model: str, tmp_path: Path) -> None:
    data = _data(tmp_path, lambda meta: meta["lineage"].update(inputs="notalist"))
    done, output = _sft(tiny_model, data, tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert storage.read_manifest(str(output)).meta["stage"] == "sft"
    named = f"{data}/{storage.MANIFEST_NAME}: meta.lineage.inputs must be a list, not str 'notalist'"
    assert named in done.stderr
    header, body = _card(output)
    assert header["base_model"] == tiny_model and header["datasets"] == [data]
    assert f"note: malformed lineage: {named}" in body
