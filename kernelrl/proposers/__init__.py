"""Proposers: where candidate programs come from, behind one interface.

`make_proposer(spec, **opts)` parses a spec:
- `openai:MODEL` any OpenAI-compatible chat endpoint through the official `openai` client.
  Configured by OPENAI_BASE_URL / OPENAI_API_KEY or the options `base_url`, `api_key`;
  `temperature`, `max_tokens` (`max_tokens_field="max_completion_tokens"` for models that
  want the newer name; a 400 asking for it switches once by itself), `concurrency` (requests in
  flight at once, shared by every thread using the proposer), `timeout_s`, and the retry policy (`max_retries`,
  `backoff_initial_s`, `backoff_max_s`, `backoff_jitter`).
- `hf:PATH` a local Hugging Face causal LM (needs the optional extra `transformers`).
- `replay:PATH` a JSONL file of rows `{"task": NAME, "code": ...}` or `{"task": NAME,
  "answer": ...}` (optional `prompt_tokens`, `completion_tokens`), or a folder of .py files.
  A file's task is named by a `# task: NAME` line among its first 10 lines; failing that by its
  path relative to the folder without `.py` and without a trailing `__N` or `.N` counter
  (`level1/matmul__2.py` -> `level1/matmul`); a name matches a task whose full name or last
  path component equals it. Rows are handed out per task in file order (folders: natural sort
  order), each once, across all chains.
- `heuristic` offline and model-free: a portfolio of known program-level rewrites of the
  reference (inference mode, torch.compile modes, channels_last for convolutions, oneDNN
  freezing on CPU, CUDA graphs on GPU, and combinations). Its programs embed a renamed copy of
  the reference and call it, so they are for `open` and `strict-pytorch`; asking for it under
  `strict` (custom kernels only) is an error.

Guarantees:
- `propose` returns a `Proposal` for every answer a model gave, well-formed or not: an answer
  without a complete code block (empty, prose only, truncated) has `code=None` and keeps the raw
  text, so the caller records it;
- a finite proposer (`replay`, `heuristic`) raises `Exhausted` when it has nothing left for the
  requested task; the caller ends that chain;
- an endpoint that still fails after the retry policy is spent raises `ProposerUnavailable`;
  a bad spec or option raises `ProposerError` with a one-line message;
- proposers are safe to call from several threads at once;
- `check_spec(spec, **opts)` raises the `ProposerError` `make_proposer` would for a bad kind, a
  missing argument, an option the kind does not take, a `replay:` path that does not exist or a
  heuristic under `strict`, without loading, calling or importing anything heavy (the command
  line checks a spec before it starts workers).

Does not judge the programs: that is the evaluator's work.
"""

from __future__ import annotations

import time
from typing import Any

from kernelrl.proposers.base import (
    Exhausted,
    Proposal,
    ProposalRequest,
    Proposer,
    ProposerError,
    ProposerUnavailable,
    proposal_from_answer,
)

__all__ = ["Exhausted", "Proposal", "ProposalRequest", "Proposer", "ProposerError", "ProposerUnavailable",
           "check_spec", "make_proposer", "proposal_from_answer"]


_OPENAI_OPTS = {"base_url", "api_key", "temperature", "max_tokens", "max_tokens_field", "concurrency", "timeout_s",
                "max_retries", "backoff_initial_s", "backoff_max_s", "backoff_jitter", "system", "sleep", "rng"}
_HF_OPTS = {"max_new_tokens", "temperature", "device", "system"}
_HEURISTIC_OPTS = {"device", "policy"}


def _check_opts(kind: str, opts: dict[str, Any], allowed: set[str]) -> dict[str, Any]:
    """Options given as None mean "not set" (CLI flags left out); unknown ones are an error."""
    given = {k: v for k, v in opts.items() if v is not None}
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ProposerError(f"{kind} proposer does not take option(s) {', '.join(unknown)}; "
                            f"it takes {', '.join(sorted(allowed))}")
    return given


