"""Typed stage configs: a YAML preset or file, then `key=value` overrides, validated on load."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pydantic
import yaml

__all__ = ["ConfigError", "StageConfig", "load_config"]


class ConfigError(ValueError):
    """A config file or override that does not fit the stage's config; the message names the key."""


class StageConfig(pydantic.BaseModel):
    """Base of every stage config: unknown keys are errors, values are type-checked."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, validate_default=True)

    # Package holding this config's presets/ folder (paper.yaml, tiny.yaml); set by each stage.
    preset_package: ClassVar[str] = ""

    def dump_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


C = TypeVar("C", bound=StageConfig)


def preset_names(cls: type[StageConfig]) -> list[str]:
    """The presets shipped with a stage config (its package's presets/*.yaml)."""
    presets = resources.files(cls.preset_package) / "presets"
    return sorted(p.name.removesuffix(".yaml") for p in presets.iterdir() if p.name.endswith(".yaml"))


def _preset_text(cls: type[StageConfig], name: str) -> tuple[str, str]:
    package = cls.preset_package
    presets = resources.files(package) / "presets"
    available = preset_names(cls)
    if name not in available:
        raise ConfigError(f"unknown preset {name!r} for {cls.__name__}; presets: {', '.join(available)}")
    return (presets / f"{name}.yaml").read_text(), f"preset {name!r} ({package}/presets/{name}.yaml)"


def _read_source(cls: type[StageConfig], source: str) -> tuple[dict[str, Any], str]:
    """`source` is a preset name (paper, tiny) or a path to a YAML file."""
    if source.endswith((".yaml", ".yml")) or "/" in source:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {source}")
        text, origin = path.read_text(), str(path)
    else:
        text, origin = _preset_text(cls, source)
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of config keys, got {type(data).__name__}")
    return data, origin


def _apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r} is not of the form key=value")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part!r} is not a section")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: value is not valid YAML: {exc}") from exc


def load_config(cls: type[C], source: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> C:
    """Build a stage config from a preset name or YAML file (defaults if None) plus overrides."""
    data, origin = _read_source(cls, source) if source else ({}, "defaults")
    for override in overrides:
        _apply_override(data, override)
    try:
        return cls.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "(root)"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key {field!r}")
            else:
                problems.append(f"{field}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"{cls.__name__} from {origin}: " + "; ".join(problems)) from None
