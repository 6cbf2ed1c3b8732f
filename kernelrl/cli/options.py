"""What the commands share: the usage error, consoles, task and candidate arguments, the evaluator's flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console

from kernelrl.cli.flags import FlagTable, add_flags, help_config, overrides, user_words
from kernelrl.config import ConfigError, build, load_toml, with_overrides
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.harness.device import Device

if TYPE_CHECKING:
    from kernelrl.candidate import Candidate
    from kernelrl.tasks.task import Task

T = TypeVar("T")


class UsageError(Exception):
    """A bad invocation: printed as one line, exit status 2."""


def console_for(json_mode: bool = False) -> Console:
    # With --json, stdout carries only the JSON object; everything for people goes to stderr.
    return Console(stderr=True) if json_mode else Console()


def with_spinner(console: Console, text: str, fn: Callable[[], T], backend: object = None) -> T:
    """`fn()` under a spinner saying `text`, its elapsed seconds and who holds `backend`'s timing lock."""
    from kernelrl.search.activity import lock_watch, waiting

    with waiting(console, text, lock_watch(backend) if backend is not None else None):
        return fn()


def task_specs(values: Sequence[str] | None) -> list[str]:
    """Task specs given as several values, comma-separated values, or both."""
    return [s.strip() for v in values or () for s in v.split(",") if s.strip()]


# eval, baseline


def read_candidate(path_str: str) -> Candidate:
    from kernelrl.candidate import Candidate, extract_code

    path = Path(path_str)
    if not path.is_file():
        raise UsageError(f"no such candidate file: {path}")
    text = path.read_text(errors="replace")
    if path.suffix in (".md", ".txt", ".answer"):
        code = extract_code(text)
        if code is None:
            raise UsageError(f"{path} holds no complete fenced code block")
        text = code
    return Candidate(source=text, origin=str(path))


def eval_config(args: argparse.Namespace, *, check: bool = True) -> EvalConfig:
    """The evaluator's config of a judging command: the `[eval]` table of `--config`, then the flags;
    `check`: the device must be usable here."""
    try:
        values = load_toml(args.config).get("eval", {}) if args.config else {}
        if not isinstance(values, Mapping):
            raise ConfigError(f"{args.config}: eval must be a table")
        config = build(EvalConfig, with_overrides(values, overrides(args, EVAL_FLAGS)))
    except ConfigError as e:
        raise UsageError(user_words(str(e), EVAL_FLAGS)) from e
    if check:
        check_device(config.device)
    return config


def load_one_task(spec: str) -> Task:
    from kernelrl.tasks.suites import load_task
    from kernelrl.tasks.task import TaskError

    try:
        return load_task(spec)
    except TaskError as e:
        raise UsageError(str(e)) from e


def check_device(device: str) -> None:
    if device == Device.CUDA:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available on this machine")


# The evaluator's flags, the same on every command that judges (`kernelrl.cli.flags`): every
# field of EvalConfig, under its dotted path, with short names for the common ones.
EVAL_FLAGS = FlagTable(
    config=EvalConfig,
    names={"timeout_s": "--timeout", "build_timeout_s": "--build-timeout", "timing.max_timing_s": "--timing-cap",
           "concurrency": "--eval-concurrency"},
    helps={
        "device": "where candidates run (cpu, or cuda with a CUDA build of torch)",
        "size": "small shrinks a task's largest constants so it runs on a CPU; full is the file as written",
        "timeout_s": "wall-clock limit for loading and checking one candidate, build excluded",
        "build_timeout_s": "added to --timeout for a candidate that compiles (an uncached C++/CUDA build, Triton)",
        "policy": "strict: needs a custom kernel; strict-pytorch: strict's defences, PyTorch rewrites allowed; "
                  "open: any PyTorch-level rewrite, precision changes and fallbacks only warn; observe: static rules "
                  "only warn",
        "timing.max_timing_s": "per candidate: timing stops here when the +-1%% interval is not reached",
        "concurrency": "candidates built and checked at once",
        "constants": "explicit task constants on top of --size",
        # Fields whose config declares them without a comment (the help belongs there, then here it goes):
        "aa_retimes": "times a group whose A/A copy measured outside 1 +- --aa-tolerance is timed again",
        "n_correctness": "input sets a candidate must match: the first plain, the others randomly scaled and shifted "
                         "(at least 2)",
        "static_checks": "run the static AST rules before a candidate runs (--no-static-checks: skip them)",
        "cache_dir": "build, baseline and machine-peak cache (default $KERNELRL_CACHE, else ~/.cache/kernelrl)",
        "timing.warmup_calls": "untimed calls of every member before timing starts",
        "timing.warmup_max_s": "the most warm-up may take per member, in seconds",
        "timing.min_rounds": "rounds timed before the interval may stop timing (at least 3)",
        "timing.max_rounds": "rounds timed at most",
        "timing.target_rel_ci": "timing stops once every speedup's 95%% interval is within +- this share "
                                "(0.01: +-1%%)",
        "timing.spot_check_prob": "chance that a round's outputs are checked against the reference's",
        "timing.min_spot_checks": "spot checks every candidate passes before timing may stop",
        "timing.pool_size": "input sets each timed call draws from (scaled and jittered per call)",
        "timing.max_calls_per_sample": "calls one sample may hold when calls are shorter than --timing.min-sample-ms",
        "sandbox.pin_allocator": "the same memory-allocator settings in every timed worker from its timing pool "
                                 "on, so no member's tensors are placed luckier than another's",
        "sandbox.max_open_files": "open files one worker may hold",
        "sandbox.log_tail_chars": "characters of a worker's log kept with a failed verdict",
        "llm_judge.enabled": "ask an adversarial LLM judge about results above --llm-judge.min-speedup or "
                             "--llm-judge.min-roofline-pct (default: on exactly when --llm-judge.model is given; "
                             "--no-llm-judge.enabled turns a named judge off)",
        "llm_judge.model": "the LLM judge's model (naming one turns the judge on)",
        "llm_judge.max_tokens": "the longest LLM-judge answer, in tokens",
        "llm_judge.retry.max_retries": "LLM judge: retries of a failed request",
        "llm_judge.retry.initial_s": "LLM judge: the first wait before a retry, doubled at each retry",
        "llm_judge.retry.max_s": "LLM judge: the longest wait before a retry",
        "llm_judge.retry.jitter": "LLM judge: each wait is scaled by a random factor in 1 +- this",
    })


def add_eval_options(p: argparse.ArgumentParser) -> None:
    """`--config` (a run config whose [eval] table is read) and every evaluator setting as a flag."""
    p.add_argument("--config", default=None, help="run config (kernelrl/configs/NAME.toml or a .toml file) "
                                                   "whose [eval] table the flags override")
    add_flags(p, EVAL_FLAGS, config_values=help_config("eval") or {})
