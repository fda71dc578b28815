"""Experiment tracking of the training stages: MLflow and W&B through transformers' own callbacks, a progress line
in the log, and the training curves as a self-contained HTML page.

One naming scheme for every tracker and the curves: `train/...` (the update: loss, lr, grad norm, clip fractions,
entropy, KL), `rollout/...` (generation: response lengths, truncation, group filtering, tokens/s), `reward/...`
(scores, per task, and the reward workers) and `val/...` (validation during RL). TensorBoard keeps transformers'
names (`train/<logged key>`): its files are also what a resumed run continues.

Credentials never pass through a config: MLflow and W&B read theirs from the environment (MLFLOW_TRACKING_USERNAME,
MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN, WANDB_API_KEY; or user:password@ in MLFLOW_TRACKING_URI), which the
chart fills from a Secret, and no message shows them (`redact`). The trackers are checked before the model loads
(`check_trackers`: reachable, authorised, the experiment there), with bounded retries. A run's tracker ids are kept
with every checkpoint (`tracking_run.json`), so a resumed stage continues the same run; only rank 0 reports
(transformers' callbacks check it). They are published with the model too (RUN_RECORD, `logs/tracking_run.json`, with
the MLflow experiment and the run's page), where its model card and `klear register` find the run.

Katib (hyperparameter search) reads the log: every logged row is also written to stderr as one metrics line,
`<RFC 3339 time> klear-metrics step=12 train-loss=0.41 reward-mean=0.3 ...`, the row's figures under their Katib
names (`katib_name`: `val/pass@1` -> `val-pass-at-1`), which Katib's StdOut collector reads with its default filter.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import io
import json
import logging
import math
import os
import re
import sys
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic

from klear.common.config import clip

log = logging.getLogger("klear.tracking")

TRACKERS = ("tensorboard", "mlflow", "wandb")
RUN_FILE = "tracking_run.json"  # the tracker run ids, in every checkpoint folder
# The run's record published with the model (the training logs/ folder is published with it): the ids, and the MLflow
# run's experiment and address, so the model card and `klear register` find the run the model came from.
RUN_RECORD = f"logs/{RUN_FILE}"
CURVES_FILE = "curves.html"
HISTORY_FILE = "history.jsonl"  # the scheme-named rows the curves are drawn from, continued on resume
# What the chart's tracking Secret may hold; read by MLflow and W&B themselves, never by a config.
SECRET_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY")
# Addresses a Secret may also set (a server's URI is not secret, but may be kept beside its credentials).
SECRET_ADDRESS_KEYS = ("MLFLOW_TRACKING_URI", "WANDB_BASE_URL")
# The chart's Secret of them (charts/klear-reasoner: tracking.secretName); every key optional, the Secret too.
TRACKING_SECRET = "klear-tracking"
TRACKING_SECRET_KEYS = SECRET_KEYS + SECRET_ADDRESS_KEYS
# The Secret's values no message may show (a user name is no secret, and would garble every word it matches).
REDACTED_KEYS = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY")
REDACTED = "***"
ERROR_LIMIT = 600  # characters of a tracker's error in a message (MLflow's carry the response body)
# URL query parameters that carry credentials (token=, api_key=, password=, X-Amz-Signature=, ...).
_SECRET_WORDS = "token|key|secret|passw|pwd|signature|credential|auth"
SECRET_PARAMETER = re.compile(_SECRET_WORDS, re.IGNORECASE)
_SECRET_QUERY = re.compile(rf"([?&;][^=&#\s]*(?:{_SECRET_WORDS})[^=&#\s]*=)[^&#\s'\"]*", re.IGNORECASE)  # name= kept
_USERINFO = re.compile(r"(?<=://)[^/?#\s]*@")
# Shorter values would blank out common words of every message (a password "mlflow"); MLflow and W&B show a
# credential inside a URL, which is redacted by pattern whatever its length.
_SHORTEST_REDACTED = 8
# The start check's MLflow requests: one retry, 10 s each, instead of MLflow's 7 retries with backoff (4 min+).
MLFLOW_CHECK_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
WANDB_QUIET_MODES = ("offline", "dryrun", "disabled")  # W&B modes that need no server nor key
# The callbacks' hooks that talk to a tracker: their errors are re-raised redacted.
TRACKER_HOOKS = ("setup", "on_train_begin", "on_log", "on_save", "on_train_end")

# Logged key -> scheme name. Keys not listed become train/<key>; keys already in the scheme stay.
SCHEME = {
    "loss": "train/loss", "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
    "tokens_per_second": "train/tokens_per_second", "packing_efficiency": "train/packing_efficiency",
    "num_tokens": "train/tokens", "mean_token_accuracy": "train/token_accuracy", "epoch": "train/epoch",
    "policy_loss": "train/policy_loss", "sft_nll": "train/sft_nll", "entropy": "train/entropy",
    "approx_kl": "train/kl_old_policy", "clip_frac_low": "train/clip_frac_low", "clip_frac_high": "train/clip_frac_high",
    "gradient_kept_frac": "train/gradient_kept_frac", "ratio_mean": "train/ratio_mean", "ratio_max": "train/ratio_max",
    "time/update_s": "train/update_s", "step_time": "train/step_s",
    "reward": "reward/mean", "reward_std": "reward/std", "accuracy": "reward/accuracy",
    "reward_timeouts": "reward/timeouts", "reward_errors": "reward/errors", "time/rewards_s": "reward/worker_s",
    "completions/mean_length": "rollout/response_length_mean", "completions/max_length": "rollout/response_length_max",
    "completions/min_length": "rollout/response_length_min", "completions/clipped_ratio": "rollout/truncated_frac",
    "groups_filtered_frac": "rollout/zero_advantage_groups_frac",
    "frac_reward_zero_std": "rollout/zero_std_groups_frac", "fill_ratio": "rollout/fill_ratio",
    "refill_rounds": "rollout/refill_rounds", "time/generation_s": "rollout/generation_s",
    "rollout_tokens_per_second": "rollout/tokens_per_second", "num_tokens_generated": "rollout/tokens",
}
SCHEME_PREFIXES = ("train/", "rollout/", "reward/", "val/")
# The figures a progress line shows, when logged.
PROGRESS_FIGURES = ("train/loss", "reward/mean", "reward/accuracy", "rollout/response_length_mean", "train/grad_norm",
                    "train/tokens_per_second", "val/pass@1")
# Katib's StdOut and File (TEXT) collectors find `name=value` pairs in a line with the filter
# `([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)` (kubeflow/katib pkg/metricscollector/v1beta1/common/const.go,
# DefaultFilter) and read a line's first word as its time when it parses as RFC 3339, else the time is unknown
# (pkg/metricscollector/v1beta1/file-metricscollector/file-metricscollector.go, parseLogsInTextFormat): names are
# word characters, '|' and '-', and the time first, so that an Experiment's `latest` strategy takes the last value.
KATIB_TAG = "klear-metrics"  # the second word of a metrics line: what to grep for
_KATIB_REPLACED = re.compile(r"[^A-Za-z0-9_]")
_KATIB_SEPARATORS = {"/": "-", "@": "-at-"}  # everything else outside [A-Za-z0-9_] becomes "_"


class TrackingSettings(pydantic.BaseModel):
    """Experiment tracking keys of a training stage's config (sft, gppo)."""

    report_to: str = pydantic.Field(
        "tensorboard", description="comma-separated trackers: tensorboard (always written to the output's logs/), "
        "mlflow, wandb; 'none' = logs/ only")
    tracking_uri: str = pydantic.Field(
        "", description="MLflow tracking server; '' = MLFLOW_TRACKING_URI (e.g. from the chart's Secret) or MLflow's "
        "default. No credentials here: they come from the environment")
    experiment: str = pydantic.Field("", description="MLflow experiment / W&B project; '' = MLFLOW_EXPERIMENT_NAME / WANDB_PROJECT")
    run_name: str = pydantic.Field("", description="'' = <stage> <the output's last two path parts>")
    progress_seconds: float = pydantic.Field(60.0, gt=0, description="a progress line in the log every N seconds")

    @pydantic.field_validator("report_to")
    @classmethod
    def _known_trackers(cls, value: str) -> str:
        parse_report_to(value)
        return value

    @pydantic.model_validator(mode="before")
    @classmethod
    def _redacted_uri(cls, data: Any) -> Any:
        # A config error quotes the value it refuses: it gets the tracking_uri redacted (refused below all the same).
        # By pattern only: a Secret's value that happens to be in a good URI must not change it.
        if isinstance(data, dict) and isinstance(data.get("tracking_uri"), str):
            return {**data, "tracking_uri": redact(data["tracking_uri"], environ={})}
        return data

    @pydantic.field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, value: str) -> str:
        found = uri_credentials(value)
        if found:
            raise ValueError(f"tracking_uri holds credentials ({', '.join(found)}): put them in the tracking Secret "
                             "(MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN), never in a config")
        return value


