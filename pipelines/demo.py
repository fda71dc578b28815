"""`make demo`: the klear-reasoner pipeline end to end on this machine's CPU, with a tiny model that learns.

    python -m pipelines.demo [--workdir runs/demo] [--no-s3] [--quick] [--reuse] [--arg KEY=VALUE ...]
                             [--tracking-uri URI [--register-name NAME]]

1. Starts a real SeaweedFS S3 server on loopback (the pip-installed `weed`) and puts every stage output
   there; `--no-s3` (or KLEAR_DEMO_NO_S3=1) uses plain folders under the workdir instead.
2. Prepares the inputs: the demo's synthetic sources with worked solutions (`klear demo-data`), the tiny
   base model built in code, and the held-out demo benchmark (never trained on; curate checks it).
3. Runs the compiled `klear-reasoner` pipeline itself (the DAG a cluster runs, not a separate wiring) under
   kfp.local with the demo presets. The teacher is the `records` backend of `klear sample` on the sources'
   shipped worked traces: a real backend, and the only teacher that fits a CPU (a tiny model cannot teach).
   Every sampling use runs as a cluster runs it: a ParallelFor of slice tasks (two for the teacher and the
   reference model), then a merge.
4. Prints the evaluation of base -> SFT -> RL on the held-out benchmark and writes <workdir>/summary.json:
   {"base": {"pass@1", "stderr"}, "sft": {...}, "rl": {...}, "validation": [{"step", "pass@1", "stderr"}, ...] (math
   RL's validation curve), "seconds": {stage: s, ...}} (percent), and
   <workdir>/lineage.json (.txt): the chain from that evaluation back to the demo's sources (`klear lineage`),
   and <workdir>/model-card.md: the RL model's card (README.md in its folder) with those scores.

`--tracking-uri URI` (an MLflow tracking server; credentials, if any, in the environment as for training) makes SFT and
both RL runs report to MLflow (experiment MLFLOW_EXPERIMENT_NAME, default klear-demo) and registers the RL and SFT
models as the pipeline's last steps (`register_model_name`: `--register-name`, default klear-demo, and
klear-demo-sft), with the evaluation's scores; the versions go into summary.json under "registered".

`--reuse` runs as a second run of a cluster does: the same store, inputs and run root as the workdir's earlier
`--reuse` demo, with KFP's cache on, so every task whose inputs and settings are unchanged is served from the
earlier run (its output stays in that run's folder) and the table says which; `--arg gppo_code_overrides=[...]`
changes one pipeline argument (JSON values).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

# One intra-op thread per process: the tiny model's ops take microseconds, so a second thread only adds
# synchronisation and oversubscribes the 2 cores shared with reward workers and the S3 server (a decode step:
# 340 ms with 2 threads under load, 6 ms with 1). Before torch is imported; kfp.local's tasks inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from klear.common import storage  # noqa: E402

BUCKET = "klear-demo"
SOURCE_FILES = ["arithmetic.jsonl#prompt=problem"]  # the demo's learnable task, with worked solutions
LABELS = ("base", "sft", "rl")
# The demo presets of every stage; --quick (CI) shortens training and evaluation, keeping the claim.
DEMO = {
    "curate_preset": "tiny", "sample_preset": "tiny", "sft_data_preset": "tiny", "rl_filter_preset": "tiny",
    "sft_preset": "demo", "gppo_math_preset": "demo-math", "gppo_code_preset": "tiny-code", "evaluate_preset": "demo",
    "teacher_overrides": ["backend=records", "n=1"], "filter_math_overrides": ["backend=records", "n=1"],
    "filter_code_overrides": ["backend=records", "n=1"],
    "reference_overrides": ["n=1", "max_prompts=200"],
    "teacher_gpus": "0", "reference_gpus": "0", "filter_gpus": "0", "eval_gpus": "0",
    "sft_gpus_per_node": "0", "rl_gpus_per_node": "0",
    # Two slice tasks each, then a merge: the fan-out a cluster runs, on every CI push. The merge writes rows in
    # prompt order, so the SFT data (and the calibrated figures) are those of an unsliced run.
    "teacher_slices": 2, "reference_slices": 2,
}
# Code RL keeps tiny-code's 4 steps in both: it shows the sandboxed-reward path runs (40 steps were ~2.5 min of CI)
# and the headline is math.
QUICK: dict[str, Any] = {"gppo_math_overrides": ["max_steps=40"]}
# Validation during math RL: the first VALIDATION_PROBLEMS problems of the held-out benchmark under the evaluation's
# demo protocol (k 2: a few seconds a call), at step 0 and every 20 steps; the curve goes into summary.json.
VALIDATION_PROBLEMS = 32
VALIDATION = ["val_every=20", "val_config=demo", "val_overrides=[benchmarks.demo.k=2]"]
# With --tracking-uri: the training stages report to MLflow as well, so the registered versions link their runs.
TRACKED = "report_to=tensorboard,mlflow"


@contextlib.contextmanager
def object_store(workdir: Path, use_s3: bool) -> Iterator[str]:
    """The root for this demo's data: a bucket on a SeaweedFS server started here (stopped afterwards), or a
    local folder. The server's credentials go into this process's environment, which kfp.local's
    subprocesses inherit."""
    if not use_s3:
        root = workdir / "store"
        root.mkdir(parents=True, exist_ok=True)
        yield str(root.resolve())
        return
    import boto3

    from pipelines import local_s3

    server = local_s3.start(workdir / "seaweedfs")
    try:
        os.environ.update(server.env)
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):  # an earlier demo's, kept (--reuse)
            client.create_bucket(Bucket=BUCKET)
        print(f"SeaweedFS S3 on {server.endpoint}, bucket {BUCKET}", flush=True)
        yield f"s3://{BUCKET}"
    finally:
        server.stop()


def prepare_inputs(root: str, again: bool = False) -> dict[str, str]:
    """Demo sources and held-out benchmark, and the tiny base model, published under `<root>/inputs`; `again`:
    those an earlier demo published there, as they are (a model built anew has other bytes, so no cache hits)."""
    from klear.demo.generate import generate
    from klear.demo.tiny_model import build

    data, model = f"{root}/inputs/demo-data", f"{root}/inputs/tiny-model"
    benchmark, validation = f"{data}/demo_benchmark.jsonl", f"{root}/inputs/validation/demo_benchmark.jsonl"
    if again and storage.exists(validation):
        return {"data": data, "model": model, "benchmark": benchmark, "validation": validation}
    generate(data, seed=0)
    build(model, spec="demo")
    head = b"".join(storage.read_bytes(benchmark).splitlines(keepends=True)[:VALIDATION_PROBLEMS])
    storage.write_bytes(storage.Uri.parse(validation), head)
    return {"data": data, "model": model, "benchmark": benchmark, "validation": validation}


def pipeline_arguments(inputs: dict[str, str], run_root: str, quick: bool, register: str = "") -> dict[str, Any]:
    """The klear-reasoner arguments of the demo; `register`: the name to register the RL model under (its training
    runs reporting to MLflow too), "" for none."""
    arguments: dict[str, Any] = {
        "sources_uri": inputs["data"], "source_files": SOURCE_FILES, "base_model_uri": inputs["model"],
        "reference_model_uri": inputs["model"], "rl_math_uri": f"{inputs['data']}/arithmetic.jsonl",
        "rl_code_uri": f"{inputs['data']}/code.jsonl", "benchmark_uris": [inputs["benchmark"]], "run_root": run_root,
        **DEMO,
    }
    arguments = {**arguments, **(QUICK if quick else {})}
    validation = [f"val_data=[{inputs['validation']}]", *VALIDATION]
    arguments = {**arguments, "gppo_math_overrides": [*validation, *arguments.get("gppo_math_overrides", [])]}
    if register:
        arguments |= {"register_model_name": register, "register_sft": True,
                      **{key: [*arguments.get(key, []), TRACKED]
                         for key in ("sft_overrides", "gppo_math_overrides", "gppo_code_overrides")}}
    return arguments


def registered_versions(tracking_uri: str, names: list[str]) -> list[dict[str, str]]:
    """The registered versions of `names` on the MLflow server (newest first): version, source, training run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    found = [version for name in names for version in client.search_model_versions(f"name = '{name}'")]
    return [{"name": str(v.name), "version": str(v.version), "source": str(v.source), "run_id": v.run_id or ""}
            for v in sorted(found, key=lambda v: (v.name, -int(v.version)))]


