"""Typed records to plain JSON values and back: the one serialiser of kernelrl's dataclasses.

Configs, results and the records a result carries are dataclasses with typed fields. This module
turns any of them into plain values (dicts, lists, strings, numbers, booleans, None) and builds
them back from plain values by following the fields' type hints:

- nested dataclasses from dicts, enums from their values, `Path` from strings, tuples from
  lists (fixed-length or `tuple[X, ...]`), `list[X]` and `dict[str, X]` element by element,
  `X | None` from a value or None, floats from integers;
- `from_plain(cls, value, strict=True)` refuses unknown keys (a config with a typo) and
  `strict=False` ignores them (a result stored by an older version of kernelrl, whose records
  held fields that are gone);
- a value of the wrong type, or one the dataclass's own `__post_init__` refuses, raises
  `PlainError` naming the dotted key.

Guarantees: `from_plain(type(x), to_plain(x)) == x` for every dataclass made of the types above
(a round trip loses nothing); nothing is evaluated or imported from the data: only the classes
named by the type hints are built.

Does not know what any field means: the dataclasses do.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["PlainError", "field_paths", "from_plain", "to_plain"]


class PlainError(ValueError):
    """Plain values do not fit a record's types; the message names the dotted key."""


# The result is `Any`, not `kernelrl.jsontypes.JSONValue`: it is exactly JSON-shaped, but callers
# outside this module index the tables of a known record directly (`config_fingerprint` pops keys of
# a nested table), which a JSONValue would make them narrow first.
def to_plain(value: object) -> Any:
    """A dataclass (or list, dict, enum, path...) as plain JSON/TOML-able values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [to_plain(x) for x in value]
    if isinstance(value, Mapping):
        return {str(k): to_plain(x) for k, x in value.items()}
    return value


def from_plain(cls: type[T], values: object, *, strict: bool = True, where: str = "") -> T:
    """A `cls` dataclass from plain values (see the module docstring)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if isinstance(values, cls):
        return values
    if not isinstance(values, Mapping):
        raise PlainError(f"{where or cls.__name__}: expected a table, got {type(values).__name__}")
    hints, fields = _fields(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown and strict:
        names = ", ".join(_dotted(where, k) for k in unknown)
        raise PlainError(f"unknown setting(s) {names}; {where or cls.__name__} takes {', '.join(sorted(fields))}")
    kwargs = {name: _coerce(hints[name], value, _dotted(where, name), strict)
              for name, value in values.items() if name in fields}
    try:
        return cls(**kwargs)
    except PlainError:
        raise
    except (TypeError, ValueError) as e:
        raise PlainError(f"{where or cls.__name__}: {e}") from e


def field_paths(cls: type, prefix: str = "") -> dict[str, object]:
    """Every settable dotted key of a dataclass, nested dataclasses included, with its type (a type
    hint as `typing.get_type_hints` gives it: a class, a union, a generic alias...)."""
    out: dict[str, object] = {}
    hints, fields = _fields(cls)
    for name in fields:
        path = _dotted(prefix, name)
        inner = dataclass_in(hints[name])
        if inner is not None:
            out.update(field_paths(inner, path))
        else:
            out[path] = hints[name]
    return out


def field_defaults(cls: type, prefix: str = "") -> dict[str, object]:
    """The default of every dotted key `field_paths` lists that has one; required fields are left
    out. A nested config's keys come from its class's defaults when the field's default is that
    class built bare; any other factory of a nested config is not called (building one may
    validate, and validating may import heavy libraries), and its keys are left out."""
    out: dict[str, object] = {}
    hints, fields = _fields(cls)
    for name, f in fields.items():
        path = _dotted(prefix, name)
        inner = dataclass_in(hints[name])
        if inner is not None:
            if f.default_factory is inner:  # type: ignore[comparison-overlap]  # a class is a factory
                out.update(field_defaults(inner, path))
        elif f.default is not dataclasses.MISSING:
            out[path] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[path] = f.default_factory()
    return out


def dataclass_in(tp: object) -> type | None:
    """The dataclass a field's type holds (`X` or `X | None`), if any."""
    for option in _options(tp):
        if isinstance(option, type) and dataclasses.is_dataclass(option):
            return option
    return None


# ---------------------------------------------------------------------------------------------


@functools.cache
def _fields(cls: type) -> tuple[dict[str, object], dict[str, dataclasses.Field[object]]]:
    # Type hints are resolved once per class: results are built from plain values in hot paths.
    hints = typing.get_type_hints(cls)
    return hints, {f.name: f for f in dataclasses.fields(cls) if f.init}


def _dotted(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _options(tp: object) -> tuple[object, ...]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _coerce(tp: object, value: object, where: str, strict: bool) -> object:
    options = _options(tp)
    if value is None:
        if type(None) in options or tp is Any:
            return None
        raise PlainError(f"{where}: a value is required")
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _coerce_one(option, value, where, strict)
        except PlainError as e:
            errors.append(str(e))
    raise PlainError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {tp}")


def _coerce_one(tp: object, value: object, where: str, strict: bool) -> object:
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_plain(tp, value, strict=strict, where=where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            raise PlainError(f"{where}: {value!r} is not one of {', '.join(str(m.value) for m in tp)}") from None
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise PlainError(f"{where}: expected a path, got {value!r}")
    if tp is Any or tp is object:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise PlainError(f"{where}: expected true or false, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise PlainError(f"{where}: expected a number, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise PlainError(f"{where}: expected an integer, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise PlainError(f"{where}: expected a string, got {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise PlainError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{where}[{i}]", strict) for i, v in enumerate(items))
        if len(args) != len(items):
            raise PlainError(f"{where}: expected {len(args)} values, got {len(items)}")
        return tuple(_coerce(a, v, f"{where}[{i}]", strict) for i, (a, v) in enumerate(zip(args, items)))
    if origin is list or tp is list:
        (arg,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise PlainError(f"{where}: expected a list, got {value!r}")
        return [_coerce(arg, v, f"{where}[{i}]", strict) for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise PlainError(f"{where}: expected a table, got {value!r}")
        if len(args) == 2:
            return {k: _coerce(args[1], v, f"{where}.{k}", strict) for k, v in value.items()}
        return dict(value)
    raise PlainError(f"{where}: values of type {tp} cannot be read from plain data")