class TrackingError(RuntimeError):
    """A tracker that cannot be used (unreachable, refused, no key) or failed during the run; the message is redacted."""


# --------------------------------------------------------------------------- pure parts


def parse_report_to(value: str) -> tuple[str, ...]:
    """The trackers named in `report_to` ('none' = none beyond TensorBoard); unknown names are errors."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in value.split(",") if n.strip()))
    if names == ("none",):
        return ()
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or not names:
        raise ValueError(f"report_to {value!r}: expected a comma-separated list of {', '.join(TRACKERS)}, or 'none'")
    return names


def uri_credentials(uri: str) -> list[str]:
    """What in `uri` is a credential: 'user:password@', 'query parameter token', ...; [] for none."""
    parsed = urllib.parse.urlsplit(uri)
    found = ["user:password@"] if "@" in parsed.netloc else []
    return found + [f"query parameter {name}" for name, _ in urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)
                    if SECRET_PARAMETER.search(name)]


def secret_values(environ: Mapping[str, str]) -> set[str]:
    """The secrets of the tracking Secret in `environ`: its passwords, tokens and keys, and those inside its
    addresses (user:password@, token queries; as written and percent-decoded)."""
    values = {environ.get(key, "") for key in REDACTED_KEYS}
    for key in SECRET_ADDRESS_KEYS:
        parsed = urllib.parse.urlsplit(environ.get(key, ""))
        values |= {parsed.password or "", urllib.parse.unquote(parsed.password or "")}
        values |= {v for k, v in urllib.parse.parse_qsl(parsed.query) if SECRET_PARAMETER.search(k)}
    return {v for v in values if len(v) >= _SHORTEST_REDACTED}


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` without credentials: a URL's user:password@ and token-like query values become ***, and so does every
    secret value of the tracking Secret in `environ` (default: this process's environment)."""
    text = _USERINFO.sub(REDACTED + "@", text)
    text = _SECRET_QUERY.sub(lambda m: m.group(1) + REDACTED, text)
    for value in sorted(secret_values(os.environ if environ is None else environ), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def scheme_name(key: str) -> str:
    """The scheme name (train/, rollout/, reward/, val/) of a key the Trainer logged."""
    if key in SCHEME:
        return SCHEME[key]
    if key.startswith(SCHEME_PREFIXES):
        return key
    if key.startswith("rewards/"):  # TRL: rewards/<function>/mean
        return "reward/" + key.removeprefix("rewards/")
    if key.startswith("completions/"):  # TRL's other length figures
        return "rollout/" + key.removeprefix("completions/")
    if key.startswith("sampling/"):  # TRL: vLLM vs trainer log-probs, importance weights
        return "rollout/" + key
    return "train/" + key


def scheme_logs(logs: Mapping[str, Any]) -> dict[str, float]:
    """The numeric, finite entries of a log row under their scheme names."""
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
            out[scheme_name(key)] = float(value)
    return out


def katib_name(name: str) -> str:
    """The name Katib reads for a scheme name: '/' becomes '-', '@' becomes '-at-', '-' and every other character
    but ASCII letters, digits and '_' become '_' ('val/pass@1' -> 'val-pass-at-1', 'train/grad_norm' ->
    'train-grad_norm', 'val/lcb-v5/pass@1' -> 'val-lcb_v5-pass-at-1'). A '-' comes from '/' or '@' only, so the
    scheme's names stay apart (tests check the names the stages log) and read back: '-at-' is '@', '-' is '/'."""
    return _KATIB_REPLACED.sub(lambda m: _KATIB_SEPARATORS.get(m.group(), "_"), name)


def katib_line(step: int, figures: Mapping[str, float], now: dt.datetime) -> str:
    """'2025-06-01T12:00:00.000000Z klear-metrics step=12 train-loss=0.41 ...': the figures of one logged row (scheme
    names) for Katib, at `now` (UTC). Values as Python writes a float (repr: exact, and all of it matched by
    Katib's number pattern); the caller leaves out what is not finite."""
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    pairs = " ".join(f"{katib_name(name)}={float(value)!r}" for name, value in figures.items())
    return f"{stamp} {KATIB_TAG} step={int(step)}" + (f" {pairs}" if pairs else "")


def default_run_name(stage: str, output: str) -> str:
    parts = [p for p in output.rstrip("/").split("/") if p and not p.endswith(":")]
    return f"{stage} {'/'.join(parts[-2:])}".strip()


def public_address(uri: str) -> str:
    """An http(s) tracking URI as a browser may be sent to it: no user:password@, query or fragment; "" for any
    other kind of URI (a file store, databricks, ...), which has no page to link to."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return ""
    host = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
    netloc = f"{host}:{parsed.port}" if parsed.port else host
    return urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path.rstrip("/"), "", ""))


def mlflow_run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI page of a run (no credentials in it); "" when the tracking URI is no web server."""
    base = public_address(tracking_uri)
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}" if base and experiment_id and run_id else ""


