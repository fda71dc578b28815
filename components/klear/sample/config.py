"""Config of the sample stage: sampling parameters, the endpoint client's retry policy, sharding and limits."""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from klear.common.config import StageConfig

# Upper bounds of the counts: the int32 columns of the output (sample index, token counts), and what a run can
# hold in memory or open at once; past them a value is a typo, refused at once rather than a hang or an overflow.
INT32_MAX = 2**31 - 1
MAX_SAMPLES = 65536
MAX_SECONDS = 7 * 24 * 3600.0

# The keys whose values change what a unit's response is. They (with the model's identity and chat template)
# form the settings hash under which units are kept; a rerun with any of them changed is refused. `n` is not
# one of them: sample j's seed does not depend on n, so raising n tops an output up instead of redoing it.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed", "system_prompt",
                 "api_flavor", "extra_body", "engine_kwargs", "max_model_len")


class SampleConfig(StageConfig):
    preset_package = "klear.sample"

    backend: Literal["auto", "openai", "vllm", "hf", "records"] = pydantic.Field(
        "auto", description="auto: openai with --endpoint, vllm with --model on a GPU, hf with --model on CPU")
    n: int = pydantic.Field(16, ge=1, le=MAX_SAMPLES, description="samples per prompt")
    max_prompts: int = pydantic.Field(0, ge=0, le=INT32_MAX, description="sample only the first N prompts in source "
                                      "order (0 = all): difficulty estimates on a subset, smoke tests")
    temperature: float = pydantic.Field(0.6, ge=0.0, description="0 = greedy")
    top_p: float = pydantic.Field(0.95, gt=0.0, le=1.0, description="nucleus sampling; 1 = off")
    top_k: int = pydantic.Field(0, ge=0, le=INT32_MAX, description="0 = off")
    repetition_penalty: float = pydantic.Field(1.0, gt=0.0, description="1 = off")
    max_tokens: int = pydantic.Field(32768, ge=1, le=INT32_MAX, description="max new tokens per sample")
    seed: int = pydantic.Field(0, ge=0, le=2**63 - 1,
                              description="base seed; sample j of prompt p uses a seed derived from (seed, p, j)")
    seed_per_unit: bool = pydantic.Field(
        True, description="each unit's request carries its own seed, from (seed, prompt, sample): a unit sampled again "
        "(after a restart, on another pod) draws the same tokens. false: requests go unseeded, the faster choice on "
        "vLLM: it draws seeded requests' noise one request at a time and, on GPUs, leaves FlashInfer's sampler for "
        "PyTorch's while any is in the batch (the CPU build: 1.16x the tokens/s, README Benchmarks); a unit sampled "
        "again then draws other tokens (each unit is still recorded once; its seed column is empty)")
    system_prompt: str = pydantic.Field("", description="system message put before every prompt ('' = none)")
    prompt_field: str = pydantic.Field("prompt", description="default prompt field of sources (per source: #prompt=...)")
    id_field: str = pydantic.Field("id", description="default id field of sources (per source: #id=...); required")

    # The endpoint client.
    concurrency: int = pydantic.Field(64, ge=1, le=MAX_SAMPLES, description="requests in flight")
    request_timeout_s: float = pydantic.Field(3600.0, gt=0.0, le=MAX_SECONDS,
                                             description="wall-clock limit of one request")
    connect_timeout_s: float = pydantic.Field(
        10.0, gt=0.0, le=MAX_SECONDS, description="endpoint: limit of opening one connection")
    max_attempts: int = pydantic.Field(8, ge=1, le=1000,
                                      description="attempts per unit before it is recorded as failed")
    backoff_initial_s: float = pydantic.Field(1.0, ge=0.0, le=MAX_SECONDS,
                                             description="first retry delay; doubles per attempt")
    backoff_max_s: float = pydantic.Field(60.0, ge=0.0, le=MAX_SECONDS, description="cap of the exponential delay")
    retry_after_max_s: float = pydantic.Field(600.0, ge=0.0, le=MAX_SECONDS,
                                             description="cap on a server's Retry-After")
    api_key_env: str = pydantic.Field(
        "OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="name of the environment variable holding the API key (the key itself is never recorded)")
    api_flavor: Literal["vllm", "openai", "transformers"] = pydantic.Field(
        "vllm", description="where non-OpenAI parameters go: top-level (vllm, sglang), refused (openai), "
        "generation_config (transformers serve)")
    extra_body: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="merged into every request body (not the keys a setting or the request "
        "sets: those are refused)")
    allow_model_mismatch: bool = pydantic.Field(
        False, description="accept replies naming another model than --served-model (an alias); counted in the "
        "report. Off: such a reply stops the run")

    # Local engines (vllm, hf).
    data_parallel_size: int = pydantic.Field(
        1, ge=0, le=4096, description="vLLM engines on the pod, fed from one queue (8 GPUs: 8 for an 8B model at "
        "tensor_parallel_size 1); 0 = as many as the pod's GPUs hold")
    tensor_parallel_size: int = pydantic.Field(0, ge=0, le=4096,
                                               description="GPUs per vLLM engine; 0 = the pod's GPUs divided among the engines")
    gpu_memory_utilization: float = pydantic.Field(
        0.9, gt=0.0, le=1.0, description="vLLM: the GPU memory share each engine takes")
    max_model_len: int = pydantic.Field(0, ge=0, le=INT32_MAX, description="0 = the model's own")
    engine_kwargs: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="more vLLM engine arguments (AsyncEngineArgs), e.g. hf_overrides for YaRN")
    engine_api: Literal["auto", "llm_engine", "async_llm"] = pydantic.Field(
        "auto", description="the vLLM API the backend drives: llm_engine (stepped in the sampling thread, as vLLM's "
        "LLM runs it; one engine only), async_llm (needed for data_parallel_size > 1); auto = llm_engine for one "
        "engine, async_llm for more")
    batch_prompts: int = pydantic.Field(
        512, ge=1, le=INT32_MAX, description="prompts' worth of units (x n) waiting or running per vLLM engine; a "
        "finished unit lets the next one in (no barrier). More than the engine's max_num_seqs keeps it full")
    enforce_eager: bool = pydantic.Field(
        False, description="vLLM without CUDA graphs / compilation: a faster start, slower decoding (CPU: no graphs)")
    cpu_kvcache_space_gib: float = pydantic.Field(
        0.0, ge=0.0, le=65536.0, description="vLLM's CPU build: KV cache size in GiB (the engine's kv_cache_memory_bytes, as "
        "VLLM_CPU_KVCACHE_SPACE sets it); 0 = vLLM's default")

    # Bookkeeping.
    shard_size: int = pydantic.Field(256, ge=1, le=INT32_MAX,
                                    description="completed units per shard written to the work area")
    flush_seconds: float = pydantic.Field(300.0, gt=0.0, le=MAX_SECONDS,
                                         description="write a shard at least this often")
    rows_per_part: int = pydantic.Field(100_000, ge=1, le=INT32_MAX, description="rows per published Parquet file")
    max_failed_fraction: float = pydantic.Field(
        0.0, ge=0.0, le=1.0, description="fraction of units that may fail without failing the stage")
    progress_seconds: float = pydantic.Field(60.0, gt=0.0, le=MAX_SECONDS, description="interval of progress log lines")
    keep_work: bool = pydantic.Field(
        True, description="keep the work area's shards after publishing (a rerun then reads them, not the output)")

    def sampling_settings(self) -> dict[str, Any]:
        settings = {key: getattr(self, key) for key in SAMPLING_KEYS}
        # Recorded only when off: the settings (and the work area keyed by them) of runs that seed every unit stay
        # those of runs made before the setting existed, so their restarts find their work.
        if not self.seed_per_unit:
            settings["seed_per_unit"] = False
        return settings

    def unit_seed_base(self) -> int | None:
        """The base of the units' seeds (units.unit_seed), None when requests go unseeded."""
        return self.seed if self.seed_per_unit else None


def work_area(run_root: str, name: str, prompts: str, model: str | None, endpoint: str, served_model: str,
              input_digest: str, config: SampleConfig) -> str:
    """The work area every slice and the merge of one sampling use share, keyed by what decides its units: the
    prompts and the model (their locations and content digest) and the sampling settings; not by the run, so a
    new run with the same inputs finds every unit an earlier one left there (n may differ: units are per sample)."""
    from klear.common import kfp_io

    return kfp_io.work_location(run_root, f"sample-{name}" if name else "sample", {
        "prompts": prompts, "model": model, "endpoint": endpoint, "served_model": served_model,
        "inputs": input_digest, "sampling": config.sampling_settings()})
