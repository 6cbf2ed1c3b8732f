"""Command-line flags generated from config dataclasses: one table per config, no mapping by hand.

Every settable field of a command's config is a flag. Its name is the field's dotted path with
dashes (`--timing.min-rounds`, `--sandbox.memory-limit-gib`), or the short name a `FlagTable`
gives it (`--timeout` for `timeout_s`); its type, choices and help come from the field (the help
is the field's own comment, read by `kernelrl.cli.helps`; a table's `helps` adds what only the
command line needs, and covers fields whose config has no comment yet). A flag
left out on the command line is None and changes nothing: the named config file (`--config`),
then the flags given, then the config's own defaults, in that order
(`kernelrl.config.with_overrides`). The evaluator's flags are the same on every command that
judges (`EVAL_FLAGS`): `kernelrl eval --timeout 60`, `kernelrl optimize --timeout 60` and
`kernelrl serve --timeout 60` set the same field.

A flag's help ends with the field's default, read from the config (`with_default`); help texts
never state a literal default by hand (tests/test_cli_flags.py refuses one).

Value types: booleans are `--x` / `--no-x`; enums take their values; tuples and lists take
several values (or comma-separated ones); `dict[str, X]` takes `KEY=VALUE` pairs, repeated; a
field that may be None takes a value of its type (set None in a config file).

Guarantees: `flag_paths(table)` is exactly the config's field paths but those a table sets through
another flag's value (`inline`: a proposer's options, given with it) (tests/test_cli_flags.py
fails when a field has no flag or a flag no field); a value of the wrong type is refused by
argparse with the flag's name, and one the config refuses raises `ConfigError` naming the key,
which `user_words` puts in the flags' words ("SearchConfig: turns must be >= 1, got 0" -> "--turns
must be at least 1, got 0"): no message a command prints names a config class.

Does not decide defaults: the configs do.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import enum
import re
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kernelrl.cli.helps import field_docs
from kernelrl.config import ConfigError, load_toml, with_overrides
from kernelrl.plain import field_defaults, field_paths

# The argparse dest of a generated flag: its dotted path, made a valid attribute name.
_DEST_PREFIX = "cfg__"
# The `--config` file named on a command line that asks for help: its values are the defaults the
# help shows (`kernelrl optimize --config quick -h` shows quick's budget, not the config class's).
_HELP_CONFIG: contextvars.ContextVar[Mapping[str, object] | None] = contextvars.ContextVar("help_config", default=None)


@contextlib.contextmanager
def config_for_help(argv: Sequence[str]) -> Iterator[None]:
    """While parsers are built for `argv`: when it asks for help and names `--config FILE`, that
    file's values are the defaults help shows (a file that cannot be read changes nothing: the
    command itself says why)."""
    values: Mapping[str, object] | None = None
    args = list(argv)
    if ("-h" in args or "--help" in args) and "--config" in args[:-1]:
        try:
            values = load_toml(args[args.index("--config") + 1])
        except (ConfigError, OSError, ValueError):
            values = None
    token = _HELP_CONFIG.set(values)
    try:
        yield
    finally:
        _HELP_CONFIG.reset(token)


def help_config(table: str | None = None) -> Mapping[str, object] | None:
    """The help's `--config` values (see `config_for_help`), or one table of them."""
    values = _HELP_CONFIG.get()
    if values is None or table is None:
        return values
    inner = values.get(table)
    return inner if isinstance(inner, Mapping) else None


@dataclass(frozen=True, kw_only=True)
class FlagTable:
    """How one config class is exposed on the command line."""

    config: type  # the config dataclass
    prefix: str = ""  # where it sits in the command's config ("eval." for an EvalConfig inside a SearchConfig)
    names: Mapping[str, str] = field(default_factory=dict)  # field path -> short flag name
    helps: Mapping[str, str] = field(default_factory=dict)  # field path -> help text
    skip: frozenset[str] = frozenset()  # paths set by another table (a nested config with its own)
    # field path -> the flag whose value also sets it, with no flag of its own: a proposer's options,
    # given with it (`--proposer "SPEC key=value ..."`, `kernelrl.proposers.spec`)
    inline: Mapping[str, str] = field(default_factory=dict)

    def paths(self) -> dict[str, object]:
        """Field path -> type hint, for every field this table exposes as a flag of its own."""
        return {p: t for p, t in field_paths(self.config).items()
                if not any(p == s or p.startswith(s + ".") for s in self.skip) and p not in self.inline}

    def flag_name(self, path: str) -> str:
        return self.names.get(path) or "--" + path.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, *tables: FlagTable, hidden: Sequence[str] = (),
              config_values: Mapping[str, object] | None = None) -> None:
    """Add every field of every table as a flag (see the module docstring). Flags under a `hidden`
    prefix are accepted but left out of the help (another training stage's settings);
    `config_values` (the `--config` file's table, when one was named before `--help`) are the
    defaults the help shows, where they set a field."""
    group = parser.add_argument_group("settings (override the --config file)")
    if config_values is None:
        config_values = help_config()
    for table in tables:
        docs, defaults = field_docs(table.config), field_defaults(table.config)
        for path, tp in table.paths().items():
            # a table's help is argparse text already; a field's comment is plain text ("%" kept)
            text = table.helps.get(path) or docs.get(path, "").replace("%", "%%")
            full = table.prefix + path
            shown = _configured(config_values, full, defaults.get(path))
            help_text = (argparse.SUPPRESS if any(full == h or full.startswith(h + ".") for h in hidden)
                         else flag_words(with_default(text, shown)))
            _add(group, table.flag_name(path), _dest(full), tp, help_text, path=path)