def run_record(ids: Mapping[str, str], experiment_id: str = "", tracking_uri: str = "") -> dict[str, str]:
    """What RUN_RECORD holds: the tracker run ids (`mlflow`, `wandb`), and for MLflow its experiment and the run's
    page (`mlflow_experiment_id`, `mlflow_url`)."""
    record = dict(ids)
    if ids.get("mlflow"):
        record["mlflow_experiment_id"] = experiment_id
        record["mlflow_url"] = mlflow_run_url(tracking_uri, experiment_id, ids["mlflow"])
    return record


def read_run_record(output: str) -> dict[str, str]:
    """The tracker run a published model was trained in: its RUN_RECORD; for a model published before the record
    was, the ids its newest checkpoint kept. {} when it was trained without MLflow or W&B."""
    from klear.common import storage

    root = storage.Uri.parse(output)
    if RUN_RECORD in storage.read_manifest(root).files:
        where = root.join(RUN_RECORD)
    else:
        # Checkpoints (`checkpoints/step-000000120/`) are outputs of their own: only a complete one's list counts.
        steps = sorted({name.split("/")[0] for name in storage.list_files(root.join("checkpoints"))}, reverse=True)
        newest = next((step for step in steps if storage.exists(root.join("checkpoints", step, storage.MANIFEST_NAME))
                       and RUN_FILE in storage.read_manifest(root.join("checkpoints", step)).files), None)
        if newest is None:
            return {}
        where = root.join("checkpoints", newest, RUN_FILE)
    try:
        data = json.loads(storage.read_bytes(where))
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object of tracker run ids, not {type(data).__name__}")
    return {str(key): str(value) for key, value in data.items() if value}


