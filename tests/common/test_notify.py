"""The exit task's I/O: posting to a real HTTP receiver on loopback (accepted, retried, refused, unreachable; the
address never in a message or a log line) and reading what a run published from a real run folder."""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from klear.common import notify, storage
from tests.conftest import free_port

SECRET_PATH = "/services/T0AAA/B0BBB/xoxSECRETtoken12"


class Receiver:
    """An incoming-webhook stand-in on loopback: answers each POST with the next status of `replies` (then 200) and
    keeps the bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.replies: list[int] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.bodies.append(json.loads(body))
                receiver.paths.append(self.path)
                status = receiver.replies.pop(0) if receiver.replies else 200
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"no")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET_PATH}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *args: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def test_an_accepted_post(receiver: Receiver) -> None:
    waits: list[float] = []
    assert notify.post_json(receiver.address, {"text": "hello"}, sleep=waits.append) == ""
    assert receiver.bodies == [{"text": "hello"}] and receiver.paths == [SECRET_PATH] and waits == []


def test_retries_what_may_pass_later_and_stops_on_a_refusal(receiver: Receiver) -> None:
    waits: list[float] = []
    receiver.replies = [503, 429]
    assert notify.post_json(receiver.address, {"text": "x"}, backoff_s=0.5, sleep=waits.append) == ""
    assert len(receiver.bodies) == 3 and waits == [0.5, 0.0]  # backoff, then the server's Retry-After
    receiver.replies = [500, 500, 500, 500]
    problem = notify.post_json(receiver.address, {"text": "x"}, attempts=3, backoff_s=0.01, sleep=waits.append)
    assert problem == "HTTP 500 Internal Server Error (after 3 attempt(s))" and len(receiver.bodies) == 6
    receiver.replies = [404]
    problem = notify.post_json(receiver.address, {"text": "x"}, sleep=waits.append)
    assert problem == "HTTP 404 Not Found (after 1 attempt(s))" and len(receiver.bodies) == 7


def test_an_unreachable_webhook_is_a_warning_without_its_address(caplog: pytest.LogCaptureFixture) -> None:
    address = f"http://127.0.0.1:{free_port()}{SECRET_PATH}"  # nothing listens there
    with caplog.at_level(logging.INFO, logger="klear.notify"):
        assert notify.notify(address, {"text": "x"}, attempts=2, backoff_s=0.01, timeout_s=2) is False
        assert notify.notify("hooks.slack.com" + SECRET_PATH, {"text": "x"}) is False  # no scheme
    assert "did not take the run's outcome" in caplog.text and "Connection refused" in caplog.text
    assert "xoxSECRET" not in caplog.text and "T0AAA" not in caplog.text and "http://127.0.0.1" in caplog.text


def test_a_posted_outcome_is_logged_by_host(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="klear.notify"):
        assert notify.notify(receiver.address, {"text": "done"}) is True
    assert "posted the run's outcome to the webhook at http://127.0.0.1" in caplog.text
    assert "xoxSECRET" not in caplog.text


def _publish(folder: Path, dest: str, files: dict[str, str], meta: dict) -> None:
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    storage.publish_dir(folder, dest, meta=meta)


def test_what_a_run_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluations with their headline scores, models (oldest first) with the tracker runs of their newest
    checkpoint, and an output started but never published; another run's folder is not looked at."""
    monkeypatch.setenv("KLEAR_RUN_ID", "r1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "runs" / "r1"
    _publish(tmp_path / "l" / "sft", str(run / "sft"), {"model.safetensors": "w"}, {"stage": "sft"})
    for step, ids in ((3, {"mlflow": "old"}), (12, {"mlflow": "9e1f", "wandb": "w1"})):
        _publish(tmp_path / "l" / f"c{step}", str(run / "gppo-code" / "checkpoints" / f"step-{step:09d}"),
                 {"tracking_run.json": json.dumps(ids)}, {"stage": "gppo"})
    config = {"config": {"tracking_uri": "http://alice:pw@mlflow.internal:5000", "report_to": "mlflow"}}
    _publish(tmp_path / "l" / "g", str(run / "gppo-code"), {"report.json": json.dumps(config)}, {"stage": "gppo"})
    _publish(tmp_path / "l" / "e", str(run / "evaluate"), {"report.json": "{}"},
             {"stage": "evaluate", "labels": ["rl", "sft"], "scores": {"rl": {"aime24": 40.0}, "sft": {"aime24": 20.0}}})
    (run / "judge-eval-rl-math").mkdir()
    (run / "judge-eval-rl-math" / "part-0.parquet").write_text("partial")
    (tmp_path / "runs" / "r0" / "evaluate").mkdir(parents=True)  # another run's
    evaluations, models, unfinished = notify.published(str(tmp_path / "runs"), "r1")
    assert [(e.name, e.labels, e.scores["rl"]["aime24"]) for e in evaluations] == [("evaluate", ("rl", "sft"), 40.0)]
    assert [m.name for m in models] == ["sft", "gppo-code"]
    assert (models[1].mlflow_run, models[1].mlflow_link, models[1].wandb_run) == (
        "9e1f", "http://mlflow.internal:5000/#/runs/9e1f", "w1")
    assert models[0].mlflow_run == "" and unfinished == ["judge-eval-rl-math"]
    assert notify.published(str(tmp_path / "runs"), "nothing-here") == ([], [], [])
