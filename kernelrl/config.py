"""Run configurations: named TOML files loaded into the typed configs the components own.

Every component owns a keyword-only dataclass config, validated in its `__post_init__`
(`SandboxConfig`, `TimingConfig`, `EvalConfig`, `SearchConfig`, the trainer's configs...), and
configs nest: a search config holds an eval config, which holds the sandbox and timing configs.
This module is the one place that turns text into those objects:

- `load_toml(name_or_path)` reads `kernelrl/configs/NAME.toml` or a file (`folder=` names another
  folder of named configs, e.g. `kernelrl/configs/train/`);
- `build(cls, values)` builds a config from nested dicts, following the dataclass fields' types:
  nested dataclasses from tables, enums from their values, `Path` from strings, tuples from
  lists, `X | None` from a value or nothing;
- `with_overrides(values, {"eval.timing.max_timing_s": 6.0, ...})` sets dotted keys (command
  line flags), creating tables as needed; a value of None means "not given" and is skipped;
- `load_config(cls, name_or_path, overrides)` does all three.

Guarantees: an unknown key, a value of the wrong type or a value the component's own validation
refuses raises `ConfigError` naming the dotted key, so a typo in a run config is an error, never
a silently ignored setting.

Does not define any setting: the components do.
"""

from __future__ import annotations

import dataclasses
import enum
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

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


def load_toml(name_or_path: str | Path, folder: Path = CONFIG_DIR) -> dict[str, Any]:
    path = config_path(name_or_path, folder)
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e


def with_overrides(values: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `values` with each dotted key of `overrides` set (None values skipped)."""
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
        node[key] = value
    return out


def load_config(cls: type[T], name_or_path: str | Path | None = None,
                overrides: Mapping[str, Any] | None = None, folder: Path = CONFIG_DIR) -> T:
    values = load_toml(name_or_path, folder) if name_or_path is not None else {}
    return build(cls, with_overrides(values, overrides or {}))


def build(cls: type[T], values: Mapping[str, Any], *, where: str = "") -> T:
    """A `cls` dataclass from nested dicts (see the module docstring)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where or cls.__name__}: expected a table, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        names = ", ".join(_dotted(where, k) for k in unknown)
        raise ConfigError(f"unknown setting(s) {names}; {where or cls.__name__} takes {', '.join(sorted(fields))}")
    kwargs = {name: _coerce(hints[name], value, _dotted(where, name)) for name, value in values.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def field_paths(cls: type, prefix: str = "") -> set[str]:
    """Every settable dotted key of a config class, nested configs included."""
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        path = _dotted(prefix, f.name)
        out.add(path)
        inner = _dataclass_in(hints[f.name])
        if inner is not None:
            out |= field_paths(inner, path)
    return out


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain TOML/JSON-able values (enums as values, paths as strings)."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, enum.Enum):
            return v.value
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return v

    return plain(config)


# ---------------------------------------------------------------------------------------------


def _dotted(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _deep_copy(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in values.items()}


def _dataclass_in(tp: Any) -> type | None:
    for option in _options(tp):
        if dataclasses.is_dataclass(option):
            return option
    return None


def _options(tp: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    options = _options(tp)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(f"{where}: a value is required")
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _coerce_one(option, value, where)
        except ConfigError as e:
            errors.append(str(e))
    raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {tp}")


def _coerce_one(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value) and isinstance(value, tp):
            return value
        return build(tp, value, where=where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(str(m.value) for m in tp)}") from None
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(f"{where}: expected a path, got {value!r}")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(items))
        if len(args) != len(items):
            raise ConfigError(f"{where}: expected {len(args)} values, got {len(items)}")
        return tuple(_coerce(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, items)))
    if origin in (list,):
        (arg,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(arg, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (dict,) or tp is dict:
        args = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        if len(args) == 2:
            return {k: _coerce(args[1], v, f"{where}.{k}") for k, v in value.items()}
        return dict(value)
    raise ConfigError(f"{where}: settings of type {tp} cannot be read from a run config")
