"""A proposer and its options in one string: `SPEC key=value ...`, the one way every command takes them.

`--proposer "openai:MODEL base_url=URL api_key_env=VAR temperature=0.7"` names the proposer
(`kernelrl.proposers.make_proposer`'s spec) and its options, on every command that asks a
model (`optimize`, `bench`, `collect`, which takes several); a config file may write the same
string, or the options as a `proposer_opts` table (options on the command line win, key by key).

Guarantees: a value is read as a TOML scalar where it is one (`temperature=0.7` is a float,
`stream=true` a bool), else kept as text; an option that is not `key=value` is refused with the
whole spec in the message; an API key is never written in a spec: `api_key_env=NAME` names the
environment variable that holds it, read when the options are taken (`options`), and `api_key=`
is refused, so a key never lands in a shell history, a config file or a run's stored config.

Does not check that the proposer exists or accepts the options: `make_proposer` does (and the
commands' preflights, before any worker starts).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

PROPOSER_OPTIONS_KEY = "proposer_opts"  # where a config holds its proposer's options


@dataclass(frozen=True, kw_only=True)
class ProposerSpec:
    """A proposer spec and its options, parsed from `SPEC key=value ...`."""

    spec: str
    opts: dict[str, object] = field(default_factory=dict)  # TOML scalars, or the raw text

    @classmethod
    def parse(cls, text: str) -> ProposerSpec:
        spec, *pairs = text.split()
        opts: dict[str, object] = {}
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            if not sep or not key:
                raise ValueError(f"proposer option {pair!r} is not key=value (in {text!r})")
            if key == "api_key":
                raise ValueError("write api_key_env=NAME (the variable holding the key), never the key itself")
            opts[key] = _scalar(raw)
        return cls(spec=spec, opts=opts)

    def options(self, environ: Mapping[str, str] | None = None) -> dict[str, object]:
        """The options for `make_proposer`, with `api_key_env=NAME` read from the environment."""
        environ = os.environ if environ is None else environ
        opts = dict(self.opts)
        var = opts.pop("api_key_env", None)
        if var is not None:
            if not environ.get(str(var)):
                raise ValueError(f"{self.label}: api_key_env={var} names an unset environment variable")
            opts["api_key"] = environ[str(var)]
        return opts

    @property
    def label(self) -> str:
        """The name its answers are stored under: the spec, and the endpoint when one is given."""
        url = self.opts.get("base_url")
        return f"{self.spec}@{url}" if url else self.spec


def _scalar(raw: str) -> object:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def inline_options(values: MutableMapping[str, object], key: str = "proposer") -> None:
    """A command's settings with `values[key]` given as `SPEC key=value ...`: the spec stays under
    `key`, its options go on top of `proposer_opts` (ValueError for a malformed spec or an unset
    `api_key_env`)."""
    text = values.get(key)
    if not isinstance(text, str) or len(text.split()) < 2:
        return
    spec = ProposerSpec.parse(text)
    values[key] = spec.spec
    shared = values.get(PROPOSER_OPTIONS_KEY)
    values[PROPOSER_OPTIONS_KEY] = {**(dict(shared) if isinstance(shared, Mapping) else {}), **spec.options()}
