"""The attention of SFT's packed rows (klear.training.hf_model.resolve_attention): under flex_attention the tiny Qwen3
model keeps the documents of a row packed by the stage's own SFTTrainer apart, as sdpa's dense mask does and as each
document run alone does, from a BlockMask (no L x L tensor); "auto" picks flex only where it trains (CUDA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from klear.common.config import load_config
from klear.plan import memory
from klear.sft.config import SftConfig
from klear.training import hf_model

# 440 tokens in one row of the tiny preset's 512: four 128-token blocks, two document boundaries inside blocks.
DOCUMENT_LENGTHS = (150, 200, 90)
BLOCK_MASK_TENSORS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                      "q_indices", "full_q_num_blocks", "full_q_indices")


def packed_row(tiny_model: str, work: Path) -> tuple[Any, dict[str, Any]]:
    """The stage's SFTTrainer (tiny preset: bfd packing, padding-free) on three documents, and its first batch."""
    import datasets

    from klear.sft.stage import load_tokenizer, make_trainer, training_arguments

    config = load_config(SftConfig, "tiny")
    tokenizer = load_tokenizer(Path(tiny_model), tiny_model, config)
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(len(tokenizer), (n,), generator=generator).tolist() for n in DOCUMENT_LENGTHS]
    rows = datasets.Dataset.from_dict({"input_ids": documents, "assistant_masks": [[1] * n for n in DOCUMENT_LENGTHS]})
    trainer = make_trainer(Path(tiny_model), tokenizer, rows, training_arguments(config, work))
    return trainer.model.eval(), next(iter(trainer.get_train_dataloader()))


def run(model: Any, implementation: str, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Logits and loss of `inputs` under `implementation`, and the attention mask the decoder layers were given."""
    seen: dict[str, Any] = {}

    def keep_mask(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        seen["mask"] = kwargs.get("attention_mask")

    model.set_attn_implementation(implementation)
    hook = model.model.layers[0].register_forward_pre_hook(keep_mask, with_kwargs=True)
    try:
        with torch.no_grad():  # PyTorch has no flex_attention backward on CPU
            out = model(**inputs)
    finally:
        hook.remove()
    return out.logits[0], out.loss, seen["mask"]


def document_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100)


def test_flex_attention_keeps_packed_documents_apart_without_a_dense_mask(tiny_model: str, tmp_path: Path) -> None:
    from torch.nn.attention.flex_attention import BlockMask

    model, batch = packed_row(tiny_model, tmp_path)
    positions = batch["position_ids"][0]
    length = positions.numel()
    # Padding-free: one row, the documents told apart by their position ids alone.
    assert "attention_mask" not in batch and length == sum(DOCUMENT_LENGTHS)
    starts = (positions == 0).nonzero().flatten().tolist()
    spans = list(zip(starts, starts[1:] + [length]))
    assert sorted(end - start for start, end in spans) == sorted(DOCUMENT_LENGTHS)

    flex_logits, flex_loss, flex_mask = run(model, "flex_attention", batch)
    dense_logits, dense_loss, dense_mask = run(model, "sdpa", batch)
    assert isinstance(flex_mask, BlockMask)
    held = [getattr(flex_mask, name) for name in BLOCK_MASK_TENSORS]
    assert max(t.numel() for t in held) == 4 * 4  # ceil(440 / 128) query blocks x as many key blocks
    assert sum(t.numel() * t.element_size() for t in held) == memory.flex_block_mask_bytes(length)
    assert isinstance(dense_mask, torch.Tensor) and dense_mask.shape == (1, 1, length, length)
    torch.testing.assert_close(flex_loss, dense_loss, atol=1e-5, rtol=1e-5)

    ids, labels = batch["input_ids"][0], batch["labels"][0]
    unmasked, _, _ = run(model, "sdpa", {"input_ids": batch["input_ids"]})  # one causal sequence: documents mixed
    for start, end in spans:
        alone, _, _ = run(model, "sdpa", {"input_ids": ids[None, start:end]})
        for packed in (flex_logits, dense_logits):
            torch.testing.assert_close(packed[start:end], alone, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(document_loss(packed[start:end], labels[start:end]),
                                       document_loss(alone, labels[start:end]), atol=1e-5, rtol=1e-5)
        if start:  # what the comparison would catch: a later document seeing the ones before it
            assert not torch.allclose(unmasked[start:end], alone, atol=1e-3)


def test_auto_picks_flex_attention_for_packed_rows_on_cuda_only() -> None:
    resolve = hf_model.resolve_attention
    assert resolve("auto", packed=True, flash_attn=False, cuda=True) == "flex_attention"
    assert resolve("auto", packed=True, flash_attn=True, cuda=True) == "flash_attention_2"
    assert resolve("auto", packed=False, flash_attn=False, cuda=True) == "sdpa"  # padded rows (GPPO)
    assert resolve("auto", packed=True, flash_attn=False, cuda=False) == "sdpa"
    assert resolve("eager", packed=True, flash_attn=True, cuda=True) == "eager"
    if torch.cuda.is_available():
        return
    assert hf_model.attention("auto", packed=True) in ("sdpa", "flash_attention_2")
    # Why not flex on CPU: training there fails in its first forward.
    from torch.nn.attention.flex_attention import flex_attention

    query = torch.randn(1, 1, 128, 16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(query, query, query)
