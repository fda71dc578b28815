"""Typed stage configs: a YAML preset, file or storage URI (s3://), then `key=value` overrides, validated on load.

A config may build on another: `base: NAME` (a preset of the same stage, or a YAML file or URI) plus the keys
that differ; sections merge key by key, other values (lists and mappings of named items too) replace the base's.

Numbers are stricter than pydantic's lax mode: YAML `true` is not the integer 1 (a `--set ngram_size=true`
would otherwise remove every prompt), and `.inf` / `.nan` are not numbers of epochs or seconds. YAML anchors and
aliases are refused: a config needs neither, and they let a few hundred bytes expand to gigabytes.
"""

from __future__ import annotations

import copy
import dataclasses
import decimal
import fractions
import json
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import pydantic
import yaml

from klear.common import storage

__all__ = ["ConfigError", "Provenance", "StageConfig", "config_files", "config_origins", "describe_preset",
           "load_config", "origins_lines"]

QUOTE_LIMIT = 200  # characters of a value quoted in an error message
BASE_KEY = "base"  # a config's key naming the config it builds on
MAX_BASES = 32  # configs in one `base` chain below the first: a few in practice
MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KB; a larger file is something else given by mistake
DEFAULT_ORIGIN = "default"  # the origin of a value nothing set: the config class's default