def check_spec(spec: str, **opts: object) -> None:
    """What `make_proposer` would refuse in `spec` and `opts`, found without making the proposer."""
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "openai":
        _check_opts(kind, {k: v for k, v in opts.items() if k not in ("policy", "device")}, _OPENAI_OPTS)
        if not arg.strip():
            raise ProposerError("openai proposer needs a model name: openai:MODEL")
    elif kind == "hf":
        _check_opts(kind, {k: v for k, v in opts.items() if k != "policy"}, _HF_OPTS)
        if not arg.strip():
            raise ProposerError("hf proposer needs a model: hf:PATH (a local folder or a Hugging Face name)")
    elif kind == "replay":
        _check_opts(kind, {k: v for k, v in opts.items() if k not in ("policy", "device")}, set())
        if not arg.strip():
            raise ProposerError("replay proposer needs a path: replay:PATH")
        from pathlib import Path

        if not Path(arg.strip()).exists():
            raise ProposerError(f"replay proposer: no such file or folder: {arg.strip()}")
    elif kind == "heuristic":
        if arg.strip():
            raise ProposerError(f"heuristic proposer takes no argument, got {spec!r}")
        from kernelrl.proposers.heuristic import HeuristicConfig

        HeuristicConfig(**_check_opts(kind, opts, _HEURISTIC_OPTS))
    else:
        raise ProposerError(_unknown(spec))


def _unknown(spec: str) -> str:
    return f"unknown proposer {spec!r}; expected openai:MODEL, hf:PATH, replay:PATH or heuristic"


def make_proposer(spec: str, **opts: Any) -> Proposer:
    """A proposer from `openai:MODEL`, `hf:PATH`, `replay:PATH` or `heuristic` (see module doc).

    Options that do not apply to the chosen kind raise ProposerError, except `policy` and
    `device`, which every kind accepts so a caller can always pass the run's settings.
    """
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "openai":
        from kernelrl.endpoint import RetryPolicy
        from kernelrl.proposers.openai_compat import (
            OpenAIConfig,
            OpenAIProposer,
        )

        o = _check_opts(kind, {k: v for k, v in opts.items() if k not in ("policy", "device")}, _OPENAI_OPTS)
        try:
            retry = RetryPolicy(**{name: o.pop(key) for key, name in (
                ("max_retries", "max_retries"), ("backoff_initial_s", "initial_s"), ("backoff_max_s", "max_s"),
                ("backoff_jitter", "jitter")) if key in o})
        except ValueError as e:
            raise ProposerError(f"openai proposer: {e}") from None
        sleep, rng = o.pop("sleep", time.sleep), o.pop("rng", None)
        return OpenAIProposer(OpenAIConfig(model=arg.strip(), retry=retry, **o), sleep=sleep, rng=rng)
    if kind == "hf":
        from kernelrl.proposers.hf import HFConfig, HFProposer

        o = _check_opts(kind, {k: v for k, v in opts.items() if k != "policy"}, _HF_OPTS)
        return HFProposer(HFConfig(path=arg.strip(), **o))
    if kind == "replay":
        _check_opts(kind, {k: v for k, v in opts.items() if k not in ("policy", "device")}, set())
        if not arg.strip():
            raise ProposerError("replay proposer needs a path: replay:PATH")
        from kernelrl.proposers.replay import ReplayProposer

        return ReplayProposer(arg.strip())
    if kind == "heuristic":
        if arg.strip():
            raise ProposerError(f"heuristic proposer takes no argument, got {spec!r}")
        from kernelrl.proposers.heuristic import (
            HeuristicConfig,
            HeuristicProposer,
        )

        return HeuristicProposer(HeuristicConfig(**_check_opts(kind, opts, _HEURISTIC_OPTS)))
    raise ProposerError(_unknown(spec))