def run_names(run_root: str) -> list[str]:
    """The runs under `run_root` (kfp.local names them after their run id), oldest first; not the work areas."""
    return sorted({name.split("/", 1)[0] for name in storage.list_files(run_root)} - {"work"})


def newest_output(run_root: str, stage: str) -> storage.Uri:
    """`<run>/<stage>` of the newest run that published it: this run's, or an earlier run's the cache served."""
    for name in reversed(run_names(run_root)):
        folder = storage.Uri.parse(run_root).join(name, stage)
        if storage.exists(folder.join(storage.MANIFEST_NAME)):
            return folder
    raise RuntimeError(f"no run under {run_root} published {stage}")


def reused_outputs(run_root: str, run: storage.Uri) -> dict[str, str]:
    """Each stage output this run took from an earlier run (a cache hit): stage -> that run."""
    made = {name.split("/", 1)[0] for name in storage.list_files(run)}
    reused = {}
    for name in run_names(run_root):
        for folder in {path.split("/", 1)[0] for path in storage.list_files(storage.Uri.parse(run_root).join(name))}:
            if folder not in made:
                reused[folder] = name
    return dict(sorted(reused.items()))


def stage_seconds(run: storage.Uri, started: float) -> dict[str, float]:
    """Seconds per stage output, from the manifests' publication times: kfp.local runs one task at a time,
    so each stage took the time since the one published before it."""
    published = []
    for name in storage.list_files(run):
        folder, _, rest = name.partition("/")
        if rest == storage.MANIFEST_NAME:
            created = storage.read_manifest(run.join(folder)).created
            published.append((datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp(), folder))
    seconds, previous = {}, started
    for when, folder in sorted(published):
        seconds[folder] = round(when - previous, 1)
        previous = when
    return seconds


