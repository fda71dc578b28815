"""Single-stage reruns on an earlier run's artifacts on S3, and kfp.local's cache across runs.

The earlier runs are real compiled pipelines under kfp.local (the YAML a cluster runs), publishing on SeaweedFS;
each rerun is a new run of another single-stage pipeline whose inputs are the earlier outputs' URIs.
"""

import json
from pathlib import Path

import pytest

from klear.common import storage
from pipelines.compile import compile_all
from pipelines.run_local import run_compiled


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled")
    compile_all(out)
    return out


def _put_jsonl(uri: str, rows: list[dict]) -> str:
    storage.write_bytes(storage.Uri.parse(uri), "".join(json.dumps(r) + "\n" for r in rows).encode())
    return uri


def _answer(value: int) -> str:
    return f"<think>\nadd the columns\n</think>\n\nThe answer is $\\boxed{{{value}}}$."


def _runs(run_root: str) -> set[str]:
    """The runs under `run_root`; not the work areas (`work/`, shared by runs of the same inputs)."""
    return {name.split("/", 1)[0] for name in storage.list_files(run_root)} - {"work"}


@pytest.mark.slow
def test_sft_data_reruns_with_another_policy_on_saved_samples(compiled: Path, s3_bucket: str, tmp_path: Path) -> None:
    """Teacher and reference samples from earlier runs (the `records` backend on shipped traces), then sft-data
    twice on them: keep_all, and a rerun with drop_incorrect, which keeps what the first run said it would."""
    from klear.demo.tiny_model import build

    problems = [(f"p{i}", 10 + i, 20 + i) for i in range(6)]
    # Teacher: two traces per problem, the second one wrong on p3..p5. Reference: right on p0, p1, p3 only.
    teacher = [{"id": pid, "prompt": f"What is {a} + {b}?", "answer": str(a + b),
                "generations": [_answer(a + b), _answer(a + b + (1 if i >= 3 else 0))]}
               for i, (pid, a, b) in enumerate(problems)]
    reference = [{"id": pid, "prompt": f"What is {a} + {b}?", "answer": str(a + b),
                  "generations": [_answer(a + b + (0 if i in (0, 1, 3) else 7))]} for i, (pid, a, b) in enumerate(problems)]
    inputs = f"{s3_bucket}/inputs"
    build(f"{inputs}/tiny-model")
    run_root = f"{s3_bucket}/runs"
    earlier = {}
    for name, rows, n in (("teacher", teacher, 2), ("reference", reference, 1)):
        task = run_compiled("klear-sample", tmp_path / "kfp", {
            "prompts_uri": _put_jsonl(f"{inputs}/{name}.jsonl", rows), "name": name, "preset": "tiny",
            "overrides": ["backend=records", f"n={n}"], "gpus": "0", "run_root": run_root}, compiled)
        earlier[name] = task.output.metadata["uri"]
        assert earlier[name].startswith(run_root) and task.output.metadata["rows"] == len(problems) * n

    def sft_data(policy: str) -> dict:
        task = run_compiled("klear-sft-data", tmp_path / "kfp", {
            "teacher_samples_uri": earlier["teacher"], "reference_samples_uri": earlier["reference"],
            "target_model_uri": f"{inputs}/tiny-model", "preset": "tiny", "overrides": [f"policy={policy}"],
            "run_root": run_root}, compiled)
        return json.loads(storage.read_bytes(storage.Uri.parse(task.output.metadata["uri"]).join("report.json")))

    first = sft_data("keep_all")
    assert first["totals"]["kept"] == 12, first["totals"]
    assert first["would_keep"]["drop_incorrect"] == 9 and first["would_keep"]["drop_incorrect_on_easy"] == 11
    rerun = sft_data("drop_incorrect")
    assert rerun["totals"]["kept"] == first["would_keep"]["drop_incorrect"] == 9
    assert len(_runs(run_root)) == 4  # two sample runs, two sft-data runs: nothing overwritten


