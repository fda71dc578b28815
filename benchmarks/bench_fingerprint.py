"""What identifying a plain model folder by content costs, on a folder holding one large weights file.

    python benchmarks/bench_fingerprint.py [--size-mb 1024] [--dir DIR] [--repeat 3]

Four sides on the same file, taking turns `--repeat` times (each round starting with the next): a plain read of it
(8 MB blocks, nothing done with them), the fingerprint without a cache (every byte through sha256, then the digest
cached beside the folder), the fingerprint with the cache off, and the fingerprint again (stat only, digests from the
cache). Prints the machine and the package versions, then min / median / max of each side's seconds and of its ratio
to the plain read of the same round: hash / read says what hashing adds to reading. The file was just written, so
every side reads it from the page cache: a read from disk adds the same time to all."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from klear.sample.model_folder import digest_cache_path, fingerprint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, in_turns, preamble, spread, timed  # noqa: E402

_BLOCK = 8 * 1024 * 1024


def write_folder(folder: Path, size_mb: int) -> Path:
    """A plain model folder: a config and one weights file of `size_mb` MB of random bytes."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    weights = folder / "model.safetensors"
    block = os.urandom(_BLOCK)
    with open(weights, "wb") as fh:
        for _ in range(size_mb * 1024 * 1024 // _BLOCK):
            fh.write(block)
    return weights


def read_all(path: Path) -> int:
    total = 0
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            total += len(block)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the weights file (default 1024)")
    parser.add_argument("--dir", help="where to write the folder (default: a temp dir)")
    add_repeat_argument(parser)
    args = parser.parse_args()
    print(preamble(), flush=True)
    with tempfile.TemporaryDirectory(prefix="klear-bench-fp-", dir=args.dir) as tmp:
        folder = Path(tmp) / "model"
        weights = write_folder(folder, args.size_mb)
        cache = digest_cache_path(folder)
        assert cache is not None
        gb = weights.stat().st_size / 1e9
        read_all(weights)  # once, so every side finds it in the page cache

        def no_cache_yet() -> float:
            cache.unlink(missing_ok=True)
            return timed(lambda: fingerprint(folder, None))[0]

        def from_the_cache() -> float:
            fingerprint(folder, None)  # untimed: the cache is there whichever side ran before
            return timed(lambda: fingerprint(folder, None))[0]

        rounds = list(in_turns(args.repeat, [lambda: timed(lambda: read_all(weights))[0], no_cache_yet,
                                             lambda: timed(lambda: fingerprint(folder, None, cache=False))[0],
                                             from_the_cache]))
    read, cold, off, cached = ([r[side] for r in rounds] for side in range(4))
    print(f"fingerprint of a plain model folder, {gb:.2f} GB of weights:")
    print("  " + spread("plain read, s", read, digits=3))
    print("  " + spread("plain read, GB/s", [gb / s for s in read]))
    print("  " + spread("hash, no cache yet, s", cold, digits=3))
    print("  " + spread("hash, no cache yet / plain read", [c / r for c, r in zip(cold, read)], "x"))
    print("  " + spread("hash, cache off / plain read", [o / r for o, r in zip(off, read)], "x"))
    print("  " + spread("from the cache (stat), ms", [c * 1000 for c in cached], digits=3))
    print("  " + spread("from the cache / plain read", [c / r for c, r in zip(cached, read)], "x", digits=4))


if __name__ == "__main__":
    main()
