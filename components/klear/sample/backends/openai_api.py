"""Any OpenAI-compatible chat server (vLLM, SGLang, transformers serve, hosted APIs), as a concurrent client.

aiohttp, with our own retry loop. Not the openai SDK: its retries are invisible (we need each attempt's kind and
the server's message in the failed rows and the report), a 200 without `choices` would need a second retry
layer on top of its own, and it gives up on a Retry-After past two minutes. Not httpx: its connection pool
costs O(connections) per request; on 2 cores at 64 in flight httpx spent 2-3.4 ms of CPU per request (about
100-150 requests/s), httpx2 1.4 ms, aiohttp 0.23 ms (over 1,000/s), and a client that samples a fast small
model (evaluation, the filter model) must not be the bottleneck.

The key is read from the environment variable the config names and only ever placed in the Authorization
header: it is not logged, not written, and not part of any message (we never render a request's headers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import random
import re
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from klear.sample import reasoning
from klear.sample.backends.base import BackendError, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.retry import backoff_delay, classify_status, parse_retry_after

log = logging.getLogger("klear.sample")

_STOP = object()


class BadResponse(ValueError):
    """A 200 that is not a usable chat completion (no choices, an error object, not JSON, content without text, an
    empty answer without reasoning unless the length limit cut it, an impossible token count): a failed attempt,
    retried."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def redact_url(url: str) -> str:
    """The endpoint as it may be recorded: without user:password and query (some gateways put keys there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def server_message(content: bytes, reason: str = "", limit: int = 500) -> str:
    """The server's own explanation: an OpenAI-style error object's message, else the body's start."""
    text = content[:limit].decode("utf-8", "replace").strip()
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return text or reason
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:limit]
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])[:limit]
    return text or reason


def request_body(config: SampleConfig, served_model: str, request: Request) -> dict[str, Any]:
    """One chat-completion request for one unit: n is left at 1 (servers differ on n), seeded per unit unless
    seed_per_unit is off."""
    body = {"model": served_model, "messages": [dict(m) for m in request.prompt.messages], **settings_body(config)}
    if request.seed is not None:
        body["seed"] = request.seed
    return body


def settings_body(config: SampleConfig) -> dict[str, Any]:
    """The part of every request that carries the sampling settings, after flavour mapping and extra_body."""
    body: dict[str, Any] = {"max_tokens": config.max_tokens, "temperature": config.temperature, "top_p": config.top_p}
    if config.api_flavor == "vllm":
        if config.top_k > 0:
            body["top_k"] = config.top_k
        if config.repetition_penalty != 1.0:
            body["repetition_penalty"] = config.repetition_penalty
    elif config.api_flavor == "transformers":
        # transformers serve refuses top_k and repetition_penalty as fields, and ignores temperature unless
        # sampling is switched on: everything goes into its generation_config (merged with the model's own).
        generation: dict[str, Any] = {"max_new_tokens": config.max_tokens, "do_sample": config.temperature > 0}
        if config.temperature > 0:
            generation.update(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
        if config.repetition_penalty != 1.0:
            generation["repetition_penalty"] = config.repetition_penalty
        body["generation_config"] = json.dumps(generation)
    body.update(config.extra_body)
    return body


def check_flavor(config: SampleConfig) -> None:
    if config.api_flavor == "openai" and (config.top_k > 0 or config.repetition_penalty != 1.0):
        raise BackendError("api_flavor=openai has no top_k or repetition_penalty; use api_flavor=vllm for servers "
                           "that take them as fields, or put them in extra_body")


# extra_body keys that would replace what a request sets itself: the unit's prompt, model and seed, or a setting
# under its own or another name (vLLM reads max_completion_tokens before max_tokens). Sent from extra_body, the
# server would sample under values the recorded settings (and evaluate's protocol check) do not show.
_REQUEST_KEYS = {"model": "--served-model", "messages": "the prompt", "seed": "seed (per unit)",
                 "n": "one sample per request", "stream": "a whole answer per request"}
_SETTING_KEYS = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_tokens",
                 "max_completion_tokens": "max_tokens", "max_new_tokens": "max_tokens", "top_k": "top_k",
                 "repetition_penalty": "repetition_penalty", "generation_config": "temperature, top_p, top_k, "
                 "repetition_penalty and max_tokens"}
# What api_flavor=openai cannot send as a field: extra_body is the documented way, and it is recorded from there.
_OPENAI_EXTRAS = ("top_k", "repetition_penalty")


