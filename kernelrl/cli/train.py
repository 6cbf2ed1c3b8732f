"""`kernelrl collect|train|bench`: the learner's data, its three stages, and what a trained model is worth."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from kernelrl.cli.options import (
    UsageError,
    add_eval_options,
    check_device,
    console_for,
    eval_config,
    task_specs,
)

# collect / train / bench (kernelrl.train)


def _train_errors() -> tuple[type[Exception], ...]:
    """Errors of bad input to the training commands: one line, exit 2."""
    from kernelrl.config import ConfigError
    from kernelrl.search.database import DatabaseError
    from kernelrl.search.proposers import ProposerError
    from kernelrl.tasks.task import TaskError
    from kernelrl.train.sft_set import SFTSetError
    from kernelrl.train.stage import StageError

    return ConfigError, DatabaseError, ProposerError, TaskError, SFTSetError, StageError


def _endpoint_opts(args: argparse.Namespace) -> dict[str, Any]:
    opts = {"base_url": args.base_url, "temperature": args.temperature, "max_tokens": args.max_tokens}
    return {k: v for k, v in opts.items() if v is not None}


def cmd_collect(args: argparse.Namespace) -> int:
    from kernelrl.config import ConfigError, build
    from kernelrl.report.console import render_collect
    from kernelrl.train.collect import CollectConfig, collect

    try:
        config = build(CollectConfig, {
            "tasks": task_specs(args.tasks), "proposers": args.proposer, "out": args.out, "tries": args.tries,
            "keep": args.keep, "db_path": args.db, "k_shown": args.k_shown, "model_concurrency": args.model_concurrency,
            "proposer_opts": _endpoint_opts(args), "eval": eval_config(args)})
    except ConfigError as e:
        raise UsageError(f"bad collect settings: {e}") from e
    console = console_for()
    errors: tuple[type[Exception], ...] = (*_train_errors(), ValueError)
    try:
        summary = collect(config, console=console)
    except errors as e:
        raise UsageError(str(e)) from e
    render_collect(summary, console)
    return 0


def _overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """KEY=VALUE arguments as dotted overrides; values read as TOML (numbers, true, [lists]), else text."""
    import tomllib

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"override {pair!r} is not KEY=VALUE (e.g. grpo.trl.max_steps=4)")
        try:
            out[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = raw
    return out


def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelrl train {sft,rft,grpo}",
                                description="Train a model on TRL: sft, rft (rejection sampling) or grpo.")
    p.add_argument("--config", required=True, help="named training config (kernelrl/configs/train/NAME.toml) or a "
                                                   ".toml file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings on top of the config, e.g. grpo.trl.max_steps=4 model.path=PATH")
    p.add_argument("--resume", action="store_true", help="continue from the stage's last checkpoint")
    p.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config, every file it names and the launch (any machine; nothing is loaded or "
                        "trained) and print the launch command; exit 2 when a check fails")
    return p


def cmd_train(args: argparse.Namespace) -> int:
    from kernelrl.config import to_dict
    from kernelrl.report.console import render_stage_report
    from kernelrl.train.recipe import load_train_config, run_stage
    from kernelrl.train.stage import Stage

    args = argparse.Namespace(stage=args.stage, **vars(train_parser().parse_intermixed_args(args.rest)))
    errors = _train_errors()
    try:
        config = load_train_config(args.config, _overrides(args.overrides))
    except errors as e:
        raise UsageError(f"bad training configuration: {e}") from e
    if args.print_config:
        print(json.dumps(to_dict(config), indent=1, default=str))
        return 0
    if args.dry_run:
        return _dry_run(config, Stage(args.stage), args.config)
    check_device(config.eval.device)
    console = console_for()
    try:
        report = run_stage(config, Stage(args.stage), resume=args.resume, console=console)
    except errors as e:
        raise UsageError(str(e)) from e
    render_stage_report(report, console)
    return 0


def _dry_run(config: Any, stage: Any, name: str) -> int:
    from kernelrl.train.launch import dry_run

    try:
        report = dry_run(config, stage, name=name)
    except _train_errors() as e:
        raise UsageError(str(e)) from e
    marks = {"ok": "ok   ", "note": "note ", "error": "ERROR"}
    for c in report.checks:
        print(f"{marks[c.level]} {c.what}: {c.detail}")
    print(f"launch: {report.command}")
    if not report.ok:
        errors = [c for c in report.checks if c.level == "error"]
        raise UsageError(f"dry run of {stage.value} with {name}: {len(errors)} check(s) failed "
                         f"({'; '.join(c.what for c in errors)})")
    print(f"dry run of {stage.value} with {name}: every check passed")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from kernelrl.config import ConfigError, build
    from kernelrl.report.console import render_bench
    from kernelrl.train.bench import BenchConfig, plot_bench, run_bench
    from kernelrl.train.collect import ProposerSpec

    try:
        spec = ProposerSpec.parse(args.proposer)
        config = build(BenchConfig, {
            "tasks": task_specs(args.tasks) or ["builtin"], "split": args.split, "proposer": spec.spec,
            "proposer_opts": {**_endpoint_opts(args), **spec.options()}, "k": args.k,
            "ps": args.fast or [1.0, 1.5, 2.0],
            "compile_baseline": not args.no_compile, "db_path": args.db, "model_concurrency": args.model_concurrency,
            "turns": args.turns, "history_tokens": args.history_tokens, "eval": eval_config(args)})
    except (ConfigError, ValueError) as e:
        raise UsageError(f"bad bench settings: {e}") from e
    console = console_for(args.json)
    if config.turns > 1:
        return _bench_turns(config, args, console)
    try:
        report = run_bench(config, console=console)
    except _train_errors() as e:
        raise UsageError(str(e)) from e
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        render_bench(report, console)
    if args.plot:
        console.print(f"plot written to {plot_bench(report, args.plot)}")
    return 0


def _bench_turns(config: Any, args: argparse.Namespace, console: Any) -> int:
    """`kernelrl bench --turns T`: refinement episodes, reported by turn."""
    from kernelrl.report.console import render_turn_bench
    from kernelrl.train.bench_turns import plot_turn_bench, run_turn_bench

    try:
        report = run_turn_bench(config, console=console)
    except _train_errors() as e:
        raise UsageError(str(e)) from e
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        render_turn_bench(report, console)
    if args.plot:
        console.print(f"plot written to {plot_turn_bench(report, args.plot)}")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register this module's commands."""
    p = sub.add_parser("collect", help="build the SFT set: several proposers try every task, the evaluator keeps "
                                       "what is correct")
    p.add_argument("--tasks", nargs="+", required=True, metavar="SPEC", help="suites, task names, files or folders")
    p.add_argument("--proposer", action="append", required=True, metavar="SPEC",
                   help="heuristic | openai:MODEL | hf:PATH | replay:PATH, optionally with options "
                        "\"openai:M base_url=URL api_key_env=VAR\"; give it several times")
    p.add_argument("--tries", type=int, default=20, help="answers per task and proposer, at most (default 20)")
    p.add_argument("--keep", type=int, default=1, help="correct answers per task and proposer before it stops")
    p.add_argument("--out", required=True, help="the SFT set (.jsonl); a datasets.Dataset is written next to it")
    p.add_argument("--db", default=None, help="code database of every try (default: code.db next to --out, the "
                                              "database `kernelrl train` reads when --out is its sft.jsonl)")
    p.add_argument("--k-shown", type=int, default=4, help="earlier versions shown in each prompt")
    p.add_argument("--model-concurrency", type=int, default=4, help="model calls at once")
    p.add_argument("--base-url", default=None, help="for openai: proposers without their own base_url")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None, help="per answer (openai:)")
    add_eval_options(p)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("train", help="train a model: sft, rft (rejection sampling) or grpo (contrastive RL), on TRL",
                       usage="kernelrl train {sft,rft,grpo} --config NAME|FILE [--resume] [--print-config] "
                             "[--dry-run] [KEY=VALUE ...]",
                       epilog="KEY=VALUE sets a dotted setting of the config, e.g. grpo.trl.max_steps=4; "
                              "`kernelrl train grpo -h` lists the options")
    p.add_argument("stage", choices=("sft", "rft", "grpo"))
    # Flags and KEY=VALUE overrides in any order: parsed by `train_parser` (argparse cannot mix
    # optional flags and trailing positionals in one pass).
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="...", help="--config NAME and the rest, as in the usage")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("bench", help="evaluate a model or proposer on a suite: pass@k, fast_p@k, speedups")
    p.add_argument("--proposer", required=True, metavar="SPEC",
                   help="hf:PATH | replay:PATH | openai:MODEL | heuristic, optionally with options "
                        "\"hf:P max_new_tokens=512\"")
    p.add_argument("--k", type=int, default=5, help="samples per task (default 5)")
    p.add_argument("--turns", type=int, default=1,
                   help="turns per sample: each sample refines its answer from its own verdicts, and the report "
                        "gives pass@k and fast_p@k by turn and T turns against T samples (default 1)")
    p.add_argument("--history-tokens", type=int, default=6000,
                   help="with --turns: the most the earlier turns may take of a prompt (default 6000)")
    p.add_argument("--tasks", nargs="+", default=None, metavar="SPEC",
                   help="suites, task names, files or folders (a KernelBench checkout); default: builtin")
    p.add_argument("--split", default="test", choices=("test", "validation", "train", "all"),
                   help="evaluate the tasks of this split only (default test: tasks no training run may use); "
                        "your own task files have no split and are always taken")
    p.add_argument("--fast", type=float, nargs="+", default=None, metavar="P",
                   help="fast_p thresholds (default 1.0 1.5 2.0)")
    p.add_argument("--no-compile", action="store_true", help="do not measure the torch.compile baselines")
    p.add_argument("--db", default=None, help="store every sample and verdict in this code database")
    p.add_argument("--plot", default=None, metavar="FILE.png")
    p.add_argument("--json", action="store_true")
    p.add_argument("--model-concurrency", type=int, default=4)
    p.add_argument("--base-url", default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    add_eval_options(p)
    p.set_defaults(func=cmd_bench)
