"""Costs of the sample stage that are ours, not the model's, in one run.

    python benchmarks/bench_sample.py [--prompts 2500] [--n 4] [--concurrency 64] [--resume-units 100000] [--s3]

1. Client overhead: `klear sample` (a subprocess, tiny preset otherwise) against a local OpenAI-compatible
   server that answers instantly (a minimal asyncio HTTP/1.1 server in another process, canned R1-shaped
   answers), so the figure is what the client sustains: samples/s over the sampling phase, the whole run's
   wall time (load, shards, publish), and the peak RSS of the sampling process. Target >= 500 samples/s on 2 cores.
2. Resume cost: a work area of a 100,000-unit run with 60% done (shards of 256 units), then the time a restart
   takes to find the missing units (list + read the shard indexes + compare with the prompts). Target <= 2 s.
   Local disk by default; --s3 also on a SeaweedFS server on loopback (pipelines/local_s3.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.repeat when run as a script
from benchmarks.repeat import preamble  # noqa: E402

_ANSWER = json.dumps({
    "id": "cmpl", "object": "chat.completion", "model": "bench",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "The answer is \\boxed{42}.",
        "reasoning": "Let me think. " * 40}}],
    "usage": {"prompt_tokens": 30, "completion_tokens": 200, "total_tokens": 230},
}).encode()
_MODELS = json.dumps({"object": "list", "data": [{"id": "bench"}]}).encode()


class _Instant(asyncio.Protocol):
    """HTTP/1.1 keep-alive, answers every complete request at once: the cheapest server Python can be."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport: asyncio.Transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < head_end + 4 + length:
                return
            self.buffer = self.buffer[head_end + 4 + length:]
            body = _MODELS if head.startswith("GET") else _ANSWER
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)


def serve(port: int) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Instant, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def client_overhead(prompts: int, n: int, concurrency: int, workdir: Path) -> None:
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        source = workdir / "prompts.jsonl"
        with open(source, "w") as fh:
            for i in range(prompts):
                fh.write(json.dumps({"id": f"q{i}", "prompt": f"What is {i} + {i}? Put the answer in \\boxed{{}}."}) + "\n")
        out = workdir / "out"
        command = [sys.executable, "-m", "klear.cli", "sample", "--prompts", str(source), "--output", str(out),
                   "--endpoint", f"http://127.0.0.1:{port}/v1", "--served-model", "bench", "--config", "tiny",
                   "--set", f"n={n}", "--set", f"concurrency={concurrency}", "--set", "shard_size=1024",
                   "--set", "progress_seconds=600.0"]
        started = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        wall = time.monotonic() - started
        if result.returncode != 0:
            raise SystemExit(f"klear sample failed:\n{result.stderr[-3000:]}")
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the finished klear process (the server still runs)
        peak_mb = usage.ru_maxrss / 1024
        report = json.loads((out / "report.json").read_text())
        speed = report["speed"]
        print(f"client overhead: {report['units']['rows']} samples ({prompts} prompts x {n}), concurrency "
              f"{concurrency}, {os.cpu_count()} cores (server on the same cores)")
        print(f"  sampling phase: {speed['samples_per_s']:.0f} samples/s over {speed['sampling_s']:.2f} s "
              f"(target >= 500/s)")
        print(f"  whole command:  {wall:.2f} s wall (start-up, prompts, shards, publish); in-stage {speed['elapsed_s']:.2f} s")
        print(f"  peak RSS of the sampling process: {peak_mb:.0f} MB; its CPU time per sample, whole command: "
              f"{1000 * (usage.ru_utime + usage.ru_stime) / report['units']['rows']:.2f} ms")
    finally:
        server.terminate()
        server.wait(timeout=10)


def resume_cost(units: int, done_fraction: float, where: str, label: str) -> None:
    from klear.common.config import load_config
    from klear.sample.backends.base import Completion, Request
    from klear.sample.config import SampleConfig
    from klear.sample.reasoning import Parsed
    from klear.sample.store import WorkArea
    from klear.sample.units import Prompt, canonical_hash, pending_units

    n = 4
    config = load_config(SampleConfig, "tiny", [f"n={n}"])
    prompts = []
    for i in range(units // n):
        chat = ({"role": "user", "content": f"problem {i}"},)
        prompts.append(Prompt(i, f"q{i}", chat, chat[0]["content"], "bench", "{}", f"bench:{i}", canonical_hash(chat)))
    area = WorkArea(where)
    done_units = int(units * done_fraction)
    batch: list[Completion] = []
    parsed = Parsed("short reasoning", "42", True)
    started = time.monotonic()
    for k in range(done_units):
        prompt = prompts[k // n]
        batch.append(Completion(Request(prompt, k % n, k), parsed, "stop", 10, 20, "bench"))
        if len(batch) == 256:
            area.write_shard(batch)
            batch = []
    if batch:
        area.write_shard(batch)
    setup = time.monotonic() - started
    started = time.monotonic()
    restarted = WorkArea(where)
    scan = restarted.scan()
    missing = pending_units(prompts, [config.n] * len(prompts), scan.hashes())
    elapsed = time.monotonic() - started
    assert len(missing) == units - done_units, (len(missing), units - done_units)
    print(f"resume cost ({label}): {units} units, {done_units} done in {len(scan.shards)} shards -> "
          f"{len(missing)} missing found in {elapsed:.2f} s (target <= 2 s; writing the shards took {setup:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=2500)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--resume-units", type=int, default=100_000)
    parser.add_argument("--s3", action="store_true", help="also measure the resume cost on a loopback S3 server")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    print(preamble("aiohttp", "pyarrow"), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-sample-") as tmp:
        client_overhead(args.prompts, args.n, args.concurrency, Path(tmp))
        resume_cost(args.resume_units, 0.6, str(Path(tmp) / "work"), "local disk")
        if args.s3:
            import boto3

            from pipelines import local_s3 as s3server

            s3 = s3server.start(Path(tmp) / "seaweed")
            try:
                os.environ.update(s3.env)
                boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
                resume_cost(args.resume_units, 0.6, "s3://bench/run.work", "S3 on loopback")
            finally:
                s3.stop()


if __name__ == "__main__":
    main()