class ConfigError(ValueError):
    """A config file or override that does not fit the stage's config; the message names the key."""


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text` cut to `limit` characters, saying how long it was: error messages quote values, never all of them."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# --------------------------------------------------------------------------- strict numbers


def _any_member(annotation: Any, test: Callable[[Any], bool]) -> bool:
    """`test` of a type, or of any member of a union (or of the type an Annotated wraps)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_any_member(arg, test) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _any_member(typing.get_args(annotation)[0], test)
    return test(annotation)


def _is_bool_type(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Literal:
        return any(isinstance(arg, bool) for arg in typing.get_args(annotation))
    return annotation in (bool, Any, object)


def _is_number_type(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Literal:
        return any(isinstance(arg, (int, float)) and not isinstance(arg, bool) for arg in typing.get_args(annotation))
    return isinstance(annotation, type) and issubclass(annotation, (int, float, decimal.Decimal, fractions.Fraction))


def _bool_becomes_number(annotation: Any) -> bool:
    """Whether lax validation would turn a bool into a number here (an int or float field that takes no bool);
    a bool for any other type (str, a Literal of names) is pydantic's to refuse, with its own message."""
    return _any_member(annotation, _is_number_type) and not _any_member(annotation, _is_bool_type)


def _models_in(annotation: Any) -> list[type[pydantic.BaseModel]]:
    """The pydantic models a field of this type may hold (`Section`, `Section | None`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _misplaced_bools(value: Any, annotation: Any, path: str = "") -> Iterator[str]:
    """Paths (relative to `value`; "" is the value itself) of the bools in a raw (YAML) value that its type would
    coerce to a number; nested sections included."""
    if isinstance(value, bool):
        if _bool_becomes_number(annotation):
            yield path
    elif isinstance(value, dict):
        models = _models_in(annotation)
        if len(models) == 1:  # a section: check its keys against its fields (unknown keys are pydantic's to report)
            fields = models[0].model_fields
            for key, item in value.items():
                if key in fields:
                    yield from _misplaced_bools(item, fields[key].annotation, _join(path, key))
        elif typing.get_origin(annotation) is dict:
            value_type = (*typing.get_args(annotation)[1:2], Any)[0]
            for key, item in value.items():
                yield from _misplaced_bools(item, value_type, _join(path, key))
    elif isinstance(value, list) and typing.get_origin(annotation) in (list, tuple, set, frozenset):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        for i, item in enumerate(value):
            yield from _misplaced_bools(item, args[min(i, len(args) - 1)] if args else Any, f"{path}[{i}]")


def _non_finite(value: Any, path: str = "") -> Iterator[str]:
    """Paths (relative to `value`) of the inf/nan floats in a validated value (nested models, lists and dicts included)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path
    elif isinstance(value, pydantic.BaseModel):
        for name in type(value).model_fields:
            yield from _non_finite(getattr(value, name), _join(path, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, _join(path, key))
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(value):
            yield from _non_finite(item, f"{path}[{i}]")


def _at(paths: list[str], problem: str) -> str:
    """`problem`, prefixed by the nested keys it is about (none when it is about the field itself)."""
    nested = [p for p in paths if p]
    return f"{', '.join(nested)}: {problem}" if nested else problem


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where load_config built a config from: the preset name, file or URI given (None: the class's defaults), the
    `base` chain below it, the `key=value` overrides, the config files and URIs read (the chain's files: a preset
    is part of the package, no file) and, for a section of a loaded config, which one ("RlFilterConfig.judge")."""

    preset: str | None
    bases: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    section: str = ""

    def to_json(self) -> dict[str, Any]:
        """As a manifest's lineage records it (`meta.lineage.preset`; klear.common.lineage)."""
        entry: dict[str, Any] = {"preset": self.preset, "bases": list(self.bases), "overrides": list(self.overrides)}
        if self.section:
            entry["section"] = self.section
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> Provenance:
        """Back from to_json (the files read stay with the process that read them)."""
        preset = entry.get("preset")
        return cls(None if preset is None else str(preset), tuple(map(str, entry.get("bases") or ())),
                   tuple(map(str, entry.get("overrides") or ())), (), str(entry.get("section") or ""))


class StageConfig(pydantic.BaseModel):
    """Base of every stage config: unknown keys are errors, values are type-checked, numbers are strict
    (no bool for a number, no inf/nan) in every field of every subclass and in its nested sections.

    A config load_config built carries its `provenance`; it is no part of the config's values (equality, dumps)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    # Package holding this config's presets/ folder (paper.yaml, tiny.yaml); set by each stage.
    preset_package: ClassVar[str] = ""

    _provenance: Provenance | None = pydantic.PrivateAttr(default=None)

    @property
    def provenance(self) -> Provenance | None:
        """Where load_config built this config from; None for one it did not build (made in code, or copied with
        other values)."""
        return self._provenance

    def __eq__(self, other: object) -> bool:
        # The values only: two loads of equal settings are equal configs, whichever files they came from.
        if not isinstance(other, StageConfig):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        if copied != self:  # other values than the load built: its provenance would misstate them
            copied._provenance = None
        return copied

    @pydantic.field_validator("*", mode="wrap")
    @classmethod
    def _strict_numbers(cls, value: Any, handler: pydantic.ValidatorFunctionWrapHandler,
                        info: pydantic.ValidationInfo) -> Any:
        # Bools are checked on the raw value (validation turns true into 1), finiteness on the validated one
        # (which catches "inf" text too). allow_inf_nan covers this model's own float fields; the walk covers
        # sections that are plain pydantic models with their own (lax) settings.
        bools = list(_misplaced_bools(value, cls.model_fields[info.field_name or ""].annotation))
        if bools:
            raise ValueError(_at(bools, "a boolean where a number is expected"))
        validated = handler(value)
        infinite = list(_non_finite(validated))
        if infinite:
            raise ValueError(_at(infinite, "not a finite number"))
        return validated

    def dump_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


C = TypeVar("C", bound=StageConfig)


# --------------------------------------------------------------------------- reading YAML


class _NoAliasLoader(yaml.SafeLoader):
    """The safe loader, refusing anchors (&a) and aliases (*a): each alias re-uses a whole subtree, so a few
    hundred bytes of nested aliases ("billion laughs") stand for gigabytes once validated or printed."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "YAML anchors and aliases (&name, *name) are not allowed in configs", event.start_mark
            )
        return super().compose_node(parent, index)


def _load_yaml(text: str, name: str) -> Any:
    """The YAML in `text`; an error names `name` (a file, an override) and the line and column of the problem."""
    loader = None
    try:
        loader = _NoAliasLoader(text)  # its reader already refuses unprintable characters
        loader.name = name  # what its marks (line, column) name, instead of "<unicode string>"
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        problem = _yaml_problem(exc)
    except yaml.YAMLError as exc:
        problem = str(exc)
    finally:
        if loader is not None:
            loader.dispose()
    raise ConfigError(f"{name}: invalid YAML: {clip(problem, 2 * QUOTE_LIMIT)}")


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """One line for a YAML error: the problem at its line and column, then what the parser was in (pyyaml's own
    text spreads over lines and quotes the source)."""
    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "an unknown place"

    text = f"{exc.problem or 'error'} at {at(exc.problem_mark)}"
    return f"{text} ({exc.context} at {at(exc.context_mark)})" if exc.context else text


def preset_names(cls: type[StageConfig]) -> list[str]:
    """The presets shipped with a stage config (its package's presets/*.yaml)."""
    presets = resources.files(cls.preset_package) / "presets"
    return sorted(p.name.removesuffix(".yaml") for p in presets.iterdir() if p.name.endswith(".yaml"))


def _preset_text(cls: type[StageConfig], name: str) -> tuple[str, str]:
    package = cls.preset_package
    presets = resources.files(package) / "presets"
    available = preset_names(cls)
    if name not in available:
        # A name without "/" or a .yaml suffix is a preset's; say how to read a file of that name instead.
        hint = f"; to read the file {clip(name)}, give it as ./{clip(name)}" if Path(name).is_file() else ""
        raise ConfigError(f"unknown preset {clip(repr(name))} for {cls.__name__}; presets: {', '.join(available)}"
                          + hint)
    return (presets / f"{name}.yaml").read_text(), f"preset {name!r} ({package}/presets/{name}.yaml)"


class _BaseLoopError(ConfigError):
    """A chain of `base` configs that comes back to one of its members, or is longer than any that does not."""


def _is_uri(source: str) -> bool:
    return "://" in source


def _is_file(source: str) -> bool:
    return _is_uri(source) or source.endswith((".yaml", ".yml")) or "/" in source


def _local_path(source: str) -> Path | None:
    """The local file a config file or URI names (a path, file://...); None for s3://."""
    if not _is_uri(source):
        return Path(source)
    location = storage.Uri.parse(source)
    return None if location.is_s3 else Path(location.path)


def _file_text(source: str) -> str:
    """The text of a config file or storage URI (s3://, file://); every error names it."""
    try:
        local = _local_path(source)
        # Read no more than a config can be: `--config model.safetensors` must not load the weights first.
        size = local.stat().st_size if local is not None and local.is_file() else 0
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {clip(source)} has {size} bytes, more than a config's {MAX_CONFIG_BYTES}: "
                              "not a YAML config")
        raw = local.read_bytes() if local is not None else storage.read_bytes(source)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {clip(source)}") from None
    except (storage.StorageError, OSError) as exc:
        raise ConfigError(f"config file {clip(source)} cannot be read: {clip(str(exc))}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {clip(source)} is not UTF-8 text (byte {exc.start}): not a YAML config") \
            from None


def _mapping(text: str, origin: str) -> dict[str, Any]:
    """The YAML mapping of a config's text; an empty text is one with no keys."""
    data = _load_yaml(text, origin)
    if data is None:
        return {}
    if not isinstance(data, dict):  # `[]` or `false` is no config, not an empty one
        raise ConfigError(f"{origin}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def _read_one(cls: type[StageConfig] | None, source: str) -> tuple[dict[str, Any], str]:
    """One YAML mapping, `base` key included: a preset name, a local YAML file or a storage URI (s3://, file://).
    Without `cls`, a preset is not read: it stands for itself ({})."""
    if _is_file(source):
        origin = source if _is_uri(source) else str(Path(source))
        return _mapping(_file_text(source), origin), origin
    if cls is None:
        return {}, f"preset {source!r}"
    text, origin = _preset_text(cls, source)
    return _mapping(text, origin), origin


def _base_source(base: str, source: str) -> str:
    """Where `base` (named in the config read from `source`) is: a preset name as is; a relative file path is
    relative to the file that names it (a preset's base is a preset or an absolute location)."""
    if not _is_file(base) or _is_uri(base) or Path(base).is_absolute() or not _is_file(source):
        return base
    local = _local_path(source)
    if local is None:
        parent = source.rstrip("/").rsplit("/", 1)[0]
        return f"{parent}/{base}"
    return str(local.parent / base)  # beside a file:// config: a path, so `./x.yaml` does not grow a URI


def _identity(source: str) -> str:
    """One name per config source, for finding a chain of bases that loops: a local file by its resolved path,
    however it is spelled (relative, absolute, file://)."""
    if not _is_file(source):
        return f"preset {source!r}"
    try:
        local = _local_path(source)
    except storage.StorageError:
        return source  # reading it will say what is wrong with the URI
    return source if local is None else str(local.resolve())


def _section(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The config model a field holds as a section (`Section` or `Section | None`), not in a container."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _section(members[0]) if len(members) == 1 else None
    return None


def config_keys(model: type[pydantic.BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    """Every key a `--set KEY=VALUE` override can name, sections flattened (`reward.budget_s`), with the field's
    one-line description: what `--help-keys` prints and the pipelines' override parameters list, so neither drifts
    from the config classes."""
    keys: list[tuple[str, str]] = []
    for name, field in model.model_fields.items():
        section = _section(field.annotation)
        if section is not None:
            keys += config_keys(section, f"{prefix}{name}.")
        else:
            keys.append((f"{prefix}{name}", " ".join((field.description or "").split())))
    return keys


def keys_text(model: type[pydantic.BaseModel], separator: str = "\n") -> str:
    """`config_keys` as text: "key: description", one per `separator`."""
    return separator.join(f"{key}: {text}" if text else key for key, text in config_keys(model))


def document_overrides(doc: str, keys: dict[str, str]) -> str:
    """`doc` (a Google-style docstring) with "Keys: ..." added to the Args entry of each parameter named in `keys`:
    what a pipeline's run form then shows under its override parameters. A parameter without an entry raises."""
    lines = doc.split("\n")
    for param, listing in keys.items():
        entry = next((i for i, line in enumerate(lines) if line.startswith(f"        {param}: ")), None)
        if entry is None:
            raise ValueError(f"the docstring has no Args entry for {param!r}")
        end = entry + 1
        while end < len(lines) and lines[end].startswith(" " * 12):
            end += 1
        lines.insert(end, f"            Keys: {listing}")
    return "\n".join(lines)


def _field_section(model: type[pydantic.BaseModel] | None, key: str) -> type[pydantic.BaseModel] | None:
    field = model.model_fields.get(key) if model is not None else None
    return _section(field.annotation) if field is not None else None


def merge(base: dict[str, Any], changes: dict[str, Any], model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """`base` with `changes` on top, for a config of type `model`: a section (a field holding one config model)
    merges key by key; any other value replaces the base's whole, a mapping of named items (evaluate's
    benchmarks) or a list too, so a config can drop an item its base has."""
    merged = dict(base)
    for key, value in changes.items():
        below = merged.get(key)
        section = _field_section(model, key)
        if section is not None and isinstance(below, dict) and isinstance(value, dict):
            merged[key] = merge(below, value, section)
        else:
            merged[key] = value
    return merged


# One config of a `base` chain as read: its origin (as _read_one names it) and its keys, `base` left out.
Level = tuple[str, dict[str, Any]]


def _read_source(cls: type[StageConfig] | None, source: str, chain: tuple[str, ...] = (),
                 names: list[str] | None = None, levels: list[Level] | None = None) -> tuple[dict[str, Any], str]:
    """The config of `source` (a preset name, a YAML file or a storage URI) with its `base` chain merged in: a
    config may name a preset of the same stage, or a file or URI, as `base` and give only its differences.
    `names` collects the chain's sources, `source` first (preset names as named, files and URIs as read);
    `levels` collects each config's own keys, the deepest base first (the order they merge in: config_origins).
    Without `cls` the chain stops at its first preset, unread (config_files)."""
    if names is not None:
        names.append(source)
    identity = _identity(source)
    if identity in chain:
        loop = " -> ".join((*chain[chain.index(identity):], identity))
        raise _BaseLoopError(f"config bases form a loop: {clip(loop, 4 * QUOTE_LIMIT)}")
    if len(chain) >= MAX_BASES:
        raise _BaseLoopError(f"config bases nest deeper than {MAX_BASES}: "
                             f"{clip(' -> '.join((*chain, identity)), 4 * QUOTE_LIMIT)}")
    data, origin = _read_one(cls, source)
    if BASE_KEY not in data:
        _collect(levels, origin, data)
        return data, origin
    base = data.pop(BASE_KEY)
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{origin}: {BASE_KEY}: expected a preset name, file or URI, got {clip(repr(base))}")
    try:
        below, below_origin = _read_source(cls, _base_source(base.strip(), source), (*chain, identity), names,
                                           levels)
    except _BaseLoopError:
        raise  # the chain already names every config in it
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {BASE_KEY} {clip(repr(base))}: {exc}") from None
    _collect(levels, origin, data)
    return merge(below, data, cls) if cls is not None else {}, f"{origin} on {below_origin}"


def _collect(levels: list[Level] | None, origin: str, data: dict[str, Any]) -> None:
    # A copy: merging shares nested values with the merged config, which overrides then change in place.
    if levels is not None:
        levels.append((origin, copy.deepcopy(data)))


def config_files(source: str) -> list[str]:
    """The files and URIs a config source reads (a preset name, YAML file or URI): itself and its `base` chain,
    as read, down to the first preset name. For the cache key of a task that loads it (the digest step): a preset
    is read from the installed package, and the code reading it is no part of that key either."""
    if not source:
        return []
    names: list[str] = []
    _read_source(None, source, names=names)
    return [name for name in names if _is_file(name)]


def _parse_override(override: str) -> tuple[list[str], Any]:
    """The dotted key of a `key.sub=value` override, split, and its value (YAML; nothing after `=` is "")."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {clip(repr(override))} is not of the form key=value")
    return key.strip().split("."), _load_yaml(raw, f"override {clip(repr(override))}") if raw.strip() else ""


def _apply_override(data: dict[str, Any], override: str) -> None:
    parts, value = _parse_override(override)
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {clip(repr(override))}: {clip(repr(part))} is not a section")
        node = child
    node[parts[-1]] = value


def load_config(cls: type[C], source: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> C:
    """Build a stage config from a preset name, YAML file or URI (defaults if None), its bases, plus overrides.

    The config carries where it came from (`config.provenance`, and each of its config sections theirs): the
    presets and overrides its manifests' lineage records, and the config files read, which no output of the run may
    replace. Nothing else is kept: loading changes no state of this process."""
    return _load(cls, source, overrides)


def _load(cls: type[C], source: str | None, overrides: list[str] | tuple[str, ...],
          levels: list[Level] | None = None) -> C:
    """load_config, collecting the configs of the `base` chain into `levels` (config_origins)."""
    names: list[str] = []
    data, origin = _read_source(cls, source, names=names, levels=levels) if source else ({}, "defaults")
    for override in overrides:
        _apply_override(data, override)
    try:
        config = cls.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = clip(".".join(str(p) for p in err["loc"]) or "(root)")
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key {field!r}")
            else:
                # Our validators' ValueErrors read better without pydantic's "Value error, " prefix.
                message = str(err.get("ctx", {}).get("error", err["msg"])) if err["type"] == "value_error" else err["msg"]
                problems.append(f"{field}: {clip(message)} (got {clip(repr(err.get('input')))})")
        raise ConfigError(f"{cls.__name__} from {origin}: " + "; ".join(problems)) from None
    files = tuple(_config_file(name) for name in names if _is_file(name))
    _attach(config, Provenance(names[0] if names else None, tuple(names[1:]), tuple(overrides), files))
    return config


def _config_file(source: str) -> str:
    """A config file or URI as read (`_read_one`'s origin): a path in its plain spelling."""
    return source if _is_uri(source) else str(Path(source))


def with_provenance(config: C, provenance: Provenance) -> C:
    """`config` (built from values another process loaded: a section handed over as JSON) saying where that process
    loaded it from, as its manifest's lineage then records."""
    _attach(config, provenance)
    return config


def _attach(config: StageConfig, provenance: Provenance) -> None:
    """Give `config` its provenance, and each of its sections that is a stage config theirs: a stage may run with
    another stage's section (judge with rl-filter's `judge`). The sections are the config's own objects (pydantic
    copies a default), so no other config is changed."""
    config._provenance = provenance
    for name, value in config:
        if isinstance(value, StageConfig):
            value._provenance = dataclasses.replace(provenance, section=f"{type(config).__name__}.{name}")


# --------------------------------------------------------------------------- where each value came from

# Where the keys of a config came from, shaped like its raw mapping: a key's origin, or for a section the
# origins of its keys (a key missing: nothing set it, the class's default).
Origins = dict[str, "str | Origins"]


def _stamp(value: Any, section: type[pydantic.BaseModel] | None, origin: str) -> str | Origins:
    """The origins of a value one config sets whole: each key it gives of a section (nested ones too), or the
    value itself."""
    if section is None or not isinstance(value, dict):
        return origin
    return {key: _stamp(item, _field_section(section, key), origin) for key, item in value.items()}


def _mark(origins: Origins, below: dict[str, Any], changes: dict[str, Any], model: type[pydantic.BaseModel],
          origin: str) -> Origins:
    """`origins` of the config `below` once `changes` (from `origin`) merge on top of it: as `merge` does, a
    section merges key by key and any other value (or a section the base does not have) is replaced whole."""
    marked = dict(origins)
    for key, value in changes.items():
        section = _field_section(model, key)
        under, known = below.get(key), origins.get(key)
        if section is not None and isinstance(under, dict) and isinstance(value, dict):
            marked[key] = _mark(known if isinstance(known, dict) else {}, under, value, section, origin)
        else:
            marked[key] = _stamp(value, section, origin)
    return marked


def _mark_override(origins: Origins, model: type[pydantic.BaseModel] | None, parts: list[str], value: Any,
                   origin: str) -> None:
    """Record in `origins` the override at the key `parts`: as `_apply_override` sets it. One reaching inside a
    value that is no section (a benchmark's k) changes that value, which came from its origin and the override."""
    key, section, known = parts[0], _field_section(model, parts[0]), origins.get(parts[0])
    if len(parts) == 1:
        origins[key] = _stamp(value, section, origin)
    elif section is None:
        origins[key] = f"{known if isinstance(known, str) else DEFAULT_ORIGIN} + {origin}"
    else:
        child = known if isinstance(known, dict) else {}
        origins[key] = child
        _mark_override(child, section, parts[1:], value, origin)


def _leaves(config: pydantic.BaseModel, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The leaf keys of a config as dotted paths with their values, in field-declaration order: a section's
    keys are leaves of their own, any other value (a list, a mapping of named items) is one."""
    for name, field in type(config).model_fields.items():
        value = getattr(config, name)
        if _section(field.annotation) is not None and isinstance(value, pydantic.BaseModel):
            yield from _leaves(value, _join(prefix, name))
        else:
            yield _join(prefix, name), value


def _origin_at(origins: Origins, path: str) -> str:
    node: str | Origins = origins
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    return node if isinstance(node, str) else DEFAULT_ORIGIN


def config_origins(cls: type[C], source: str | None = None,
                   overrides: list[str] | tuple[str, ...] = ()) -> tuple[C, dict[str, str]]:
    """load_config's config (and errors), with where each of its leaf keys (dotted: "sampling.max_tokens") came
    from: "default" (the class's), the preset, file or URI of the `base` chain that set it last (as config errors
    name it: "preset 'paper' (klear.sft/presets/paper.yaml)", a file's path), or "override KEY=VALUE"."""
    levels: list[Level] = []
    config = _load(cls, source, overrides, levels)
    merged: dict[str, Any] = {}
    origins: Origins = {}
    for origin, data in levels:  # replayed as _read_source merged them, the deepest base first
        origins = _mark(origins, merged, data, cls, origin)
        merged = merge(merged, data, cls)
    for override in overrides:
        parts, value = _parse_override(override)
        _mark_override(origins, cls, parts, value, f"override {override}")
    return config, {path: _origin_at(origins, path) for path, _ in _leaves(config)}


def origins_lines(config: StageConfig, origins: Mapping[str, str], limit: int = QUOTE_LIMIT) -> list[str]:
    """`key = value  (origin)` per leaf key of `config`, in field-declaration order, values as JSON clipped to
    `limit` characters: config_origins' answer, for a person."""
    return [f"{path} = {clip(json.dumps(_plain(value), ensure_ascii=False), limit)}  "
            f"({clip(origins.get(path, DEFAULT_ORIGIN), limit)})"
            for path, value in _leaves(config)]


_ANY: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(Any)


def _plain(value: Any) -> Any:
    """A leaf value as JSON holds it (the models of a mapping of named items, a date)."""
    return _ANY.dump_python(value, mode="json")


# --------------------------------------------------------------------------- where a config came from


def describe_preset(preset: Mapping[str, Any] | None) -> str:
    """One line: `tiny (on paper) + n=4`; "" for none."""
    if not preset:
        return ""
    text = str(preset.get("preset") or "defaults")
    if preset.get("bases"):
        text += " (on " + " on ".join(str(b) for b in preset["bases"]) + ")"
    if preset.get("overrides"):
        text += " + " + " ".join(str(o) for o in preset["overrides"])
    if preset.get("section"):
        text += f", section {preset['section']}"
    return text