def run_environment(settings: TrackingSettings, trackers: Sequence[str], resumed: Mapping[str, str],
                    environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Environment for transformers' MLflow / W&B callbacks: the config's address and experiment (when given; else
    MLflow's and W&B's own variables apply), and the run ids of a resumed run, so it continues the same run."""
    env: dict[str, str] = {}
    if "mlflow" in trackers:
        if settings.tracking_uri:
            env["MLFLOW_TRACKING_URI"] = settings.tracking_uri
        if uri_credentials(environ.get("MLFLOW_TRACKING_URI", "")):
            env["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"  # MLflow prints its "View run at" URL, password included
        if settings.experiment:
            env["MLFLOW_EXPERIMENT_NAME"] = settings.experiment
        if resumed.get("mlflow"):
            env["MLFLOW_RUN_ID"] = resumed["mlflow"]
    if "wandb" in trackers:
        if settings.experiment:
            env["WANDB_PROJECT"] = settings.experiment
        if resumed.get("wandb"):
            env["WANDB_RUN_ID"], env["WANDB_RESUME"] = resumed["wandb"], "allow"
    return env


def format_duration(seconds: float | None) -> str:
    """'h:mm:ss' of every progress line (training steps, sampled units); '?' when not known yet."""
    if seconds is None:
        return "?"
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def progress_line(step: int, total: int, elapsed: float, steps_done: int, figures: Mapping[str, float]) -> str:
    """'step 12/400 (3%), elapsed 0:10:00, ETA 5:23:00, train/loss 0.41, ...'; the ETA from this attempt's pace
    (`steps_done` steps in `elapsed` seconds: a resumed run's earlier steps took no time here)."""
    share = f" ({100 * step / total:.0f}%)" if total > 0 else ""
    eta = format_duration((total - step) * elapsed / steps_done) if steps_done > 0 and total >= step else "?"
    shown = ", ".join(f"{key} {figures[key]:.4g}" for key in PROGRESS_FIGURES if key in figures)
    return f"step {step}/{total}{share}, elapsed {format_duration(elapsed)}, ETA {eta}" + (f", {shown}" if shown else "")


# --------------------------------------------------------------------------- start check


def check_trackers(settings: TrackingSettings) -> None:
    """Refuse in the first seconds, before the model loads, a tracker the run could not report to: no MLflow server,
    or one unreachable, refusing the credentials or the experiment; W&B online without a key, or refusing it. From
    here on no log line or warning of this process shows a credential."""
    redact_output()
    trackers = parse_report_to(settings.report_to)
    if "mlflow" in trackers:
        check_mlflow(settings)
    if "wandb" in trackers:
        check_wandb()


def mlflow_uri(settings: TrackingSettings, environ: Mapping[str, str]) -> tuple[str, str]:
    """The tracking URI the run's MLflow callback uses, and where it comes from (for messages)."""
    if settings.tracking_uri:
        return settings.tracking_uri, "tracking_uri"
    return environ.get("MLFLOW_TRACKING_URI", ""), "MLFLOW_TRACKING_URI"


def is_file_store(uri: str) -> bool:
    """A local MLflow file store: a path or a file:// URI."""
    return urllib.parse.urlsplit(uri).scheme in ("", "file")


def check_mlflow(settings: TrackingSettings) -> None:
    uri, source = mlflow_uri(settings, os.environ)
    if not uri:  # MLflow's default, ./mlflow.db, needs the full MLflow (not the image's client) and dies with the pod
        raise TrackingError("report_to=mlflow: no MLflow tracking server: set tracking_uri, or MLFLOW_TRACKING_URI (e.g. "
                            f"in the chart's Secret {TRACKING_SECRET})")
    where = f"MLflow tracking URI {redact(uri)!r} ({source})"
    if is_file_store(uri) and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        raise TrackingError(f"report_to=mlflow: {where} is a local file store, which MLflow 3 refuses (and a pod loses "
                            "with its disk): use a tracking server, http(s)://host:port; MLFLOW_ALLOW_FILE_STORE=true "
                            "opts in to a file store for a local run")
    name = settings.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", "")
    try:
        from mlflow.tracking import MlflowClient

        with _environment(MLFLOW_CHECK_ENV):
            client = MlflowClient(tracking_uri=uri)
            # No name: start_run uses MLFLOW_EXPERIMENT_ID, or the store's Default experiment (an error if missing).
            experiment = (client.get_experiment_by_name(name) if name else
                          client.get_experiment(os.environ.get("MLFLOW_EXPERIMENT_ID", "0")))
            if experiment is None:
                client.create_experiment(name)  # what the callback would do at train begin; proves write access
                log.info("mlflow: created experiment %r", name)
    except Exception as exc:  # noqa: BLE001 - any failure of the check; MLflow's name the URL, user:password@ included
        raise TrackingError(f"report_to=mlflow: {where} cannot be used (reachable, authorised, experiment "
                            f"{name or 'Default'!r}): {_error_text(exc)}") from None
    if experiment is not None and experiment.lifecycle_stage == "deleted":
        raise TrackingError(f"report_to=mlflow: experiment {experiment.name!r} is deleted at {where}: restore it, or "
                            "name another (experiment, MLFLOW_EXPERIMENT_NAME)")
    log.info("mlflow: %s reachable, experiment %r", where, name or "Default")


def check_wandb() -> None:
    """W&B online needs a key its server accepts; the offline and disabled modes need neither."""
    try:
        import wandb
    except ImportError as exc:
        raise TrackingError(f"report_to=wandb: {exc}") from None
    try:
        if wandb.setup().settings.mode in WANDB_QUIET_MODES:
            return
        # Verified with the server (W&B's own 10 s timeout); no prompt: a pod has no terminal.
        if not wandb.login(verify=True, prompt=False):
            raise TrackingError("report_to=wandb: no W&B API key: set WANDB_API_KEY (e.g. in the chart's Secret "
                                f"{TRACKING_SECRET}) or run `wandb login`; WANDB_MODE=offline keeps the run in local "
                                "files without one")
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 - W&B raises many kinds; the message is redacted
        raise TrackingError(f"report_to=wandb: the W&B server could not be reached or refused the key: "
                            f"{_error_text(exc)}") from None
    finally:
        # A fresh W&B session for the run: W&B reads the environment once per session, and the run sets its
        # project and resumed id at train begin.
        wandb.teardown()


def _error_text(exc: BaseException) -> str:
    """A tracker's error for one message: redacted, and cut (MLflow's carry the response body)."""
    return clip(redact(str(exc)), ERROR_LIMIT)


def _restore(saved: Mapping[str, str | None]) -> None:
    """The environment variables as `saved` holds them (None: unset)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        _restore(saved)


def redact_output() -> None:
    """Every log record and warning of this process from now on, of any library, is redacted (MLflow, urllib3 and
    transformers log the tracking URI; a traceback logged with exc_info too)."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "redacting", False):
        return

    def redacted_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            record.msg, record.args = redact(record.getMessage()), ()
        except Exception:  # noqa: BLE001 - a message that does not format: logging reports it when it emits
            return record
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    redacted_record.redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacted_record)
    format_warning = warnings.formatwarning
    warnings.formatwarning = lambda *args, **kwargs: redact(format_warning(*args, **kwargs))


def _redacting(tracker: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A tracker callback's hook whose failure during the run surfaces as a TrackingError with a redacted message."""
    def wrap(hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hook)
        def redacted(*args: Any, **kwargs: Any) -> Any:
            try:
                return hook(*args, **kwargs)
            except TrackingError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: it is re-raised, redacted
                raise TrackingError(f"{tracker}: {_error_text(exc)}") from None
        return redacted
    return wrap


# --------------------------------------------------------------------------- curves


def curve_groups(rows: Sequence[Mapping[str, float]]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{prefix: {name: [(step, value), ...]}} of scheme-named rows that carry a `step`."""
    groups: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for row in rows:
        for name, value in row.items():
            if name == "step" or "/" not in name:
                continue
            groups.setdefault(name.split("/")[0], {}).setdefault(name, []).append((row["step"], value))
    return groups


def render_curves(rows: Sequence[Mapping[str, float]], title: str) -> str:
    """A self-contained HTML page (PNG figures inline) with one small chart per logged figure, by group."""
    import matplotlib

    matplotlib.use("Agg")  # no display in a pod
    import matplotlib.pyplot as plt

    sections = []
    for group, curves in sorted(curve_groups(rows).items()):
        names = sorted(curves)
        columns = min(3, len(names))
        fig, axes = plt.subplots(math.ceil(len(names) / columns), columns, figsize=(4.2 * columns, 2.8 * math.ceil(len(names) / columns)),
                                 squeeze=False)
        for ax, name in zip(axes.flat, names):
            points = sorted(curves[name])
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o" if len(points) < 30 else None, markersize=3)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(names):]:
            ax.set_visible(False)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        plt.close(fig)
        image = base64.b64encode(buffer.getvalue()).decode()
        latest = "".join(f"<tr><td>{name}</td><td>{sorted(curves[name])[-1][1]:.4g}</td><td>{int(sorted(curves[name])[-1][0])}"
                         "</td></tr>" for name in names)
        sections.append(f'<h2>{group}</h2>\n<img alt="{group} curves" src="data:image/png;base64,{image}">\n'
                        f"<table><tr><th>figure</th><th>latest</th><th>at step</th></tr>{latest}</table>")
    body = "\n".join(sections) or "<p>No figures logged yet.</p>"
    steps = max((int(r["step"]) for r in rows), default=0)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>"
            "<style>body{font-family:sans-serif;margin:1.5em}img{max-width:100%}td,th{padding:0 1em 0 0;text-align:left}"
            "</style></head>\n"
            f"<body><h1>{title}</h1><p>Up to step {steps}.</p>\n{body}\n</body></html>\n")


def publish_curves(output: str, html_path: str) -> None:
    """The KFP HTML artifact: the published stage's `logs/curves.html` (its checkpoints keep a copy each, in
    `tensorboard/`, for a run that failed before publishing)."""
    from klear.common import storage

    uri = storage.Uri.parse(output).join("logs", CURVES_FILE)
    page = storage.read_bytes(uri) if storage.exists(uri) else render_curves([], "no curves logged").encode()
    Path(html_path).write_bytes(page)


# --------------------------------------------------------------------------- callbacks


def _callbacks() -> tuple[type, type, type]:
    from transformers import TrainerCallback
    from transformers.integrations import MLflowCallback, WandbCallback

    class SchemeMLflow(MLflowCallback):
        """transformers' MLflow callback with the scheme's metric names."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, model: Any = None, **kwargs: Any) -> None:
            super().on_log(args, state, control, scheme_logs(logs or {}), model=model, **kwargs)

    class SchemeWandb(WandbCallback):
        """transformers' W&B callback with the scheme's metric names (its own would prefix every name with train/)."""

        def on_log(self, args: Any, state: Any, control: Any, model: Any = None, logs: Any = None, **kwargs: Any) -> None:
            if self._wandb is None:
                return
            if not self._initialized:
                self.setup(args, state, model)
            if state.is_world_process_zero:
                self._wandb.log({**scheme_logs(logs or {}), "train/global_step": state.global_step})

    return TrainerCallback, _redacted_hooks(SchemeMLflow, "MLflow"), _redacted_hooks(SchemeWandb, "W&B")


def _redacted_hooks(cls: type, tracker: str) -> type:
    for name in TRACKER_HOOKS:
        setattr(cls, name, _redacting(tracker)(getattr(cls, name)))
    return cls


def install(trainer: Any, settings: TrackingSettings, stage: str, output: str, logs_dir: Path) -> Any:
    """Add the tracking callbacks to `trainer` (built with report_to='none'); returns the RunTracker."""
    base, mlflow_callback, wandb_callback = _callbacks()
    trackers = parse_report_to(settings.report_to)
    trainer.args.run_name = settings.run_name or default_run_name(stage, output)
    tracker = _run_tracker(base)(settings, trackers, stage, logs_dir)
    trainer.add_callback(tracker)  # before the integrations: it sets their environment at train begin
    if "mlflow" in trackers:
        trainer.add_callback(mlflow_callback())
    if "wandb" in trackers:
        trainer.add_callback(wandb_callback())
    trainer.add_callback(_restorer(base)(tracker))  # after the integrations have closed their runs
    return tracker


def _restorer(base: type) -> type:
    class RestoreEnvironment(base):
        def __init__(self, tracker: Any) -> None:
            self.tracker = tracker

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if "wandb" in self.tracker.trackers and state.is_world_process_zero:
                import wandb

                if wandb.run is not None:  # transformers leaves it open; a resumed attempt reopens it by id
                    wandb.finish()
            self.tracker.restore_environment()

    return RestoreEnvironment


def _run_tracker(base: type) -> type:
    class RunTracker(base):
        """Sets the trackers' environment (resumed run ids), keeps the ids and the curves with every checkpoint,
        logs a progress line every `progress_seconds`."""

        def __init__(self, settings: TrackingSettings, trackers: Sequence[str], stage: str, logs_dir: Path) -> None:
            self.settings, self.trackers, self.stage, self.logs_dir = settings, tuple(trackers), stage, logs_dir
            self.rows: list[dict[str, float]] = []
            self.latest: dict[str, float] = {}
            self._saved_env: dict[str, str | None] = {}
            self._started = self._last_line = time.monotonic()
            self._first_step = 0

        # -- run identity
        @_redacting("tracking")  # W&B's resumed run is opened here
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._started = self._last_line = time.monotonic()
            self._first_step = state.global_step
            resumed: dict[str, str] = {}
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / RUN_FILE
            if state.global_step > 0 and path.is_file():
                resumed = json.loads(path.read_text())
                log.info("continuing tracker run(s) %s", ", ".join(f"{k} {v}" for k, v in resumed.items()))
            for key, value in run_environment(self.settings, self.trackers, resumed).items():
                self._saved_env.setdefault(key, os.environ.get(key))
                os.environ[key] = value
            if "wandb" in self.trackers and resumed.get("wandb") and state.is_world_process_zero:
                import wandb

                # Opened here by id: W&B reads WANDB_RUN_ID once per process; transformers' callback takes an open run.
                if wandb.run is None:
                    wandb.init(project=os.environ.get("WANDB_PROJECT", "huggingface"), id=resumed["wandb"], resume="allow",
                               name=args.run_name)
            history = self.logs_dir / HISTORY_FILE
            # The curves so far, restored with the TensorBoard logs of the checkpoint this run resumes.
            if state.is_world_process_zero and state.global_step > 0 and history.is_file():
                self.rows = [json.loads(line) for line in history.read_text().splitlines() if line.strip()]
                self.rows = [r for r in self.rows if r.get("step", 0) <= state.global_step]

        def run_ids(self) -> dict[str, str]:
            ids = {}
            if "mlflow" in self.trackers:
                import mlflow

                active = mlflow.active_run()
                if active is not None:
                    ids["mlflow"] = active.info.run_id
            if "wandb" in self.trackers:
                import wandb

                if wandb.run is not None:
                    ids["wandb"] = wandb.run.id
            return ids

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not state.is_world_process_zero:
                return
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                (folder / RUN_FILE).write_text(json.dumps(self.run_ids()))
            self.write_curves()
            self.write_run_record()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:
                self.write_curves()
                self.write_run_record()  # before the MLflow callback (added after this one) ends its run

        def write_run_record(self) -> None:
            """RUN_RECORD in the logs folder, which the model is published with (nothing without MLflow or W&B)."""
            ids = self.run_ids()
            if not ids:
                return
            experiment, uri = "", ""
            if ids.get("mlflow"):
                import mlflow

                active = mlflow.active_run()
                experiment = active.info.experiment_id if active is not None else ""
                uri = mlflow.get_tracking_uri()
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            (self.logs_dir / RUN_FILE).write_text(json.dumps(run_record(ids, experiment, uri)))

        def restore_environment(self) -> None:
            _restore(self._saved_env)
            self._saved_env = {}

        # -- curves and progress
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if not state.is_world_process_zero or not logs:
                return
            row = scheme_logs({k: v for k, v in logs.items() if not k.startswith("train_")})  # not the run's summary
            if row:
                self.latest.update(row)
                self.rows.append({"step": float(state.global_step), **row})
                # Each row once, at the time it was logged (validation rows too): Katib's observations are the curves.
                # Straight to stderr, not through logging: the time must be the line's first word.
                print(katib_line(state.global_step, row, dt.datetime.now(dt.UTC)), file=sys.stderr, flush=True)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            now = time.monotonic()
            if not state.is_world_process_zero:
                return
            if now - self._last_line >= self.settings.progress_seconds or state.global_step == state.max_steps:
                self._last_line = now
                log.info("%s: %s", self.stage, progress_line(state.global_step, state.max_steps, now - self._started,
                                                             state.global_step - self._first_step, self.latest))

        def write_curves(self) -> None:
            """curves.html and history.jsonl into the TensorBoard folder: published with every checkpoint and the model."""
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            (self.logs_dir / HISTORY_FILE).write_text("".join(json.dumps(r) + "\n" for r in self.rows))
            (self.logs_dir / CURVES_FILE).write_text(render_curves(self.rows, f"{self.stage}: training curves"))

    return RunTracker
