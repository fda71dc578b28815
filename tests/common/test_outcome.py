"""The run outcome's pure parts: the state from either runner's status and the Workflow, the failed tasks of a Workflow
shaped as KFP's Argo compiler makes it, the error line of a log, what a run folder holds, and the two renderings
(the Markdown summary, the Slack payload) with their escaping and limits."""

from __future__ import annotations

import json
from typing import Any

from klear.common import outcome
from klear.common.outcome import (
    CANCELLED,
    FAILED,
    SUCCEEDED,
    UNKNOWN,
    FailedNode,
    FailedTask,
    Outcome,
    RunEvaluation,
    RunModel,
)

WF = "klear-reasoner-x7k2p"
BODY = f"{WF}.root.exit-handler-1"


def _driver(key: str, shown: str, phase: str = "Succeeded", parent: str = BODY) -> dict[str, Any]:
    """A container task's driver step: its `task` input is the task's spec, whose taskInfo.name the UI shows."""
    spec = {"taskInfo": {"name": shown}, "componentRef": {"name": f"comp-{key}"}}
    return {"name": f"{parent}.{key}-driver", "displayName": f"{key}-driver", "type": "Pod", "phase": phase,
            "inputs": {"parameters": [{"name": "component", "value": "{}"}, {"name": "task", "value": json.dumps(spec)}]},
            "finishedAt": "2026-01-01T00:00:00Z"}


def _pod(name: str, phase: str, finished: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "displayName": name.rpartition(".")[2], "type": "Pod", "phase": phase, "finishedAt": finished,
            **({"message": message} if message else {})}


def _workflow() -> dict[str, Any]:
    """The run's Workflow as KFP's compiler (backend/src/v2/compiler/argocompiler) lays it out: a container task
    `<key>` is a driver step `<key>-driver` and a DAG `<key>` whose `executor` step is the pod (with retries, a Retry
    node `executor` and pods `executor(N)`); the body of the exit handler is the DAG `exit-handler-1`."""
    nodes = [
        {"name": WF, "displayName": WF, "type": "DAG", "phase": "Running"},
        {"name": f"{WF}.root", "displayName": "root", "type": "DAG", "phase": "Failed"},
        {"name": BODY, "displayName": "exit-handler-1", "type": "DAG", "phase": "Failed"},
        _driver("curate", "curate: dedup + 9-gram decontamination"),
        _pod(f"{BODY}.curate.executor", "Succeeded", "2026-01-01T00:01:00Z"),
        # A slice that failed once and passed on its retry: not a failure of the run.
        _driver("sample-slice", "sample slice: teacher", parent=f"{BODY}.for-loop-2.iteration-iterations(0:0/2)"),
        {"name": f"{BODY}.for-loop-2.iteration-iterations(0:0/2).sample-slice.executor", "type": "Retry",
         "displayName": "executor", "phase": "Succeeded"},
        _pod(f"{BODY}.for-loop-2.iteration-iterations(0:0/2).sample-slice.executor(0)", "Failed",
             "2026-01-01T00:02:00Z", "Error (exit code 1)"),
        _pod(f"{BODY}.for-loop-2.iteration-iterations(0:0/2).sample-slice.executor(1)", "Succeeded",
             "2026-01-01T00:03:00Z"),
        # SFT failed on each of its attempts; the last one's message counts.
        _driver("sft", "sft: long-CoT SFT (TRL, ZeRO-3)"),
        {"name": f"{BODY}.sft.executor", "type": "Retry", "displayName": "executor", "phase": "Failed"},
        _pod(f"{BODY}.sft.executor(0)", "Failed", "2026-01-01T00:05:00Z", "Error (exit code 1)"),
        _pod(f"{BODY}.sft.executor(1)", "Failed", "2026-01-01T00:09:00Z", "OOMKilled (exit code 137)"),
        # A driver that failed (inputs it could not resolve): the task is named by its key.
        _pod(f"{BODY}.judge-driver", "Error", "2026-01-01T00:04:00Z", "failed to resolve inputs"),
    ]
    return {"metadata": {"name": WF}, "status": {"phase": "Running", "nodes": {f"id-{i}": n for i, n in enumerate(nodes)}}}


