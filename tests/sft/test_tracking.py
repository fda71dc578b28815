"""Experiment tracking of a training stage: a real MLflow tracking server on loopback (SQLite store) and W&B in offline
mode, read back through their own clients and files; the run continues when the stage resumes; credentials from the
environment never reach the logs, the config or the outputs; the curves page opens in a browser with its charts."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from klear.common import storage, tracking
from klear.common.config import ConfigError, load_config
from klear.sft.config import SftConfig
from tests.conftest import free_port
from tests.processes import served_on_loopback

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = ROOT / ".venv-mlflow" / "bin" / "mlflow"
SECRET = "s3cr3t-tracking-password-7f1c"


def mlflow_server_binary() -> Path:
    """The MLflow server of `make install-mlflow`; missing: a skip with the reason, a failure in CI."""
    if not MLFLOW.is_file():
        message = f"{MLFLOW} missing: `make install-mlflow` builds the MLflow server's own environment"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return MLFLOW


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = mlflow_server_binary()
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [str(binary), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")]
    with served_on_loopback(command, None, root / "server.log", port, "mlflow server", 120, api_path="") as url:
        yield url


def _files_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("latin-1") for p in sorted(root.rglob("*")) if p.is_file())


def test_report_to_is_checked_and_credentials_stay_out_of_configs() -> None:
    assert tracking.parse_report_to("tensorboard, mlflow") == ("tensorboard", "mlflow")
    assert tracking.parse_report_to("none") == ()
    with pytest.raises(ConfigError, match="report_to"):
        load_config(SftConfig, "tiny", ["report_to=tensorbord"])
    with pytest.raises(ConfigError, match="tracking_uri holds credentials"):
        load_config(SftConfig, "tiny", ["tracking_uri=https://user:pw@mlflow.example.com"])
    assert load_config(SftConfig, "paper").report_to == "tensorboard"


def test_scheme_names_and_progress_line() -> None:
    assert tracking.scheme_name("loss") == "train/loss"
    assert tracking.scheme_name("completions/clipped_ratio") == "rollout/truncated_frac"
    assert tracking.scheme_name("reward") == "reward/mean"
    assert tracking.scheme_name("reward/math/mean") == "reward/math/mean"
    assert tracking.scheme_name("val/demo/pass@1") == "val/demo/pass@1"
    assert tracking.scheme_name("approx_kl") == "train/kl_old_policy"
    line = tracking.progress_line(100, 400, 600.0, 50, {"train/loss": 0.5, "other": 1.0})
    # 50 steps of this attempt in 10 minutes: 300 steps left take an hour.
    assert line == "step 100/400 (25%), elapsed 0:10:00, ETA 1:00:00, train/loss 0.5"


def test_mlflow_and_wandb_runs_read_back_and_continued_on_resume(
        mlflow_server: str, tiny_model: str, demo_files: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    from mlflow.tracking import MlflowClient

    from klear.sft.stage import run

    # MLflow's own variables choose the experiment; the credentials come from the environment (the chart's Secret).
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "klear-tracking-test")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "trainer")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb").mkdir()
    caplog.set_level(logging.INFO)
    config = load_config(SftConfig, "tiny", ["report_to=tensorboard,mlflow,wandb", f"tracking_uri={mlflow_server}",
                                             "num_epochs=0.25", "save_steps=2", "logging_steps=1", "progress_seconds=0.01"])
    output = tmp_path / "out"
    report = run(tiny_model, demo_files, str(output), config, work_dir=str(tmp_path / "work"))
    steps = report["training"]["global_step"]
    assert steps >= 4

    client = MlflowClient(mlflow_server, registry_uri=mlflow_server)
    experiment = client.get_experiment_by_name("klear-tracking-test")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    mlflow_run = runs[0]
    assert mlflow_run.info.run_name.startswith("sft ")
    assert float(mlflow_run.data.params["learning_rate"]) == config.learning_rate
    history = client.get_metric_history(mlflow_run.info.run_id, "train/loss")
    assert [m.step for m in history] == list(range(1, steps + 1))
    for name in ("train/learning_rate", "train/grad_norm", "train/tokens_per_second", "train/packing_efficiency"):
        assert client.get_metric_history(mlflow_run.info.run_id, name), name
    efficiency = client.get_metric_history(mlflow_run.info.run_id, "train/packing_efficiency")[0].value
    assert 0.5 < efficiency <= 1.0

    # The run ids travel with every checkpoint.
    newest = max(int(p.name.split("-")[1]) for p in (output / "checkpoints").iterdir())
    ids = json.loads((output / "checkpoints" / f"step-{newest:09d}" / tracking.RUN_FILE).read_text())
    assert ids["mlflow"] == mlflow_run.info.run_id
    # W&B offline: its run folder under WANDB_DIR, named by the same id, with the scheme's names in it.
    offline = list((tmp_path / "wandb").rglob(f"run-{ids['wandb']}.wandb"))
    assert offline and b"train/packing_efficiency" in offline[0].read_bytes()

    # A progress line per step here (progress_seconds 0.01), with step/total, ETA and the loss.
    progress = [r.getMessage() for r in caplog.records if r.name == "klear.tracking" and "ETA" in r.getMessage()]
    assert progress and progress[-1].startswith(f"sft: step {steps}/{steps} (100%), elapsed ")
    assert "train/loss" in progress[-1]

    # The curves page, in the published logs/ (and in each checkpoint's copy of them).
    curves = (output / "logs" / tracking.CURVES_FILE).read_text()
    assert curves.count("data:image/png;base64,") >= 1 and "train" in curves
    assert (output / "checkpoints" / f"step-{newest:09d}" / "tensorboard" / tracking.CURVES_FILE).is_file()

    # Resumed (a second attempt at the same output from its newest checkpoint): the same MLflow run goes on.
    caplog.clear()
    storage.delete(storage.Uri.parse(str(output)).join(storage.MANIFEST_NAME))
    run(tiny_model, demo_files, str(output), config, work_dir=str(tmp_path / "work-2"))
    assert f"continuing tracker run(s) mlflow {mlflow_run.info.run_id}, wandb {ids['wandb']}" in caplog.text
    assert len(client.search_runs([experiment.experiment_id])) == 1
    # W&B: the second attempt's offline run has the first one's id (synced, they are one run).
    assert len(list((tmp_path / "wandb").rglob(f"run-{ids['wandb']}.wandb"))) == 2

    # The secret is in no log line, no output file, no MLflow param or tag.
    captured = capfd.readouterr()
    assert SECRET not in caplog.text and SECRET not in captured.out + captured.err
    assert SECRET not in _files_text(output)
    final = client.get_run(mlflow_run.info.run_id)
    assert SECRET not in json.dumps({**final.data.params, **final.data.tags})
    assert "password" not in json.dumps(report["config"]).lower()


def test_curves_page_shows_its_charts_in_headless_chromium(tmp_path: Path) -> None:
    import shutil

    from PIL import Image

    from tests.evaluate.test_report import CHROMIUM_FLAGS, MPL_BLUE, _colour_pixels

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Debian's chromium is not installed here and could not be (.ci/run installs it with apt-get)")
    rows = [{"step": float(s), "train/loss": 3.0 / s, "reward/mean": s / 20, "val/pass@1": 2.0 * s} for s in range(1, 21)]
    page = tmp_path / "curves.html"
    page.write_text(tracking.render_curves(rows, "gppo: training curves"))
    assert page.read_text().count("data:image/png;base64,") == 3  # one figure per group: reward, train, val
    shot = tmp_path / "shot.png"
    result = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                             "--window-size=1000,1400", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.exists(), result.stderr[-2000:]
    with Image.open(shot) as image:
        rgb = image.convert("RGB")
    # The lines can only be there if the inlined PNGs were decoded and drawn.
    assert _colour_pixels(rgb, MPL_BLUE) > 300