@pytest.mark.slow
def test_evaluate_reruns_on_saved_samples(compiled: Path, s3_bucket: str, tmp_path: Path) -> None:
    """klear-evaluate samples the tiny model and scores it; klear-evaluate-samples rescores the saved samples
    (no model, no sampling) and must report the same figures."""
    from klear.demo import tasks
    from klear.demo.tiny_model import build

    benchmark = _put_jsonl(f"{s3_bucket}/inputs/demo_benchmark.jsonl", tasks.benchmark_items(6, seed=0))
    build(f"{s3_bucket}/inputs/tiny-model")
    run_root = f"{s3_bucket}/runs"
    run_compiled("klear-evaluate", tmp_path / "kfp", {
        "model_uri": f"{s3_bucket}/inputs/tiny-model", "benchmark_uris": [benchmark], "preset": "demo",
        "sample_preset": "tiny", "gpus": "0", "run_root": run_root}, compiled)
    (first_run,) = _runs(run_root)
    root = storage.Uri.parse(run_root)
    sampled = root.join(first_run, "sample-eval-math")
    first = json.loads(storage.read_bytes(root.join(first_run, "evaluate", "report.json")))
    run_compiled("klear-evaluate-samples", tmp_path / "kfp", {
        "samples_uri": str(sampled), "benchmark_uris": [benchmark], "preset": "demo", "label": "rescored",
        "run_root": run_root}, compiled)
    (second_run,) = _runs(run_root) - {first_run}
    # Judged (in slices, here one) with the judge settings and problems of the evaluate preset, then scored: no
    # sampling.
    assert {name.split("/", 1)[0] for name in storage.list_files(root.join(second_run))} == {
        "evaluate-problems", "judge-eval-samples", "evaluate"}
    again = json.loads(storage.read_bytes(root.join(second_run, "evaluate", "report.json")))
    before, after = first["models"]["model"]["benchmarks"]["demo"], again["models"]["rescored"]["benchmarks"]["demo"]
    assert (after["k"], after["problems"], after["samples"]) == (4, 6, 24)
    assert after["pass@1"] == before["pass@1"] and after["stderr"] == before["stderr"]
    # Both evaluate tasks took every verdict of the judge step in front of them.
    assert [(r["judge"]["judged"], r["judge"]["reused"]) for r in (first, again)] == [(0, 24), (0, 24)]


@pytest.mark.slow
def test_a_second_run_reuses_deterministic_stages(compiled: Path, s3_bucket: str, tmp_path: Path) -> None:
    """kfp.local's cache: an unchanged curate task is served from the first run (no new output), a changed one
    runs again. The run id is not a task input, so a cluster's cache key does not change every run either."""
    from klear.demo.generate import generate

    generate(f"{s3_bucket}/sources", math_count=30, code_count=4, seed=1)
    run_root = f"{s3_bucket}/runs"
    arguments = {"sources_uri": f"{s3_bucket}/sources", "source_files": ["math.jsonl#prompt=problem"],
                 "preset": "tiny", "run_root": run_root}
    first = run_compiled("klear-curate", tmp_path / "kfp", arguments, compiled, cache=True).output.metadata["uri"]
    second = run_compiled("klear-curate", tmp_path / "kfp", arguments, compiled, cache=True).output.metadata["uri"]
    assert second == first and len(_runs(run_root)) == 1  # served from the cache: the second run wrote nothing
    changed = {**arguments, "source_files": ["math.jsonl#prompt=problem", "code.jsonl#prompt=question"]}
    third = run_compiled("klear-curate", tmp_path / "kfp", changed, compiled, cache=True).output.metadata["uri"]
    assert third != first and len(_runs(run_root)) == 2
    assert json.loads(storage.read_bytes(storage.Uri.parse(third).join("report.json")))["per_source"].keys() == {
        "math", "code"}


