"""An OpenAI-compatible chat server of the tests' own, on 127.0.0.1, that misbehaves on request.

A prompt may carry a plan, `[[plan:429,500,ok]]`: attempt k of that unit (same prompt and seed) gets the k-th
behaviour, the last one repeating. Behaviours:

    ok        200, reasoning in `message.reasoning` (vLLM >= 0.10)        ok_rc     ... in `reasoning_content`
    ok_think  200, inline `<think>...</think>` in content                 ok_r1     content "...</think>\n\nanswer"
    plain     200, no reasoning at all                                    cut       finish length, reasoning only
    429       429 with Retry-After (`retry_after` seconds)                500 / 503 server errors
    400 / 404 client errors with an OpenAI error body                     nochoices 200 {"error": ...}, no choices
    hang      answers nothing for `hang_s` (past the client's timeout)    drop      closes the connection unanswered
    garbage   200 with a body that is not JSON

Replies that look like successes but are not what they seem:

    parts     content as a list of text parts (a valid OpenAI shape)     parts_think  Mistral-style thinking + text parts
    null      content null, no reasoning                                 empty     content "", no reasoning
    image     content holding only an image part                         other     answered by `other_model`
    cut_think finish length, content null, no reasoning: vLLM's deepseek_r1 parser on a reply cut right after <think>
    huge      usage.prompt_tokens 3000000000                              negative  usage.completion_tokens -95

Two `</think>` in one reply (TWO_ENDS_ANSWER: the answer after the last one, a draft box between them):

    two_ends         as vLLM's deepseek_r1 parser splits it: reasoning up to the first `</think>`, the rest content
    two_ends_inline  no parser: all of it inline in content

Without a plan every request gets `default` ("ok"). Responses are a deterministic function of (prompt, seed),
so seeded runs can be compared. Every request is counted; the Authorization header is checked when a key is set.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PLAN = re.compile(r"\[\[plan:([a-z0-9_,]+)\]\]")


TWO_ENDS_DRAFT = "mid-way \\boxed{1}"  # between the two </think>
TWO_ENDS_ANSWER = "The answer is \\boxed{2}"  # after the last one


def expected_parts(prompt: str, seed: int) -> tuple[str, str]:
    """The (reasoning, answer) the server gives for a prompt and seed."""
    digest = hashlib.sha256(f"{prompt}|{seed}".encode()).hexdigest()[:12]
    return f"thinking about {digest}", f"the answer is {int(digest[:4], 16)}"


@dataclass
class FakeServer:
    served_model: str = "fake-teacher"
    api_key: str | None = None
    default: str = "ok"
    retry_after: str = "1"
    hang_s: float = 5.0
    latency_s: float = 0.0
    requests: int = 0
    attempts: Counter[tuple[str, int]] = field(default_factory=Counter)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth_seen: list[str | None] = field(default_factory=list)
    keep_bodies: bool = True
    other_model: str = "some-other-model"
    obey_plans: bool = True  # False: a healed server, every request gets `default`

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def behaviour(self, body: dict[str, Any]) -> tuple[str, str, int]:
        prompt = body["messages"][-1]["content"]
        seed = int(body.get("seed", -1))
        with self._lock:
            self.requests += 1
            self.attempts[(prompt, seed)] += 1
            attempt = self.attempts[(prompt, seed)]
            if self.keep_bodies:
                self.bodies.append(body)
        match = PLAN.search(prompt) if self.obey_plans else None
        plan = match.group(1).split(",") if match else [self.default]
        return plan[min(attempt, len(plan)) - 1], prompt, seed


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client killed mid-request (the SIGKILL tests) is expected, not worth a traceback


def _completion(server: FakeServer, body: dict[str, Any], kind: str, prompt: str, seed: int) -> dict[str, Any]:
    reasoning, answer = expected_parts(prompt, seed)
    message: dict[str, Any] = {"role": "assistant"}
    finish = "stop"
    if kind == "ok":
        message.update(content=answer, reasoning=reasoning)
    elif kind == "ok_rc":
        message.update(content=answer, reasoning_content=reasoning)
    elif kind == "ok_think":
        message.update(content=f"<think>\n{reasoning}\n</think>\n\n{answer}")
    elif kind == "ok_r1":
        message.update(content=f"{reasoning}\n</think>\n\n{answer}")
    elif kind == "plain":
        message.update(content=answer)
    elif kind == "two_ends":
        message.update(content=f"{TWO_ENDS_DRAFT}\n</think>\n\n{TWO_ENDS_ANSWER}", reasoning=reasoning)
    elif kind == "two_ends_inline":
        message.update(content=f"<think>\n{reasoning}\n</think>\n\n{TWO_ENDS_DRAFT}\n</think>\n\n{TWO_ENDS_ANSWER}")
    elif kind == "cut":
        message.update(content=None, reasoning=reasoning)
        finish = "length"
    elif kind == "parts":
        message.update(content=[{"type": "text", "text": answer[:6]}, {"type": "text", "text": answer[6:]}])
    elif kind == "parts_think":
        message.update(content=[{"type": "thinking", "thinking": [{"type": "text", "text": reasoning}]},
                                {"type": "text", "text": answer}])
    elif kind in ("null", "empty"):
        message.update(content=None if kind == "null" else "")
    elif kind == "cut_think":
        message.update(content=None)
        finish = "length"
    elif kind == "image":
        message.update(content=[{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
    else:
        message.update(content=answer, reasoning=reasoning)
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(reasoning.split()) + 5, "total_tokens": 0}
    if kind == "huge":
        usage["prompt_tokens"] = 3_000_000_000
    elif kind == "negative":
        usage["completion_tokens"] = -95
    return {"id": "cmpl-1", "object": "chat.completion",
            "model": server.other_model if kind == "other" else body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}


def _handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            auth = self.headers.get("Authorization")
            server.auth_seen.append(auth)
            if server.api_key and auth != f"Bearer {server.api_key}":
                self._send(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
                return False
            return True

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": server.served_model, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length))
            if not self._authorized():
                return
            if not self.path.endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            if body.get("model") != server.served_model:
                self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                return
            kind, prompt, seed = server.behaviour(body)
            if server.latency_s:
                time.sleep(server.latency_s)
            if kind == "429":
                self._send(429, {"error": {"message": "Rate limit reached"}}, {"Retry-After": server.retry_after})
            elif kind in ("500", "503"):
                self._send(int(kind), {"error": {"message": "upstream overloaded"}})
            elif kind == "400":
                self._send(400, {"error": {"message": "This model's maximum context length is 8 tokens"}})
            elif kind == "404":
                self._send(404, {"error": {"message": "The model does not exist"}})
            elif kind == "nochoices":
                self._send(200, {"error": {"message": "rate limited by upstream", "type": "rate_limit"}})
            elif kind == "garbage":
                self._send(200, b"<html>Bad gateway</html>")
            elif kind == "hang":
                server._release.wait(server.hang_s)
                self.close_connection = True
            elif kind == "drop":
                self.close_connection = True  # nothing sent: the client sees the connection close
            else:
                self._send(200, _completion(server, body, kind, prompt, seed))

    return Handler
