"""Cluster and model shapes: shipped in shapes/<name>.yaml (this package's data), or a YAML file of the same keys."""

from __future__ import annotations

from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

SHAPES = "shapes"


@dataclass(frozen=True)
class Cluster:
    """One kind of GPU node: its GPUs and their memory, CPUs, memory and local disk; and how many of them the run
    may use at once (0: not stated, the GPUs at once are not checked)."""

    name: str
    gpus_per_node: int
    gpu_memory_gib: float
    cpus: int
    memory_gib: float
    local_disk_gib: float
    nodes: int = 0


@dataclass(frozen=True)
class Model:
    """The config.json fields the checks read (MLA and MoE fields only for models that have them)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    torch_dtype: str
    tie_word_embeddings: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    moe_intermediate_size: int = 0
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    first_k_dense_replace: int = 0
    checkpoint_dtype: str = ""  # the stored weights' dtype where it is not torch_dtype (DeepSeek-R1's FP8)


def shipped(kind: str) -> list[str]:
    """The names of the shipped shapes of a kind ("cluster" or "model")."""
    folder = resources.files("klear.plan") / SHAPES
    names = sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
    return [name for name in names if _read_shipped(name).get("kind") == kind]


def _read_shipped(name: str) -> dict[str, Any]:
    return yaml.safe_load((resources.files("klear.plan") / SHAPES / f"{name}.yaml").read_text())


def _build(cls: type, name: str, data: Any, origin: str) -> Any:
    """`cls` from a shape's mapping; an error names the file and the key."""
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: expected a mapping of shape keys, got {type(data).__name__}")
    data = {k: v for k, v in data.items() if k != "kind"}
    known = {f.name for f in fields(cls)} - {"name"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{origin}: unknown key {unknown[0]!r}; keys: {', '.join(sorted(known))}")
    try:
        return cls(name=name, **data)
    except TypeError as exc:
        raise ValueError(f"{origin}: {exc}") from None


def load(cls: type, kind: str, source: str) -> Any:
    """A shipped shape by name, or a YAML file (a path containing "/" or ending in .yaml)."""
    if "/" in source or source.endswith((".yaml", ".yml")):
        path = Path(source)
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{kind} file {source}: {exc}") from None
        return _build(cls, path.stem, data, f"{kind} file {source}")
    names = shipped(kind)
    if source not in names:
        raise ValueError(f"unknown {kind} {source!r}; shipped: {', '.join(names)} (or a YAML file)")
    return _build(cls, source, _read_shipped(source), f"{kind} {source!r} (klear/plan/{SHAPES}/{source}.yaml)")


def cluster(source: str) -> Cluster:
    return load(Cluster, "cluster", source)


def model(source: str) -> Model:
    return load(Model, "model", source)