def summarize(evaluation: dict[str, Any], seconds: dict[str, float], total: float) -> dict[str, Any]:
    """The claim in numbers: pass@1 and its standard error per model on the held-out benchmark (percent)."""
    summary: dict[str, Any] = {}
    for label in LABELS:
        block = evaluation["models"][label]["benchmarks"]["demo"]
        summary[label] = {"pass@1": block["pass@1"], "stderr": block["stderr"], "k": block["k"],
                          "problems": block["problems"]}
    summary["seconds"] = {**seconds, "total": round(total, 1)}
    return summary


def write_lineage(evaluation: str, workdir: Path) -> None:
    """<workdir>/lineage.json and lineage.txt: every step from the evaluation back to the demo's sources, read from
    the manifests while the store is up (`klear lineage` on the evaluation prints the same); model-card.md: the
    card of the evaluated RL model, its scores written back by the evaluation."""
    from klear.common import lineage, model_card

    steps = lineage.trace(evaluation)
    (workdir / "lineage.json").write_text(json.dumps([step.to_json() for step in steps], indent=2, default=str))
    (workdir / "lineage.txt").write_text(lineage.render_text(steps))
    final = next(step.uri for step in steps if step.stage == "gppo")  # nearest first: the model sampled
    (workdir / "model-card.md").write_bytes(storage.read_bytes(storage.Uri.parse(final).join(model_card.CARD_NAME)))


