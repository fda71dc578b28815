"""A loopback stand-in for the Kubeflow Model Registry's REST server (its Go server is not installable here), just
the calls `ModelRegistry.register_model` and the look-ups make, on the paths of the client's API
(/api/model_registry/v1). Every request body is parsed, and every response built, by `mr_openapi`'s models, which
the client's package generates from the server's published OpenAPI document: a body that departs from the schema
fails the request (400) and the test."""

from __future__ import annotations

import itertools
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API = "/api/model_registry/v1"


class RegistryState:
    """What the stub holds, by id; the requests it saw (method, path, Authorization header)."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, dict[str, Any]] = {}
        self.artifacts: dict[str, list[dict[str, Any]]] = {}  # version id -> its artifacts
        self.requests: list[tuple[str, str, str]] = []
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def new_id(self) -> str:
        return str(next(self.ids))


def _handler(state: RegistryState) -> type[BaseHTTPRequestHandler]:
    import mr_openapi

    def stamped(body: dict[str, Any], ident: str) -> dict[str, Any]:
        return {**body, "id": ident, "createTimeSinceEpoch": "1", "lastUpdateTimeSinceEpoch": "1"}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _missing(self, what: str) -> None:
            self._reply(404, mr_openapi.Error(code="404", message=f"{what} not found").to_dict())

        def _found(self, found: list[dict[str, Any]], what: str) -> None:
            if found:
                self._reply(200, found[0])
            else:
                self._missing(what)

        def _route(self) -> tuple[str, dict[str, str]]:
            parsed = urllib.parse.urlsplit(self.path)
            state.requests.append((self.command, parsed.path, self.headers.get("Authorization", "")))
            return parsed.path.removeprefix(API), dict(urllib.parse.parse_qsl(parsed.query))

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path, query = self._route()
            with state.lock:
                if path == "/registered_models":
                    items = list(state.models.values())[: int(query.get("pageSize", "100"))]
                    self._reply(200, mr_openapi.RegisteredModelList.from_dict(
                        {"nextPageToken": "", "pageSize": len(items), "size": len(items), "items": items}).to_dict())
                elif path == "/registered_model":
                    found = [m for m in state.models.values() if m["name"] == query.get("name")]
                    self._found(found, f"registered model {query.get('name')}")
                elif path == "/model_version":
                    found = [v for v in state.versions.values() if v["name"] == query.get("name")
                             and v["registeredModelId"] == query.get("parentResourceId")]
                    self._found(found, f"model version {query.get('name')}")
                else:
                    self._missing(path)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            path, _ = self._route()
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            try:
                with state.lock:
                    self._create(path, body)
            except ValueError as exc:  # pydantic's ValidationError included: the body departs from the schema
                self._reply(400, mr_openapi.Error(code="400", message=str(exc)[:2000]).to_dict())

        def _create(self, path: str, body: dict[str, Any]) -> None:
            if path == "/registered_models":
                created = mr_openapi.RegisteredModelCreate.from_dict(body)
                if any(m["name"] == created.name for m in state.models.values()):
                    self._reply(409, mr_openapi.Error(code="409", message="duplicate name").to_dict())
                    return
                ident = state.new_id()
                state.models[ident] = mr_openapi.RegisteredModel.from_dict(stamped(created.to_dict(), ident)).to_dict()
                self._reply(201, state.models[ident])
            elif path == "/model_versions":
                version = mr_openapi.ModelVersionCreate.from_dict(body)
                if version.registered_model_id not in state.models:
                    self._missing(f"registered model {version.registered_model_id}")
                    return
                ident = state.new_id()
                state.versions[ident] = mr_openapi.ModelVersion.from_dict(stamped(version.to_dict(), ident)).to_dict()
                self._reply(201, state.versions[ident])
            elif path.startswith("/model_versions/") and path.endswith("/artifacts"):
                version_id = path.split("/")[2]
                artifact = mr_openapi.Artifact.from_dict(body)
                if version_id not in state.versions:
                    self._missing(f"model version {version_id}")
                    return
                stored = mr_openapi.Artifact.from_dict(stamped(artifact.to_dict(), state.new_id())).to_dict()
                state.artifacts.setdefault(version_id, []).append(stored)
                self._reply(200, stored)
            else:
                self._missing(path)

    return Handler


@contextmanager
def registry_stub() -> Iterator[tuple[str, RegistryState]]:
    """The stub on a free loopback port: yields its address (http://127.0.0.1:PORT) and its state."""
    state = RegistryState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