def check_extra_body(config: SampleConfig) -> None:
    """Refuse extra_body keys that shadow the request's own fields or a sampling setting, naming the setting."""
    for key in config.extra_body:
        if key in _REQUEST_KEYS:
            raise BackendError(f"extra_body.{key} would replace what each request sets itself ({_REQUEST_KEYS[key]}); "
                               "remove it")
        if key in _SETTING_KEYS and not (config.api_flavor == "openai" and key in _OPENAI_EXTRAS):
            raise BackendError(f"extra_body.{key} shadows the setting {_SETTING_KEYS[key]}: set it with --set "
                               f"{_SETTING_KEYS[key].split(',')[0]}=VALUE instead, so the recorded settings are the "
                               "ones the server receives")


def effective_sampling(config: SampleConfig) -> dict[str, Any]:
    """The sampling settings as the server receives them (what is recorded and checked): the config's, with the
    settings api_flavor=openai sends through extra_body. Conflicting duplicates are refused first."""
    check_extra_body(config)
    sampling = config.sampling_settings()
    if config.api_flavor == "openai":
        sampling.update({key: config.extra_body[key] for key in _OPENAI_EXTRAS if key in config.extra_body})
    return sampling


def check_endpoint_url(endpoint: str) -> None:
    """An API root without credentials: a user:password or a query string (?token=...) would be sent with every
    request and appear in logs and errors; the key belongs in the environment variable api_key_env names."""
    if not endpoint.startswith(("http://", "https://")):
        raise BackendError(f"--endpoint {redact_url(endpoint)!r} is not an http(s) URL (e.g. http://host:8000/v1)")
    parts = urlsplit(endpoint)
    userinfo = parts.username is not None or parts.password is not None
    if userinfo or parts.query or parts.fragment:
        what = [name for name, present in (("a user:password", userinfo), ("a query string", bool(parts.query)),
                                           ("a fragment", bool(parts.fragment))) if present]
        raise BackendError(f"--endpoint {redact_url(endpoint)} carries {' and '.join(what)} (not shown): give the API "
                           "root only, and the key in $OPENAI_API_KEY (or the variable api_key_env names; in a "
                           "pipeline, the Secret klear-endpoint, key api-key), which is sent as a Bearer token and "
                           "never recorded")


def parse_completion(payload: Any, request: Request, attempts: int, served_model: str,
                     allow_model_mismatch: bool = False) -> Completion:
    if not isinstance(payload, dict):
        raise BadResponse("bad_body", f"body is a {type(payload).__name__}, not an object")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        error = payload.get("error")
        detail = (error.get("message") if isinstance(error, dict) else error) or str(payload)[:300]
        raise BadResponse("no_choices", f"200 without choices: {detail}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise BadResponse("bad_body", "choice without a message")
    finish = str(choice.get("finish_reason") or "unknown")
    given = payload.get("usage")
    usage: dict[str, Any] = given if isinstance(given, dict) else {}
    parsed = reasoning.from_message(normal_message(message), finish)
    if parsed.reasoning is None and not parsed.final.strip() and finish == "length" and token_count(
            usage, "completion_tokens"):
        # Tokens written, none shown, cut by the length limit: vLLM's deepseek_r1 parser holds back a reply that is
        # only its opening <think>. The cut fell inside the reasoning; a retry (same seed) would write the same.
        parsed = reasoning.Parsed("", "", False)
    if parsed.reasoning is None and not parsed.final.strip():
        raise BadResponse("empty_answer", f"200 with an empty answer and no reasoning (finish_reason {finish}, "
                          f"content {str(message.get('content'))[:100]!r})")
    model = payload.get("model")
    answered = model if isinstance(model, str) and model else served_model
    if not same_model(served_model, answered) and not allow_model_mismatch:
        raise ModelMismatchError(f"the endpoint answered with model {answered!r}, not --served-model "
                                 f"{served_model!r}: its samples would be another model's. Name the model the "
                                 "endpoint reports, or --set allow_model_mismatch=true where it reports an alias "
                                 "(mismatches are then counted in the report)")
    return Completion(
        request=request,
        parsed=parsed,
        finish_reason=finish,
        prompt_tokens=token_count(usage, "prompt_tokens"),
        completion_tokens=token_count(usage, "completion_tokens"),
        model=answered,
        attempts=attempts,
    )


class ModelMismatchError(BackendError):
    """A reply from another model than --served-model: the run stops (unless allow_model_mismatch)."""


# How servers name the model they were asked for: itself, at a revision (transformers serve: `path@main`), or a
# dated snapshot of a hosted alias (`gpt-4o` answers as `gpt-4o-2024-08-06`).
_SAME_MODEL = r"(@[^@/\s]+|-\d{4}-\d{2}-\d{2})?"


def same_model(served: str, answered: str) -> bool:
    """Whether a reply naming `answered` comes from the model requested as `served`."""
    return re.fullmatch(re.escape(served) + _SAME_MODEL, answered) is not None


# The text parts of a content list (OpenAI's [{"type": "text", "text": ...}], the Responses API's output_text),
# and the reasoning parts some servers send the same way (Mistral's thinking, with text parts inside).
_TEXT_PARTS = ("text", "output_text")
_REASONING_PARTS = ("thinking", "reasoning")


def _part_text(part: Any, where: str) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, list):
        return "".join(_part_text(p, where) for p in part)
    if isinstance(part, dict):
        for key in ("text", "thinking", "reasoning", "content"):
            if key in part:
                return _part_text(part[key], where)
    raise BadResponse("bad_content", f"{where}: a part without text: {str(part)[:200]}")