def test_states_of_both_runners_and_of_the_workflow() -> None:
    assert [outcome.status_state(s) for s in ("SUCCEEDED", "COMPLETE", "FAILED", "CANCELED", "RUNNING", None)] == [
        SUCCEEDED, SUCCEEDED, FAILED, CANCELLED, UNKNOWN, UNKNOWN]
    # KFP 2.17 may report RUNNING for a group with a ParallelFor; the group's Argo phase is final when the exit runs.
    assert outcome.run_state("RUNNING", "Succeeded") == SUCCEEDED
    assert outcome.run_state("RUNNING", "") == UNKNOWN
    assert outcome.run_state("COMPLETE", "Succeeded", [FailedTask("sft")]) == FAILED
    # kfp.local's generic message says nothing the state does not; another message is kept.
    assert outcome.status_message("Task exit-handler-1 failed.", "exit-handler-1") == ""
    assert outcome.status_message("deadline exceeded", "exit-handler-1") == "deadline exceeded"


def test_failed_tasks_of_a_kfp_workflow() -> None:
    workflow = _workflow()
    assert outcome.failed_nodes(workflow) == [
        FailedNode(f"{BODY}.judge-driver", "judge", "failed to resolve inputs"),
        FailedNode(f"{BODY}.sft.executor(1)", "sft: long-CoT SFT (TRL, ZeRO-3)", "OOMKilled (exit code 137)"),
    ]
    assert outcome.group_phase(workflow, "exit-handler-1") == "Failed"
    assert outcome.failed_nodes({"status": {}}) == [] and outcome.group_phase({}, "exit-handler-1") == ""


def test_the_error_of_a_log_is_its_exception_line() -> None:
    traceback = ("2026-01-01T00:00:00.5Z [KFP Executor] Got executor_input\nTraceback (most recent call last):\n"
                 '  File "x.py", line 3, in <module>\n    raise ValueError("bad")\n'
                 "klear.common.config.ConfigError: preset 'tiny': unknown key learning_rat\n"
                 "I0101 00:00:01.000000      17 launcher_v2.go:151] stopping\n")
    assert outcome.error_line(traceback) == "klear.common.config.ConfigError: preset 'tiny': unknown key learning_rat"
    assert outcome.error_line("Error: bad\nRuntimeError\n") == "RuntimeError"
    assert outcome.error_line("starting\n\nkilled by signal 9\n\n") == "killed by signal 9"
    assert outcome.error_line("") == ""
    assert len(outcome.error_line("ValueError: " + "x" * 5000)) == outcome.MESSAGE_LIMIT


def test_what_a_run_folder_holds() -> None:
    names = ["curate/_MANIFEST.json", "curate/curated.jsonl", "sft/checkpoints/step-000000010/_MANIFEST.json",
             "sft/checkpoints/step-000000010/tracking_run.json", "sft/checkpoints/step-000000020/tracking_run.json",
             "sft/checkpoints/step-000000009/tracking_run.json", "evaluate/_MANIFEST.json", "loose.txt"]
    assert outcome.stage_folders(names) == (["curate", "evaluate"], ["sft"])  # sft: checkpoints, no manifest
    assert [bool(outcome.EVALUATION_FOLDERS.match(n)) for n in ("evaluate", "evaluate-code", "evaluate-prompts-math")] \
        == [True, True, False]
    found = outcome.evaluation_of("evaluate", "s3://b/r/evaluate", {"labels": ["rl", "sft"], "scores": {
        "sft": {"aime24": 70.1}, "rl": {"aime24": 83.25, "hmmt25": 60.3}}})
    assert found == RunEvaluation("evaluate", "s3://b/r/evaluate", ("rl", "sft"),
                               {"rl": {"aime24": 83.25, "hmmt25": 60.3}, "sft": {"aime24": 70.1}})
    assert outcome.evaluation_of("evaluate", "u", {"labels": ["rl"]}) is None


def test_links_carry_no_credentials() -> None:
    assert outcome.mlflow_link("https://bob:s3cret@mlflow.example.com:5000/root/?token=abc", "4f2a") == (
        "https://mlflow.example.com:5000/root/#/runs/4f2a")
    assert outcome.mlflow_link("file:///tmp/mlruns", "4f2a") == "" and outcome.mlflow_link("http://m", "") == ""
    assert outcome.kfp_run_link("https://kubeflow.example.com/pipeline/", "3f6c") == (
        "https://kubeflow.example.com/pipeline/#/runs/details/3f6c")
    assert outcome.kfp_run_link("", "3f6c") == ""


