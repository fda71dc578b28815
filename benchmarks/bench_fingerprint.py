"""What identifying a plain model folder by content costs, on a folder holding one large weights file.

    python benchmarks/bench_fingerprint.py [--size-mb 1024] [--dir DIR] [--repeats 3]

Figures, in one run on the same file: a plain read of it (8 MB blocks, nothing done with them), the
fingerprint without a cache (every byte through sha256, then the digest cached beside the folder), and the
fingerprint again (stat only, digests from the cache); the ratio hash / read says what hashing adds to reading.
The file was just written, so both read it from the page cache: a read from disk adds the same time to both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from klear.sample.model_folder import digest_cache_path, fingerprint

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


def best_of(repeats: int, call: Callable[[], object], before: Callable[[], object] = lambda: None) -> float:
    """The median wall time of `repeats` calls (`before` runs untimed ahead of each)."""
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the weights file (default 1024)")
    parser.add_argument("--dir", help="where to write the folder (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="klear-bench-fp-", dir=args.dir) as tmp:
        folder = Path(tmp) / "model"
        weights = write_folder(folder, args.size_mb)
        cache = digest_cache_path(folder)
        assert cache is not None
        gb = weights.stat().st_size / 1e9
        read_all(weights)  # once, so the read and the hash both find it in the page cache
        read_s = best_of(args.repeats, lambda: read_all(weights))
        cold_s = best_of(args.repeats, lambda: fingerprint(folder, None), lambda: cache.unlink(missing_ok=True))
        fingerprint(folder, None)
        cached_s = best_of(args.repeats, lambda: fingerprint(folder, None))
        uncached_s = best_of(args.repeats, lambda: fingerprint(folder, None, cache=False))
    print(f"fingerprint of a plain model folder, {gb:.2f} GB of weights (median of {args.repeats}):")
    print(f"  plain read:             {read_s:7.3f} s  ({gb / read_s:.2f} GB/s)")
    print(f"  hash, no cache yet:     {cold_s:7.3f} s  ({gb / cold_s:.2f} GB/s), {cold_s / read_s:.2f}x the plain read")
    print(f"  hash, cache off:        {uncached_s:7.3f} s  ({uncached_s / read_s:.2f}x the plain read)")
    print(f"  from the cache (stat):  {cached_s * 1000:7.3f} ms ({cached_s / read_s:.4f}x the plain read)")


if __name__ == "__main__":
    main()