def _configured(values: Mapping[str, object] | None, path: str, default: object) -> object:
    """The value the `--config` file gives the dotted `path`, else the config's own default."""
    node: object = values
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def flag_words(help_text: str) -> str:
    """A field's comment in a flag's words: a setting left unset is what a comment calls None
    ("None: no limit" -> "unset: no limit"), which no one can type."""
    return re.sub(r"\bNone:", "unset:", help_text)


def shown_default(value: object) -> str | None:
    """A field's default as its help states it, or None where the flag shows none: no default
    (None), a boolean (the `--x`/`--no-x` pair), an empty or mapping value."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, (int, float, str)) for v in value):
        return " ".join(_shown(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Path)) or value == "":
        return None
    return _shown(value)


def _shown(value: object) -> str:
    return (f"{value:g}" if isinstance(value, float) else str(value)).replace("%", "%%")


def with_default(help_text: str, default: object) -> str:
    """`help_text` ending with the field's default, read from the config; a help that says its
    default in words (one computed at run time: "(default $KERNELRL_CACHE, ...)") keeps them."""
    shown = shown_default(default)
    if shown is None or "(default" in help_text:
        return help_text
    return f"{help_text} (default {shown})" if help_text else f"default {shown}"


def overrides(args: argparse.Namespace, *tables: FlagTable) -> dict[str, object]:
    """The dotted config keys the flags given set (flags left out are None and set nothing)."""
    out: dict[str, object] = {}
    for table in tables:
        for path in table.paths():
            value = getattr(args, _dest(table.prefix + path), None)
            if value is not None:
                out[table.prefix + path] = value
    return out


def given_values(args: argparse.Namespace, *tables: FlagTable,
                 legacy: Callable[[dict[str, object]], dict[str, object]] | None = None) -> dict[str, object]:
    """A command's settings: the run config `--config` names (if any), rewritten by `legacy` (an
    older file's keys moved where they live now), then the flags given on top. Raises
    `kernelrl.config.ConfigError` for a config file that cannot be read."""
    values = load_toml(args.config) if args.config else {}
    if legacy is not None:
        try:
            values = legacy(values)
        except ValueError as e:
            raise ConfigError(f"{args.config}: {e}") from e
    return with_overrides(values, overrides(args, *tables))


def flag_paths(*tables: FlagTable) -> dict[str, str]:
    """Flag name -> the dotted config key it sets, over all tables."""
    return {t.flag_name(p): t.prefix + p for t in tables for p in t.paths()}


def flag_for(setting: str, *tables: FlagTable) -> str:
    """The flag a dotted `KEY=VALUE` setting is given with (`grpo.trl.max_steps=4` -> `--grpo.trl
    max_steps=4`, `grpo.roc.enabled=false` -> `--no-grpo.roc.enabled`), for an error that names it."""
    key, _, value = setting.partition("=")
    flags = {path: name for name, path in flag_paths(*tables).items()}
    if key in flags:
        parsed = _toml_value(value)
        if isinstance(parsed, bool):
            return flags[key] if parsed else "--no-" + flags[key][2:]
        if isinstance(parsed, list):
            return f"{flags[key]} {' '.join(map(str, parsed))}"
        return f"{flags[key]} {value}"
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # a key inside a table setting
        table = ".".join(parts[:cut])
        if table in flags:
            return f"{flags[table]} {'.'.join(parts[cut:])}={value}"
    return f"--{key.replace('_', '-')} {value}"


# "SearchConfig: x" (the root config) or "eval.timing: x" (a nested one): where a config refusal happened
_WHERE = re.compile(r"^(?:[A-Z]\w*|[a-z_][\w.]*): (.*)$", re.S)
_COMPARE = ((r"must be >= ", "must be at least "), (r"must be > ", "must be above "),
            (r"must be <= ", "must be at most "), (r"must be < ", "must be below "))


def user_words(message: str, *tables: FlagTable) -> str:
    """A config's refusal in the words of the command line: the config's name dropped, each field
    named by its flag, comparisons in words."""
    scope = ""
    text = message
    while (m := _WHERE.match(text)) is not None:
        head = text.split(":", 1)[0]
        if not head[0].isupper():
            scope = head + "."
        text = m.group(1)
    names: dict[str, str] = {}
    subject = ""  # the refused setting itself, when the message's scope is a setting, not a table
    for table in tables:
        for path in table.paths():
            full = table.prefix + path
            if full.startswith(scope):
                names[full[len(scope):]] = table.flag_name(path)
            elif scope == full + ".":
                subject = table.flag_name(path)
            elif scope.startswith(full + "."):  # a key of a table setting: `--grpo.trl num_generation`
                subject = f"{table.flag_name(path)} {scope[len(full) + 1:-1]}"
    if subject:
        text = f"{subject}: {text}"
    for field_name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(field_name)}(?![\w-])", names[field_name], text)
    for old, new in _COMPARE:
        text = text.replace(old, new)
    return re.sub(r"\b[A-Z]\w*Config takes\b", "the settings are", text)


# ---------------------------------------------------------------------------------------------


def _dest(path: str) -> str:
    return _DEST_PREFIX + path.replace(".", "__")


def _inner(tp: object) -> object:
    """`X` of `X | None`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return options[0] if len(options) == 1 else str
    return tp


