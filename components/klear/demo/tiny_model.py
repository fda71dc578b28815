"""A tiny Qwen3-architecture causal LM and its tokenizer, built in code: `klear tiny-model --output URI`.

No model hub: a byte-level BPE tokenizer is trained on the demo data's own text (so the demo's
reasoning traces take few tokens), the Qwen3 special tokens are added as single tokens
(`<|endoftext|>` pad, `<|im_start|>`, `<|im_end|>` = end of turn = EOS, `<think>`, `</think>`),
and a randomly initialised `Qwen3ForCausalLM` of a few layers is saved beside it in Hugging
Face format (safetensors, tokenizer.json, chat template, generation config). The tiny preset of
every stage starts from it, so CPU tests exercise the very code paths of the 8B run.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from klear.common import lineage, storage
from klear.common.chat import END_OF_TURN, QWEN3_CHAT_TEMPLATE, START_OF_TURN, THINK_CLOSE, THINK_OPEN

PAD = "<|endoftext|>"
SPECIAL_TOKENS = (PAD, START_OF_TURN, END_OF_TURN)
# As in Qwen3: single tokens but not "special", so decoding with skip_special_tokens (as TRL does for
# rewards) keeps them and the verifiers can see where the reasoning ends.
THINK_TOKENS = (THINK_OPEN, THINK_CLOSE)
# The pre-tokenizer pattern of Qwen2/Qwen3's tokenizer.json: `\p{N}` alone splits numbers into single digits.
QWEN_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                      r"\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the tiny model: small enough that a training step takes milliseconds on one core."""

    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 4096
    seed: int = 0
    # The tokenizer also learns from the demo's additions and the chat roles (fewer tokens per demo answer);
    # off for the tests' model, whose tokenizer their expectations were written against.
    arithmetic_corpus: bool = False
    # Qwen3's small models tie the output layer to the embeddings; the untied spec checks what ties could hide.
    tie_word_embeddings: bool = True


# "tiny": the tests' model (every test that trains builds on it: keep it fast). "demo": `make demo` and
# benchmarks/calibrate_demo.py, sized so SFT learns the demo's arithmetic in minutes on two cores.
SPECS: dict[str, TinySpec] = {
    "tiny": TinySpec(),
    # Twice as wide: ~0.4M parameters. After 4 SFT epochs of the demo's additions the tests' width reached 4.5 %
    # on the held-out split (avg@4, T=0.6, seed 0), this width 26 % in about the same minutes (one thread
    # each under load), and 66-78 % (3 seeds) after the demo preset's 8 epochs.
    "demo": TinySpec(hidden_size=128, intermediate_size=256, head_dim=32, arithmetic_corpus=True),
    # The GPU paths on vLLM's CPU build (tests/gpu_paths): its attention takes head sizes of 32 and up, and an
    # untied output layer makes a backend that drops or misloads lm_head visible.
    "vllm": TinySpec(head_dim=32, tie_word_embeddings=False),
}


def corpus(seed: int = 0, arithmetic: bool = False) -> Iterator[str]:
    """Text to train the tokenizer on: the demo data's problems and solutions, plus every printable ASCII char."""
    from klear.demo.generate import code_items, math_items
    from klear.demo.tasks import train_items

    rng = random.Random(seed)
    items = math_items(400, rng) + code_items(16, rng) + (train_items(400, seed) if arithmetic else [])
    for item in items:
        for message in item["messages"]:
            yield message["content"]
    yield "".join(chr(c) for c in range(32, 127))
    if arithmetic:
        yield "system\nuser\nassistant\n"  # the chat template's role names: one token each, not four


def train_tokenizer(spec: TinySpec) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` with the Qwen3 specials and chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Qwen2/Qwen3's pre-tokenization: the split pattern keeps every digit a token of its own (column
    # arithmetic is then copying and one-digit sums), then bytes are mapped without GPT-2's own regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - len(THINK_TOKENS),  # the think tags are added after training
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text encodes, nothing is <unk>
        show_progress=False,
    )
    tok.train_from_iterator(corpus(spec.seed, spec.arithmetic_corpus), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END_OF_TURN,
        pad_token=PAD,
        additional_special_tokens=[START_OF_TURN],
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def build_model(spec: TinySpec, tokenizer: Any) -> Any:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(spec.seed)
    eos = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    model = Qwen3ForCausalLM(config)
    # Generation stops at the end of the assistant's turn (the pitfall: a base model's <|endoftext|> never comes).
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    return model


def save_tiny_model(directory: Path, spec: TinySpec = TinySpec()) -> dict[str, Any]:
    tokenizer = train_tokenizer(spec)
    model = build_model(spec, tokenizer)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    summary = {
        "spec": asdict(spec),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "eos_token": tokenizer.eos_token,
    }
    (directory / "tiny_model.json").write_text(json.dumps(summary, indent=2))
    return summary


def build(output: str, spec: TinySpec | str = TinySpec()) -> dict[str, Any]:
    """Build the tiny model (a TinySpec, or the name of one in SPECS) and publish it to `output` (path, file:// or s3://)."""
    if isinstance(spec, str):
        spec = SPECS[spec]
    storage.check_output(output, stage="tiny-model")
    with tempfile.TemporaryDirectory(prefix="klear-tiny-") as tmp:
        summary = save_tiny_model(Path(tmp), spec)
        storage.publish_dir(tmp, output, meta={"stage": "tiny-model", **summary, "lineage": lineage.record([], None)})
    return summary


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tiny-model", help="build the tiny Qwen3-style model for the CPU preset",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, metavar="URI")
    parser.add_argument("--spec", choices=sorted(SPECS), default="tiny",
                        help="sizes: tiny (the tests' model), demo (wider, for `make demo`) or vllm (untied, head_dim 32, for "
                        "vLLM's CPU build); the flags below override")
    parser.add_argument("--layers", type=int, help="hidden layers")
    parser.add_argument("--hidden", type=int, help="hidden size (the MLP is twice as wide, heads stay 4)")
    parser.add_argument("--vocab", type=int, help="vocabulary size, at most")
    parser.add_argument("--seed", type=int, help="seed of the initial weights and the tokenizer corpus")
    parser.set_defaults(func=lambda a: print(json.dumps(build(a.output, spec_from_args(a)))))


def spec_from_args(args: argparse.Namespace) -> TinySpec:
    spec = SPECS[args.spec]
    if args.hidden is not None:
        spec = replace(spec, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                       head_dim=args.hidden // spec.num_attention_heads)
    if args.layers is not None:
        spec = replace(spec, num_hidden_layers=args.layers)
    if args.vocab is not None:
        spec = replace(spec, vocab_size=args.vocab)
    if args.seed is not None:
        spec = replace(spec, seed=args.seed)
    return spec
