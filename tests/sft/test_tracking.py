"""Experiment tracking of a training stage: a real MLflow tracking server on loopback (SQLite store) and W&B in offline
mode, read back through their own clients and files; the run continues when the stage resumes; credentials from the
environment never reach the logs, the config or the outputs; the curves page opens in a browser with its charts."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest

from klear.common import storage, tracking
from klear.common.config import ConfigError, load_config
from klear.sft.config import SftConfig
from tests.commands import klear
from tests.conftest import free_port
from tests.deploy import katib

SECRET = "s3cr3t-tracking-password-7f1c"


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


def test_redact_removes_every_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"MLFLOW_TRACKING_PASSWORD": SECRET, "MLFLOW_TRACKING_USERNAME": "trainer",
               "MLFLOW_TRACKING_URI": "https://bob:p%40ss-word-9@mlflow.example.com"}
    text = (f"API request to http://alice:{SECRET}@127.0.0.1:9/api/2.0/x failed; "
            "GET /?token=abc123&page=2 and https://h/p?X-Amz-Signature=f00d#top; password p@ss-word-9; "
            f"auth {SECRET}; user trainer")
    assert tracking.redact(text, environ) == (
        "API request to http://***@127.0.0.1:9/api/2.0/x failed; "
        "GET /?token=***&page=2 and https://h/p?X-Amz-Signature=***#top; password ***; auth ***; user trainer")
    assert tracking.redact("http://127.0.0.1:5000/api, s3://bucket/a@b", {}) == "http://127.0.0.1:5000/api, s3://bucket/a@b"
    assert tracking.uri_credentials("http://u:p@h/?a=1&api_key=k") == ["user:password@", "query parameter api_key"]
    assert tracking.uri_credentials("https://mlflow.example.com:5000/?page=1") == []
    # A Secret's value that is also a word of a good setting leaves the setting as it is.
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "mlflow-server")
    assert load_config(SftConfig, "tiny", ["tracking_uri=http://mlflow-server:5000"]).tracking_uri == "http://mlflow-server:5000"


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

    # The run is published with the model (logs/tracking_run.json: ids, experiment, page) and named in its card, so
    # `klear register` and a reader of the card find it.
    record = tracking.read_run_record(str(output))
    run_page = f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs/{mlflow_run.info.run_id}"
    assert record == {"mlflow": mlflow_run.info.run_id, "wandb": ids["wandb"],
                      "mlflow_experiment_id": experiment.experiment_id, "mlflow_url": run_page}
    assert tracking.RUN_RECORD in storage.read_manifest(str(output)).files
    card = (output / "README.md").read_text()
    assert f"- MLflow run {mlflow_run.info.run_id} (experiment {experiment.experiment_id}): {run_page}" in card

    # Resumed (a second attempt at the same output from its newest checkpoint, as a run that died before its final
    # publish leaves it: the checkpoints alone): the same MLflow run goes on.
    caplog.clear()
    for name in storage.list_files(str(output)):
        if not name.startswith("checkpoints/"):
            storage.delete(storage.Uri.parse(str(output)).join(name))
    run(tiny_model, demo_files, str(output), config, work_dir=str(tmp_path / "work-2"))
    assert f"continuing tracker run(s) mlflow {mlflow_run.info.run_id}, wandb {ids['wandb']}" in caplog.text
    assert len(client.search_runs([experiment.experiment_id])) == 1
    # W&B: the second attempt's offline run has the first one's id (synced, they are one run).
    assert len(list((tmp_path / "wandb").rglob(f"run-{ids['wandb']}.wandb"))) == 2

    # The secret is in no log line, no output file, no MLflow param or tag.
    captured = capfd.readouterr()
    assert SECRET not in caplog.text and SECRET not in captured.out + captured.err
    # Katib's default filter reads the same loss curve from the log's metric lines, the first attempt's first.
    losses = [float(log.value) for log in katib.parse_text_log(captured.err, [tracking.katib_name("train/loss")])]
    assert losses[:len(history)] == [m.value for m in history]
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


# --------------------------------------------------------------------------- the start check, through `klear sft`


def _sft(tiny_model: str, demo_files: list[str], root: Path, *sets: str, env: dict[str, str] | None = None,
         timeout: int = 300) -> subprocess.CompletedProcess[str]:
    argv = ["sft", "--model", tiny_model, "--data", *demo_files, "--output", str(root / "out"), "--config", "tiny",
            "--work-dir", str(root / "work")]
    for item in sets:
        argv += ["--set", item]
    return klear(*argv, env=env, timeout=timeout)


def _refused_before_the_model(done: subprocess.CompletedProcess[str], root: Path) -> str:
    """stdout + stderr of a run refused by the start check: exit 2, one plain message, the model never loaded."""
    text = done.stdout + done.stderr
    assert done.returncode == 2, text[-3000:]
    assert "Traceback" not in text and "klear sft: error: " in done.stderr
    assert "klear.sft: data:" not in text  # logged once the model, tokenizer and data are loaded
    assert not (root / "out" / storage.MANIFEST_NAME).exists()
    return text


def test_unreachable_mlflow_with_a_password_in_its_uri_is_refused_at_once_without_showing_it(
        tiny_model: str, demo_files: list[str], tmp_path: Path) -> None:
    # The chart's Secret may carry the server's address with its credentials; nothing listens on the port.
    port = free_port()
    env = {"MLFLOW_TRACKING_URI": f"http://trainer:{SECRET}@127.0.0.1:{port}", "MLFLOW_TRACKING_TOKEN": SECRET + "-token"}
    # MLflow's own retries take over 4 minutes here: the timeout fails a run that is not refused at once.
    done = _sft(tiny_model, demo_files, tmp_path, "report_to=mlflow", env=env, timeout=120)
    text = _refused_before_the_model(done, tmp_path)
    assert f"MLflow tracking URI 'http://***@127.0.0.1:{port}' (MLFLOW_TRACKING_URI) cannot be used" in done.stderr
    assert "Connection refused" in done.stderr
    assert SECRET not in text


@pytest.mark.parametrize("uri", [f"https://mlflow.example.com/?token={SECRET}", f"https://trainer:{SECRET}@mlflow.example.com"])
def test_credentials_in_the_tracking_uri_setting_are_refused_without_showing_them(
        uri: str, tiny_model: str, demo_files: list[str], tmp_path: Path) -> None:
    done = _sft(tiny_model, demo_files, tmp_path, "report_to=mlflow", f"tracking_uri={uri}", timeout=120)
    text = _refused_before_the_model(done, tmp_path)
    assert "tracking_uri: tracking_uri holds credentials" in done.stderr
    assert SECRET not in text


@pytest.mark.parametrize(("sets", "expected"), [
    (("tracking_uri=file:///tmp/klear-mlruns",), "MLflow tracking URI 'file:///tmp/klear-mlruns' (tracking_uri) is a "
                                                "local file store, which MLflow 3 refuses"),
    ((), "report_to=mlflow: no MLflow tracking server: set tracking_uri, or MLFLOW_TRACKING_URI")])
def test_mlflow_without_a_tracking_server_is_refused_by_name(
        sets: tuple[str, ...], expected: str, tiny_model: str, demo_files: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    done = _sft(tiny_model, demo_files, tmp_path, "report_to=mlflow", *sets, timeout=120)
    _refused_before_the_model(done, tmp_path)
    assert expected in done.stderr


def test_a_file_store_works_when_opted_in(tiny_model: str, demo_files: list[str], tmp_path: Path) -> None:
    store = tmp_path / "mlruns"
    done = _sft(tiny_model, demo_files, tmp_path, "report_to=mlflow", f"tracking_uri={store.as_uri()}", "num_epochs=0.25",
                env={"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_EXPERIMENT_NAME": "klear-file-store"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(store.rglob("metrics/train/loss"))  # MLflow's file store layout: <experiment>/<run>/metrics/<name>


@pytest.mark.parametrize("key", ["", SECRET + "-0123456789abcdef"])
def test_wandb_online_without_an_accepted_key_is_refused_at_once(
        key: str, tiny_model: str, demo_files: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_DISABLED", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    # No ~/.netrc nor W&B settings with a key; with a key: a W&B server address (with credentials) nobody answers at.
    env = {"HOME": str(tmp_path / "home"), "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_DIR": str(tmp_path)}
    if key:
        env |= {"WANDB_API_KEY": key, "WANDB_BASE_URL": f"http://trainer:{SECRET}@127.0.0.1:{free_port()}"}
    done = _sft(tiny_model, demo_files, tmp_path, "report_to=wandb", env=env, timeout=120)
    text = _refused_before_the_model(done, tmp_path)
    if key:
        assert "report_to=wandb: the W&B server could not be reached or refused the key" in done.stderr
    else:
        assert "report_to=wandb: no W&B API key: set WANDB_API_KEY" in done.stderr
    assert SECRET not in text


def test_a_password_in_the_servers_uri_reaches_mlflow_and_no_output(
        mlflow_server: str, tiny_model: str, demo_files: list[str], tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    env = {"MLFLOW_TRACKING_URI": mlflow_server.replace("http://", f"http://trainer:{SECRET}@"),
           "MLFLOW_EXPERIMENT_NAME": "klear-uri-credentials"}
    done = _sft(tiny_model, demo_files, tmp_path, "report_to=mlflow", "num_epochs=0.25", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    # MLflow prints a "View run at <the URI>" line of its own: never with the password.
    assert SECRET not in done.stdout + done.stderr
    assert "klear.tracking: mlflow: MLflow tracking URI 'http://***@127.0.0.1:" in done.stderr
    assert SECRET not in _files_text(tmp_path / "out")
    client = MlflowClient(mlflow_server, registry_uri=mlflow_server)
    experiment = client.get_experiment_by_name("klear-uri-credentials")
    assert experiment is not None and len(client.search_runs([experiment.experiment_id])) == 1


def test_gppo_checks_its_trackers_before_the_model_too(tiny_model: str, demo_files: list[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    done = klear("gppo", "--model", tiny_model, "--data", demo_files[0], "--output", str(tmp_path / "out"),
                 "--config", "tiny-math", "--work-dir", str(tmp_path / "work"), "--set", "report_to=mlflow", timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "klear gppo: error: report_to=mlflow: no MLflow tracking server" in done.stderr
    assert "klear.gppo: data:" not in done.stderr