def validation_curve(rl_report: dict[str, Any]) -> list[dict[str, float]]:
    """Math RL's validation: pass@1 and stderr (percent) on the validation problems by step."""
    return [{"step": row["step"], "pass@1": row["val/demo/pass@1"], "stderr": row.get("val/demo/stderr")}
            for row in rl_report.get("validation", [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("runs/demo"))
    parser.add_argument("--no-s3", action="store_true", default=os.environ.get("KLEAR_DEMO_NO_S3") == "1",
                        help="plain folders instead of a SeaweedFS server")
    parser.add_argument("--quick", action="store_true", help="shorter training and evaluation (the CI test)")
    parser.add_argument("--reuse", action="store_true",
                        help="the store, inputs and run root of the workdir's earlier --reuse demo, KFP's cache on")
    parser.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a pipeline argument (JSON value, else a string), e.g. gppo_code_overrides='[\"seed=1\"]'")
    parser.add_argument("--tracking-uri", default="", metavar="URI",
                        help="an MLflow tracking server: training reports to it, and the RL and SFT models are registered "
                             "there as the last steps")
    parser.add_argument("--register-name", default="klear-demo", help="registered model name (with --tracking-uri)")
    args = parser.parse_args(argv)
    changed = dict(_argument(text) for text in args.arg)
    # A stopped demo (Ctrl-C, `kill`) still stops the S3 server it started: SIGTERM unwinds like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from pipelines.compile import compile_all
    from pipelines.run_local import run_compiled

    register = args.register_name if args.tracking_uri else ""
    if args.tracking_uri:  # kfp.local's tasks inherit the environment: the training stages and the register task
        os.environ["MLFLOW_TRACKING_URI"] = args.tracking_uri
        os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", "klear-demo")
    started = time.time()
    compile_all()  # the DAG as the code defines it now, as `make pipeline` writes it
    with object_store(args.workdir, not args.no_s3) as root:
        root = f"{root}/reuse" if args.reuse else f"{root}/{time.strftime('%Y%m%d-%H%M%S')}"
        inputs = prepare_inputs(root, again=args.reuse)
        run_root = f"{root}/runs"
        earlier = set(run_names(run_root))
        run_compiled("klear-reasoner", args.workdir,
                     {**pipeline_arguments(inputs, run_root, args.quick, register), **changed}, cache=args.reuse)
        (new_run,) = set(run_names(run_root)) - earlier
        run = storage.Uri.parse(run_root).join(new_run)
        evaluated = newest_output(run_root, "evaluate")
        evaluation = json.loads(storage.read_bytes(evaluated.join("report.json")))
        summary = summarize(evaluation, stage_seconds(run, started), time.time() - started)
        summary["reused"] = reused_outputs(run_root, run)
        math_rl = newest_output(run_root, "gppo-math")
        summary["validation"] = validation_curve(json.loads(storage.read_bytes(math_rl.join("report.json"))))
        report_html = args.workdir / "report.html"
        report_html.write_bytes(storage.read_bytes(evaluated.join("report.html")))
        write_lineage(str(evaluated), args.workdir)
        if register:
            summary["registered"] = registered_versions(args.tracking_uri, [register, f"{register}-sft"])
        print(storage.read_bytes(evaluated.join("report.md")).decode())
    (args.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(_table(summary))
    print(f"\nHTML report: {report_html.resolve()}\nsummary: {(args.workdir / 'summary.json').resolve()}")
    return 0


def _table(summary: dict[str, Any]) -> str:
    lines = ["| model | pass@1 on the held-out demo benchmark (%) |", "|---|---|"]
    lines += [f"| {label} | {summary[label]['pass@1']:.1f} ± {summary[label]['stderr']:.1f} |" for label in LABELS]
    lines += ["", "| stage | seconds |", "|---|---|"]
    lines += [f"| {stage} | {s:.0f} |" for stage, s in summary["seconds"].items()]
    lines += [f"| {stage} | reused from run {run} |" for stage, run in summary.get("reused", {}).items()]
    if summary.get("registered"):
        lines += ["", "| registered model | version | source |", "|---|---|---|"]
        lines += [f"| {v['name']} | {v['version']} | {v['source']} |" for v in summary["registered"]]
    return "\n".join(lines)


def _argument(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--arg {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


if __name__ == "__main__":
    sys.exit(main())
