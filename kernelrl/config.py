"""Run configurations: named TOML files loaded into the typed configs the components own.

Every component owns a keyword-only dataclass config, validated in its `__post_init__`
(`SandboxConfig`, `TimingConfig`, `EvalConfig`, `SearchConfig`, the trainer's configs...), and
configs nest: a search config holds an eval config, which holds the sandbox and timing configs.
This module is the one place that turns text into those objects:

- `load_toml(name_or_path)` reads `kernelrl/configs/NAME.toml` or a file (`folder=` names another
  folder of named configs, e.g. `kernelrl/configs/train/`);
- `build(cls, values)` builds a config from nested dicts, following the dataclass fields' types
  (`kernelrl.plain.from_plain`, the serialiser results use too): nested dataclasses from
  tables, enums from their values, `Path` from strings, tuples from lists, `X | None` from a
  value or nothing;
- `with_overrides(values, {"eval.timing.max_timing_s": 6.0, ...})` sets dotted keys (command
  line flags), creating tables as needed; a value of None means "not given" and is skipped; a
  table given for a table (a `dict` setting such as `grpo.trl`) is merged into it key by key, so
  `--grpo.trl max_steps=4` changes one TRL argument and keeps the file's others;
- `load_config(cls, name_or_path, overrides)` does all three.

Guarantees: an unknown key, a value of the wrong type or a value the component's own validation
refuses raises `ConfigError` naming the dotted key, so a typo in a run config is an error, never
a silently ignored setting.

Does not define any setting: the components do.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kernelrl.plain import PlainError, from_plain, to_plain
from kernelrl.plain import field_paths as plain_field_paths

if TYPE_CHECKING:
    from kernelrl.jsontypes import JSONObject

CONFIG_DIR = Path(__file__).parent / "configs"

T = TypeVar("T")


class ConfigError(ValueError):
    """A run configuration is missing, malformed or invalid; the message names the key."""


def config_names(folder: Path = CONFIG_DIR) -> list[str]:
    """The shipped run configs (`kernelrl/configs/*.toml`, or `folder`'s), by name."""
    return sorted(p.stem for p in Path(folder).glob("*.toml"))


def config_path(name_or_path: str | Path, folder: Path = CONFIG_DIR) -> Path:
    """A .toml file, or the named config in `folder` (the training configs live in `CONFIG_DIR / "train"`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    named = Path(folder) / f"{name_or_path}.toml"
    if named.is_file():
        return named
    raise ConfigError(f"no run config {str(name_or_path)!r} (a .toml file, or one of: "
                      f"{', '.join(config_names(folder))})")


def load_toml(name_or_path: str | Path, folder: Path = CONFIG_DIR) -> dict[str, object]:
    # `object`, not JSON: TOML also has dates and times, and `build` checks every value's type.
    path = config_path(name_or_path, folder)
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e


def with_overrides(values: Mapping[str, object], overrides: Mapping[str, object]) -> dict[str, object]:
    """A deep copy of `values` with each dotted key of `overrides` set (None values skipped; a
    table merged into the table it names)."""
    out = _deep_copy(values)
    for dotted, value in overrides.items():
        if value is None:
            continue
        *tables, key = dotted.split(".")
        node = out
        for name in tables:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{dotted}: {name} is a value, not a table")
            node = child
        existing = node.get(key)
        if isinstance(value, Mapping) and isinstance(existing, dict):
            node[key] = {**existing, **_deep_copy(value)}
        else:
            node[key] = value
    return out


def load_config(cls: type[T], name_or_path: str | Path | None = None,
                overrides: Mapping[str, object] | None = None, folder: Path = CONFIG_DIR) -> T:
    values = load_toml(name_or_path, folder) if name_or_path is not None else {}
    return build(cls, with_overrides(values, overrides or {}))


def build(cls: type[T], values: Mapping[str, object], *, where: str = "") -> T:
    """A `cls` dataclass from nested dicts (see the module docstring); unknown keys are errors."""
    try:
        return from_plain(cls, values, strict=True, where=where)
    except PlainError as e:
        raise ConfigError(str(e)) from e


def field_paths(cls: type, prefix: str = "") -> set[str]:
    """Every settable dotted key of a config class: nested configs and their fields."""
    leaves = set(plain_field_paths(cls, prefix))
    tables = {path.rsplit(".", i)[0] for path in leaves for i in range(1, path.count(".") + 1)}
    return leaves | tables


def to_dict(config: object) -> JSONObject:
    """A config as plain TOML/JSON-able values (enums as values, paths as strings)."""
    plain = to_plain(config)
    assert isinstance(plain, dict)
    return plain


def _deep_copy(values: Mapping[str, object]) -> dict[str, object]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in values.items()}
