"""SFT: packing efficiency against plain padding on long-CoT lengths, and tiny-model training speed on CPU.

    python benchmarks/bench_sft.py [--samples 3000] [--max-length 32768] [--batch 8]

1. Lengths drawn from a long-tailed (log-normal) distribution like long-CoT teacher samples:
   median ~6K tokens, a tail to the 32K limit (longer ones are skipped by the stage, as here).
   Prints the fraction of non-padding tokens of (a) plain padding: random batches of `--batch`
   sequences padded to their longest, and (b) TRL's best-fit-decreasing packing into rows of
   `--max-length` (what the stage trains on). Target for packing: >= 0.95.
2. Trains the tiny model (tiny preset, one epoch of the demo data) and prints tokens/s from the
   stage's own metrics, for regressions.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.repeat when run as a script
from benchmarks.repeat import preamble  # noqa: E402


def long_cot_lengths(count: int, max_length: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(mean=np.log(6000), sigma=0.8, size=count * 2).astype(int) + 200
    return [int(n) for n in lengths if n <= max_length][:count]


def padding_efficiency(lengths: list[int], batch: int, seed: int = 0) -> float:
    order = list(lengths)
    random.Random(seed).shuffle(order)
    padded = sum(max(order[i : i + batch]) * len(order[i : i + batch]) for i in range(0, len(order), batch))
    return sum(lengths) / padded


def packing_efficiency(lengths: list[int], max_length: int) -> tuple[float, int, float]:
    """(fraction of non-padding tokens, packed rows, seconds) with TRL's BFD packing on real token rows."""
    import datasets
    from trl.data_utils import pack_dataset

    rows = datasets.Dataset.from_dict({"input_ids": [np.ones(n, dtype=np.int32) for n in lengths]})
    started = time.perf_counter()
    packed = pack_dataset(rows, max_length, strategy="bfd")
    seconds = time.perf_counter() - started
    tokens = sum(len(ids) for ids in packed["input_ids"])
    assert tokens == sum(lengths), "BFD packing must not drop tokens of samples within max_length"
    return tokens / (len(packed) * max_length), len(packed), seconds


def tiny_model_speed() -> dict[str, float]:
    from klear.common.config import load_config
    from klear.demo.generate import generate
    from klear.demo.tiny_model import build
    from klear.sft.config import SftConfig
    from klear.sft.stage import run

    with tempfile.TemporaryDirectory(prefix="bench-sft-") as tmp:
        root = Path(tmp)
        build(str(root / "model"))
        generate(str(root / "data"), math_count=400, code_count=16, seed=0)
        config = load_config(SftConfig, "tiny", ["num_epochs=1", "save_steps=100000", "logging_steps=5"])
        report = run(str(root / "model"), [str(root / "data" / "math.jsonl"), str(root / "data" / "code.jsonl")],
                     str(root / "out"), config, work_dir=str(root / "work"))
    return report["metrics"] | {"steps": report["training"]["global_step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--max-length", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args()
    print(preamble("trl", "datasets", "torch", "transformers"), flush=True)

    lengths = long_cot_lengths(args.samples, args.max_length)
    print(f"lengths: {len(lengths)} samples, median {int(np.median(lengths))}, p99 {int(np.percentile(lengths, 99))}, "
          f"max {max(lengths)} tokens ({sum(lengths) / 1e6:.1f}M tokens)")
    padded = padding_efficiency(lengths, args.batch)
    packed, rows, seconds = packing_efficiency(lengths, args.max_length)
    print(f"plain padding, random batches of {args.batch}: {padded:.3f} non-padding tokens")
    print(f"BFD packing into {args.max_length}-token rows: {packed:.3f} non-padding tokens "
          f"({rows} rows, packed in {seconds:.2f} s)  target >= 0.95: {'met' if packed >= 0.95 else 'NOT met'}")
    if not args.skip_training:
        speed = tiny_model_speed()
        print(f"tiny model on CPU (tiny preset, 1 epoch, {int(speed['steps'])} steps): "
              f"{speed['tokens_per_second']:.0f} tokens/s, train runtime {speed['train_runtime']:.1f} s")


if __name__ == "__main__":
    main()