def test_the_webhook_address_never_shows() -> None:
    address = "https://hooks.slack.com/services/T0AAA/B0BBB/xoxSECRETtoken12"
    text = (f"HTTPSConnectionPool(host='hooks.slack.com'): Max retries exceeded with url: "
            f"/services/T0AAA/B0BBB/xoxSECRETtoken12 ({address})")
    redacted = outcome.redact_address(text, address)
    assert "xoxSECRET" not in redacted and "T0AAA" not in redacted and "hooks.slack.com" in redacted
    assert outcome.address_host(address) == "https://hooks.slack.com"
    query = "https://chat.example.com/hooks/incoming?token=abcdefgh12345"
    assert "abcdefgh12345" not in outcome.redact_address(f"refused {query}", query)


def _succeeded() -> Outcome:
    return Outcome("klear-reasoner", "3f6c0a52", SUCCEEDED, run_link="https://kubeflow.example.com/#/runs/details/3f6c0a52",
                   evaluations=[RunEvaluation("evaluate", "s3://bucket/runs/3f6c0a52/evaluate", ("rl", "base"),
                                           {"rl": {"aime24": 83.21, "aime25": 75.6}, "base": {"aime24": 10.0}})],
                   models=[RunModel("sft", "s3://bucket/runs/3f6c0a52/sft"),
                           RunModel("gppo-code", "s3://bucket/runs/3f6c0a52/gppo-code", "4f2a",
                                          "https://mlflow.example.com/#/runs/4f2a", "w9")])


def test_markdown_of_a_succeeded_run() -> None:
    text = outcome.render_markdown(_succeeded())
    assert text.startswith("# ✅ klear-reasoner: run succeeded\n")
    assert "[open it in Kubeflow](https://kubeflow.example.com/#/runs/details/3f6c0a52)" in text
    assert "| model | aime24 | aime25 |\n|---|---|---|\n| rl | 83.2 | 75.6 |\n| base | 10.0 | - |" in text
    assert "Report: s3://bucket/runs/3f6c0a52/evaluate/report.html" in text
    assert "- **gppo-code**: s3://bucket/runs/3f6c0a52/gppo-code; MLflow run " \
           "[4f2a](https://mlflow.example.com/#/runs/4f2a); W&B run w9" in text
    assert "What failed" not in text and "not published" not in text and "Not looked at" not in text


def test_markdown_of_a_failed_run_shows_data_as_text() -> None:
    failed = Outcome("klear-reasoner", "r1", FAILED, status_message="quota | exceeded",
                     failed=[FailedTask("sft: <b>x</b>", "ValueError: [click](http://evil) | cell", "Error (exit code 1)")],
                     unfinished=["sft"], notes=["the run's Workflow: 403 forbidden"])
    text = outcome.render_markdown(failed)
    assert text.startswith("# ❌ klear-reasoner: run failed\n")
    assert ("- **sft: &lt;b&gt;x&lt;/b&gt;**: ValueError: &#91;click&#93;(http://evil) &#124; cell "
            "(Error (exit code 1))") in text
    assert "- The run's status: quota &#124; exceeded" in text
    assert "Files without a manifest" in text and ": sft." in text and "- the run's Workflow: 403 forbidden" in text
    assert "Evaluation" not in text and "Models" not in text  # what the run did not produce is left out
    bare = outcome.render_markdown(Outcome("klear-reasoner", "r1", FAILED))
    assert "The run's status names no task" in bare


def test_slack_payload_escapes_links_and_keeps_to_the_limit() -> None:
    payload = outcome.slack_payload(_succeeded())
    lines = payload["text"].split("\n")
    assert lines[0] == ("✅ *klear-reasoner* run `3f6c0a52` succeeded "
                        "(<https://kubeflow.example.com/#/runs/details/3f6c0a52|open in Kubeflow>)")
    assert "*evaluate* (rl, pass@1 %): aime24 83.2 · aime25 75.6" in lines
    assert "*Model gppo-code:* `s3://bucket/runs/3f6c0a52/gppo-code` · <https://mlflow.example.com/#/runs/4f2a|MLflow run>" \
        in lines
    hostile = Outcome("p<&>", "r`1", FAILED, failed=[FailedTask(f"task {i} <!channel>", "Boom: " + "y" * 400)
                                                     for i in range(60)])
    text = outcome.slack_payload(hostile)["text"]
    assert len(text) <= outcome.SLACK_TEXT_LIMIT and text.endswith("more line(s) in the run's summary")
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text and "*p&lt;&amp;&gt;* run `r'1` failed" in text
    assert len(outcome.slack_payload(hostile, limit=200)["text"]) <= 200