def normal_message(message: dict[str, Any]) -> dict[str, Any]:
    """The message with `content` as text (or None) and reasoning parts moved to `reasoning`; a content shape
    that holds no text (an image part, a number) is a bad reply, never an empty answer."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return message
    if not isinstance(content, list):
        raise BadResponse("bad_content", f"message.content is a {type(content).__name__}, not text or a list of parts")
    texts, thoughts = [], []
    for i, part in enumerate(content):
        kind = part.get("type", "text") if isinstance(part, dict) else "text"
        if kind in _TEXT_PARTS:
            texts.append(_part_text(part, f"message.content[{i}]"))
        elif kind in _REASONING_PARTS:
            thoughts.append(_part_text(part, f"message.content[{i}]"))
        else:
            raise BadResponse("bad_content", f"message.content[{i}] is a {kind!r} part, not text")
    out = {**message, "content": "".join(texts)}
    if thoughts and not any(isinstance(message.get(k), str) and message[k] for k in ("reasoning", "reasoning_content")):
        out["reasoning"] = "".join(thoughts)
    return out


MAX_TOKENS_COUNT = 2**31 - 1  # the int32 columns of the output


def token_count(usage: dict[str, Any], key: str) -> int | None:
    """A usage count, checked: absent or null is unknown; anything but an integer in 0..2**31-1 is a bad reply
    (retried), never a shard that cannot be written."""
    value = usage.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKENS_COUNT:
        raise BadResponse("bad_usage", f"usage.{key} is {str(value)[:40]}, not a count in 0..{MAX_TOKENS_COUNT}")
    return value


class EndpointBackend:
    name = "openai"

    def __init__(self, endpoint: str, served_model: str, config: SampleConfig, api_key: str | None) -> None:
        check_endpoint_url(endpoint)
        if not served_model:
            raise BackendError("--endpoint needs --served-model: the model name the server serves")
        check_flavor(config)
        check_extra_body(config)
        self.base_url = endpoint.rstrip("/")
        self.served_model = served_model
        self.config = config
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._key_set = bool(api_key)

    def identity(self) -> dict[str, Any]:
        # Not the URL: the same server is reached under other names from another pod.
        return {"engine": "endpoint", "model": self.served_model}

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "endpoint": redact_url(self.base_url), "served_model": self.served_model,
                "api_flavor": self.config.api_flavor, "api_key_env": self.config.api_key_env,
                "api_key_set": self._key_set, "client": f"aiohttp {aiohttp.__version__}"}

    def preflight(self) -> None:
        """Fail early and by name when the server cannot be reached, refuses the key, or does not serve the
        model; servers whose /models is broken or missing are let through (the first request will tell)."""
        rng = random.Random()
        tries = min(self.config.max_attempts, 3)
        last = ""
        for attempt in range(1, tries + 1):
            status, content, last = _get(f"{self.base_url}/models", self._headers, self.config.connect_timeout_s)
            if status is None:
                if attempt < tries:
                    time.sleep(backoff_delay(attempt, self.config.backoff_initial_s, self.config.backoff_max_s, rng))
                continue
            if status in (401, 403):
                raise BackendError(f"endpoint {redact_url(self.base_url)} refused the API key from "
                                   f"${self.config.api_key_env} ({status}): {server_message(content)}")
            if status == 200:
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    served = [m.get("id") for m in orjson.loads(content).get("data", [])]
                    if served and self.served_model not in served:
                        raise BackendError(f"endpoint {redact_url(self.base_url)} does not serve "
                                           f"{self.served_model!r}; it serves {served}")
            return
        raise BackendError(f"cannot reach endpoint {redact_url(self.base_url)} ({last}); is the server up, and is "
                           "the URL the API root (…/v1)?")

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        """Run the requests on an event loop in a thread; completions come back through a queue as they finish,
        so the caller's shard writes never stall the requests in flight. Backpressure: a worker starts its next
        request only while fewer than 2 x concurrency completions are in flight or waiting for the caller, so a
        slow caller (an S3 write retrying) bounds memory and what a kill can lose."""
        results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        stop = threading.Event()
        gate = _Gate()
        thread = threading.Thread(target=self._thread_main, args=(requests, results, stop, gate),
                                  name="klear-sample-http", daemon=True)
        thread.start()
        try:
            while True:
                item = results.get()
                if item is _STOP:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
                gate.release()  # the caller is done with it: one more request may start
        finally:
            stop.set()
            thread.join(timeout=30)

    def close(self) -> None:
        pass

    # ----------------------------------------------------------------------- event-loop side

    def _thread_main(self, requests: Sequence[Request], results: queue.SimpleQueue[Any], stop: threading.Event,
                     gate: _Gate) -> None:
        try:
            asyncio.run(self._run_all(requests, results, stop, gate))
            results.put(_STOP)
        except BaseException as exc:  # noqa: BLE001 - everything goes to the caller's thread
            results.put(exc)

    async def _run_all(self, requests: Sequence[Request], results: queue.SimpleQueue[Any], stop: threading.Event,
                       gate: _Gate) -> None:
        limit = self.config.concurrency
        gate.open(asyncio.get_running_loop(), 2 * limit)
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, ttl_dns_cache=300)
        # aiohttp's own total timeout covers connect, send and the whole body: a trickling server is cut too.
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s, sock_connect=self.config.connect_timeout_s)
        pending = iter(requests)  # shared by the workers; one event loop, so no lock is needed
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self._headers) as session:

            async def worker(seed: int) -> None:
                rng = random.Random(seed)
                while not stop.is_set():
                    await gate.acquire()
                    request = next(pending, None)
                    if request is None:
                        return
                    results.put(await self._sample(session, request, rng))

            async def watch(tasks: list[asyncio.Task[None]]) -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.1)
                for task in tasks:
                    task.cancel()

            tasks = [asyncio.create_task(worker(i)) for i in range(min(limit, len(requests)))]
            watcher = asyncio.create_task(watch(tasks))
            try:
                await asyncio.gather(*tasks)
            except asyncio.CancelledError:
                pass
            finally:
                watcher.cancel()
                for task in tasks:
                    task.cancel()

    async def _sample(self, session: aiohttp.ClientSession, request: Request, rng: random.Random) -> Completion:
        config = self.config
        url = f"{self.base_url}/chat/completions"
        body = orjson.dumps(request_body(config, self.served_model, request))
        kind, error = "", ""
        for attempt in range(1, config.max_attempts + 1):
            retry_after: float | None = None
            try:
                async with session.post(url, data=body) as response:
                    status, content = response.status, await response.read()
                    header = response.headers.get("Retry-After")
                verdict = classify_status(status)
                if verdict == "ok":
                    return parse_completion(orjson.loads(content), request, attempt, self.served_model,
                                            config.allow_model_mismatch)
                kind, error = f"http_{status}", server_message(content, str(response.reason or ""))
                if verdict == "fatal":
                    raise BackendError(f"endpoint {redact_url(self.base_url)} answered {status} for model "
                                       f"{self.served_model!r}: {error}")
                if verdict == "unit":
                    break
                retry_after = parse_retry_after(header)
            except BadResponse as exc:
                kind, error = exc.kind, str(exc)
            except orjson.JSONDecodeError as exc:
                kind, error = "bad_json", f"body is not JSON: {exc}"
            except TimeoutError:
                kind, error = "timeout", f"no complete answer within {config.request_timeout_s:g} s"
            except aiohttp.ClientError as exc:
                # Refused or dropped connections, a server that restarted mid-answer.
                kind, error = "connection", f"{type(exc).__name__}: {exc}"
            if attempt < config.max_attempts:
                delay = backoff_delay(attempt, config.backoff_initial_s, config.backoff_max_s, rng, retry_after,
                                      config.retry_after_max_s)
                log.debug("%s#%d attempt %d: %s (%s); next in %.2f s", request.prompt.id, request.sample, attempt,
                          kind, error[:200], delay)
                await asyncio.sleep(delay)
        return Completion(request=request, parsed=None, attempts=attempt, error_kind=kind, error=error,
                          model=self.served_model)


class _Gate:
    """A semaphore of the event loop that the caller's thread releases."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def open(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self._loop, self._semaphore = loop, asyncio.Semaphore(size)

    async def acquire(self) -> None:
        assert self._semaphore is not None
        await self._semaphore.acquire()

    def release(self) -> None:
        if self._loop is not None and self._semaphore is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop may have just finished
                self._loop.call_soon_threadsafe(self._semaphore.release)


def _get(url: str, headers: dict[str, str], timeout: float) -> tuple[int | None, bytes, str]:
    """(status, body, error) of a GET; status None when no HTTP answer came (refused, timed out, dropped)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            return response.status, response.read(), ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), ""
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return None, b"", f"{type(exc).__name__}: {reason}"
