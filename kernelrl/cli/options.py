"""What the commands share: the usage error, consoles, task and candidate arguments, eval options."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from kernelrl.checks.policy import PolicyName
from kernelrl.judge.device import Device
from kernelrl.tasks.task import Size


class UsageError(Exception):
    """A bad invocation: printed as one line, exit status 2."""


def console_for(json_mode: bool = False) -> Console:
    # With --json, stdout carries only the JSON object; everything for people goes to stderr.
    return Console(stderr=True) if json_mode else Console()


def with_spinner(console: Console, text: str, fn: Callable[[], Any]) -> Any:
    with console.status(text, spinner="dots"):
        return fn()


def task_specs(values: Sequence[str] | None) -> list[str]:
    """Task specs given as several values, comma-separated values, or both."""
    return [s.strip() for v in values or () for s in v.split(",") if s.strip()]


# eval, baseline


def read_candidate(path_str: str) -> Any:
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


def eval_config(args: argparse.Namespace) -> Any:
    from kernelrl.judge.evaluator import EvalConfig

    try:
        config = EvalConfig(device=args.device, size=args.size, timeout_s=args.timeout,
                            build_timeout_s=args.build_timeout, policy=args.policy)
    except ValueError as e:
        raise UsageError(str(e)) from e
    check_device(config.device)
    return config


def load_one_task(spec: str) -> Any:
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


BUILD_TIMEOUT_HELP = "added to --timeout for a candidate that compiles (an uncached C++/CUDA build, Triton)"


def add_eval_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=tuple(Device), default=Device.CPU.value)
    p.add_argument("--size", choices=tuple(Size), default=Size.SMALL.value)
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="wall-clock limit for one candidate's evaluation, build excluded (default 300)")
    p.add_argument("--build-timeout", type=float, default=300.0, metavar="SECONDS", help=BUILD_TIMEOUT_HELP)
    p.add_argument("--policy", choices=tuple(PolicyName), default=PolicyName.OPEN.value,
                   help="strict: needs a custom kernel; open: any PyTorch-level rewrite; observe: static rules only warn")