def _run_local(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """`python -m pipelines.run_local ...` in this process: the output's URI line and everything it printed."""
    from pipelines.run_local import main

    assert main(arguments) == 0
    printed = capsys.readouterr().out
    (uri,) = [line.split(": ", 1)[1] for line in printed.splitlines() if line.startswith("output: ")]
    return uri, printed


def _klear_sample(prompts: str, output: str, n: int) -> None:
    from klear.cli import main

    assert main(["sample", "--prompts", prompts, "--output", output, "--config", "tiny", "--set", "backend=records",
                 "--set", f"n={n}"]) == 0


@pytest.mark.slow
def test_a_cache_hit_needs_the_same_input_content(compiled: Path, s3_bucket: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`run_local klear-judge --cache` on a sample output: unchanged, the second run is served from the cache; after
    the output is topped up in place from n=2 to n=6 (the same URI), the third judges again, all 30 samples (it
    served the 10-sample result before)."""
    rows = [{"id": f"p{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1),
             "generations": [_answer(i + 1 + k % 2) for k in range(6)]} for i in range(5)]
    prompts = _put_jsonl(f"{s3_bucket}/inputs/prompts.jsonl", rows)
    samples, run_root = f"{s3_bucket}/samples/teacher", f"{s3_bucket}/runs"
    command = ["klear-judge", "--workdir", str(tmp_path / "kfp"), "--compiled", str(compiled), "--cache",
               "--run-root", run_root, "--arg", f"samples_uri={samples}", "--arg", "preset=tiny"]

    def judged(uri: str) -> dict:
        return json.loads(storage.read_bytes(storage.Uri.parse(uri).join("report.json")))["totals"]

    _klear_sample(prompts, samples, 2)
    first, _ = _run_local(command, capsys)
    assert judged(first)["samples"] == 10
    again, _ = _run_local(command, capsys)
    assert again == first and len(_runs(run_root)) == 1  # same content: served from the cache
    _klear_sample(prompts, samples, 6)  # topped up in place
    third, _ = _run_local(command, capsys)
    assert third != first and len(_runs(run_root)) == 2
    assert judged(third)["samples"] == 30 and judged(third)["correct"] == 15


@pytest.mark.slow
def test_a_cache_hit_needs_the_same_config_file_content(compiled: Path, s3_bucket: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_local klear-judge --cache --arg preset=cfg/jp.yaml`, then its `base` file edited (strict -> official):
    the second run judges again in the new mode (the first run's strict result was served, exit 0)."""
    rows = [{"id": "p0", "prompt": "What is 1 + 1?", "answer": "2", "generations": [_answer(2), "It is 2."]}]
    samples, run_root = f"{s3_bucket}/samples/teacher", f"{s3_bucket}/runs"
    _klear_sample(_put_jsonl(f"{s3_bucket}/inputs/prompts.jsonl", rows), samples, 2)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "jp.yaml").write_text("base: mode.yaml\nchunk_size: 7\n")
    mode = tmp_path / "cfg" / "mode.yaml"
    mode.write_text("base: tiny\nverifier:\n  math_mode: strict\n")
    command = ["klear-judge", "--workdir", str(tmp_path / "kfp"), "--compiled", str(compiled), "--cache",
               "--run-root", run_root, "--arg", f"samples_uri={samples}", "--arg", "preset=cfg/jp.yaml"]
    monkeypatch.chdir(tmp_path)  # a relative path, as typed: the tasks run here too
    first, printed = _run_local(command, capsys)
    assert "Math judged in mode **strict**" in printed
    mode.write_text("base: tiny\nverifier:\n  math_mode: official\n")
    second, printed = _run_local(command, capsys)
    assert second != first and len(_runs(run_root)) == 2
    assert "Math judged in mode **official**" in printed


@pytest.mark.slow
def test_evaluate_samples_through_run_local_with_overrides(compiled: Path, s3_bucket: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`run_local klear-evaluate-samples` prints the summary it returns (it died reading `summary/report.md`), and
    its `overrides` reach the evaluate task: 2 samples a problem fail the demo protocol's k=4 unless k=2 is set."""
    from klear.demo import tasks

    items = tasks.benchmark_items(4, seed=0)
    benchmark = _put_jsonl(f"{s3_bucket}/inputs/bench.jsonl", items)
    prompts = _put_jsonl(f"{s3_bucket}/inputs/prompts.jsonl", [
        {"id": r["id"], "prompt": r["problem"], "generations": [_answer(int(r["answer"])), _answer(0)]} for r in items])
    samples = f"{s3_bucket}/samples/model"
    _klear_sample(prompts, samples, 2)
    command = ["klear-evaluate-samples", "--workdir", str(tmp_path / "kfp"), "--compiled", str(compiled),
               "--run-root", f"{s3_bucket}/runs", "--arg", f"samples_uri={samples}",
               "--arg", f"benchmark_uris=[{benchmark}]", "--arg", "preset=demo"]
    with pytest.raises(RuntimeError):
        _run_local(command, capsys)  # the protocol's k=4: too few samples
    _, printed = _run_local([*command, "--arg", "overrides=[benchmarks.demo.k=2]"], capsys)
    assert "Demo column addition" in printed and "50.0" in printed


@pytest.mark.slow
def test_a_new_run_reuses_the_units_and_the_cached_sampling_of_an_earlier_one(compiled: Path, s3_bucket: str,
                                                                             tmp_path: Path) -> None:
    """klear-sample over two slices. Without the cache, a second run finds every unit the first left in the one
    work area both share (keyed by prompts, model and settings, not by the run) and samples none. With the cache,
    an unchanged run is served from an earlier one (no new output), and a new `recompute` text samples anew."""
    rows = [{"id": f"p{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1),
             "generations": [_answer(i + 1), _answer(i + 2)]} for i in range(6)]
    run_root = f"{s3_bucket}/runs"
    arguments = {"prompts_uri": _put_jsonl(f"{s3_bucket}/inputs/prompts.jsonl", rows), "name": "teacher",
                 "preset": "tiny", "overrides": ["backend=records", "n=2", "keep_work=true"], "gpus": "0",
                 "slices": 2, "run_root": run_root}

    def sampled(uri: str) -> dict[str, tuple[int, int]]:
        report = json.loads(storage.read_bytes(storage.Uri.parse(uri).join("report.json")))
        return {part: (units["done_before"], units["sampled"]) for part, units in report["slices"].items()}

    def work_files() -> dict[str, int]:
        return {name: len(storage.read_bytes(f"{run_root}/work/{name}")) for name in storage.list_files(f"{run_root}/work")
                if name.endswith(".parquet")}

    first = run_compiled("klear-sample", tmp_path / "kfp", arguments, compiled).output.metadata["uri"]
    assert sum(done for done, _ in sampled(first).values()) == 0 and sum(n for _, n in sampled(first).values()) == 12
    (area,) = {name.split("/", 1)[0] for name in work_files()}
    assert area.startswith("sample-teacher-"), area
    shards = work_files()
    second = run_compiled("klear-sample", tmp_path / "kfp", arguments, compiled).output.metadata["uri"]
    found = sorted((sampled_before, 0) for _, sampled_before in sampled(first).values())
    assert second != first and sorted(sampled(second).values()) == found  # every unit found, none sampled
    assert work_files() == shards  # not a shard written

    cached = run_compiled("klear-sample", tmp_path / "cached", arguments, compiled, cache=True).output.metadata["uri"]
    again = run_compiled("klear-sample", tmp_path / "cached", arguments, compiled, cache=True).output.metadata["uri"]
    assert again == cached and len(_runs(run_root)) == 3  # served from the cache: no output written
    forced = run_compiled("klear-sample", tmp_path / "cached", {**arguments, "recompute": "2026-12-06"}, compiled,
                          cache=True).output.metadata["uri"]
    assert forced != cached and sorted(sampled(forced).values()) == sorted(sampled(first).values())  # sampled anew