def _add(group: argparse._ArgumentGroup, name: str, dest: str, tp: object, help_text: str, *, path: str = "") -> None:
    tp = _inner(tp)
    origin = typing.get_origin(tp)
    kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": help_text or None}
    if tp is bool:
        group.add_argument(name, action=argparse.BooleanOptionalAction, **kwargs)
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        group.add_argument(name, choices=[m.value for m in tp], **kwargs)
    elif isinstance(tp, type) and tp in (int, float, str):
        group.add_argument(name, type=tp, metavar=_metavar(name, tp, path), **kwargs)
    elif tp is Path:
        group.add_argument(name, type=str, metavar="PATH", **kwargs)
    elif origin in (tuple, list):
        item = (typing.get_args(tp) or (str,))[0]
        group.add_argument(name, nargs="+", type=_list_item(item if item in (int, float) else str), metavar="VALUE",
                           action=_Extend, **kwargs)
    elif origin is dict or tp is dict:
        args = typing.get_args(tp)
        value_type = args[1] if len(args) == 2 else object  # only compared with int
        group.add_argument(name, type=_key_value(value_type), metavar="KEY=VALUE", action=_Merge, nargs="+", **kwargs)
    else:
        raise TypeError(f"{name}: no command-line form for settings of type {tp}")


def _metavar(name: str, tp: type, path: str = "") -> str:
    """The value's kind, its unit where the field's name carries one (`_s`: seconds, `_gib`, `_ms`)."""
    if tp is str:
        return "TEXT"
    field = path.rsplit(".", 1)[-1] or name.lstrip("-").replace("-", "_")
    if field.endswith("_s") or name == "--timeout":
        return "SECONDS"
    for suffix, unit in (("_ms", "MS"), ("_gib", "GIB"), ("_mib", "MIB"), ("_days", "DAYS")):
        if field.endswith(suffix):
            return unit
    return "N" if tp is int else "X"


def _list_item(kind: type[int | float | str]) -> Callable[[str], list[int | float | str]]:
    """A value of a list flag: one or several comma-separated items of `kind`."""
    def parse(text: str) -> list[int | float | str]:
        try:
            return [kind(s.strip()) for s in text.split(",") if s.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__} values, got {text!r}") from None

    return parse


class _Extend(argparse.Action):
    """Several values, each possibly comma-separated, flattened into one list."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        for chunk in values if isinstance(values, list) else [values]:
            items.extend(cast("list[object]", chunk))  # every value went through `_list_item`'s parser
        setattr(namespace, self.dest, items)


class _Merge(argparse.Action):
    """KEY=VALUE pairs, repeated, merged into one table."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        table = dict(getattr(namespace, self.dest, None) or {})
        for pair in values if isinstance(values, list) else [values]:
            key, value = cast("tuple[str, object]", pair)  # every value went through `_key_value`'s parser
            table[key] = value
        setattr(namespace, self.dest, table)


def _key_value(value_type: object) -> Callable[[str], tuple[str, object]]:
    def parse(text: str) -> tuple[str, object]:
        key, sep, raw = text.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
        if value_type is int:
            try:
                return key.strip(), int(raw)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{key}: expected an integer, got {raw!r}") from None
        return key.strip(), _toml_value(raw)

    return parse


def _toml_value(raw: str) -> object:
    """A value as TOML reads it (numbers, booleans, quoted strings, lists), else the text itself."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def check_tables(tables: Sequence[FlagTable]) -> None:
    """No two fields share a flag name (a programming error, raised at parser build time)."""
    seen: dict[str, str] = {}
    for t in tables:
        for p in t.paths():
            name = t.flag_name(p)
            if name in seen:
                raise ValueError(f"flag {name} names both {seen[name]} and {t.prefix + p}")
            seen[name] = t.prefix + p
