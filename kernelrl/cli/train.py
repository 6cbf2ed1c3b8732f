"""`kernelrl collect|train|bench`: the learner's data, its three stages, and what a trained model is worth."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kernelrl.cli.flags import (
    FlagTable,
    add_flags,
    config_for_help,
    flag_for,
    given_values,
    overrides,
    user_words,
)
from kernelrl.cli.options import EVAL_FLAGS, UsageError, check_device, console_for, load_one_task
from kernelrl.cli.preflight import (
    check_files,
    check_proposer,
    check_run_database,
    check_tasks,
    check_watch,
    check_writable_parent,
)
from kernelrl.episodes.episode import nest_episode_keys
from kernelrl.train.bench import BenchConfig
from kernelrl.train.collect import CollectConfig
from kernelrl.train.recipe import TrainConfig

if TYPE_CHECKING:
    from rich.console import Console

    from kernelrl.train.stage import Stage

# The configs `_config` builds (the commands that read a run config and flags of their own).
_C = TypeVar("_C", CollectConfig, BenchConfig)

# collect / train / bench (kernelrl.train)


def _train_errors() -> tuple[type[Exception], ...]:
    """Errors of bad input to the training commands: one line, exit 2."""
    from kernelrl.config import ConfigError
    from kernelrl.proposers import ProposerError
    from kernelrl.store.schema import DatabaseError
    from kernelrl.tasks.task import TaskError
    from kernelrl.train.sft_set import SFTSetError
    from kernelrl.train.stage import StageError

    return ConfigError, DatabaseError, ProposerError, TaskError, SFTSetError, StageError


# `collect`'s and `bench`'s flags: every field of their configs (`kernelrl.cli.flags`), the
# evaluator's under the same names as on every judging command; `--config` reads a run config.
COLLECT_FLAGS = FlagTable(
    config=CollectConfig,
    names={"proposers": "--proposer", "db_path": "--db", "template_dir": "--templates"},
    inline={"proposer_opts": "--proposer"},
    helps={
        "tasks": "suites, task names, files or folders",
        "proposers": "heuristic | openai:MODEL | hf:PATH | replay:PATH, optionally with options "
                     "\"openai:M base_url=URL api_key_env=VAR\"; give several, or the flag several times",
        "out": "the SFT set (.jsonl); a datasets.Dataset is written next to it",
        "tries": "answers per task and proposer, at most",
        "keep": "correct answers per task and proposer before it stops",
        "db_path": "code database of every try (default: code.db next to --out, the database `kernelrl train` "
                   "reads when --out is its sft.jsonl)",
        "k_shown": "earlier versions shown in each prompt",
        "model_concurrency": "model calls at once",
        "seed": "seeds the prompts' random choices (the judge's seeds stay secret whatever this is)",
        "template_dir": "folder of prompt templates overriding the built-in ones",
    },
    skip=frozenset({"eval"}))
BENCH_FLAGS = FlagTable(
    config=BenchConfig,
    names={"ps": "--fast", "compile_baseline": "--compile", "db_path": "--db", "template_dir": "--templates",
           "episode.turns": "--turns", "episode.history_tokens": "--history-tokens"},
    inline={"proposer_opts": "--proposer"},
    helps={
        "proposer": "hf:PATH | replay:PATH | openai:MODEL | heuristic, optionally with options "
                    "\"hf:P max_new_tokens=512\"",
        "k": "samples per task",
        "episode.turns": "turns per sample: each sample refines its answer from its own verdicts, and the report gives "
                 "pass@k and fast_p@k by turn and T turns against T samples",
        "episode.gamma": "the discount of later turns' rewards in a turn's return (the bench pays no returns: "
                         "kept so that [episode] reads the same in every config)",
        "episode.history_tokens": "with --turns: the most the earlier turns may take of a prompt",
        "tasks": "suites, task names, files or folders (a KernelBench checkout); default: builtin",
        "split": "evaluate the tasks of this split only: test (tasks no training run may use), "
                 "validation, train or all; your own task files have no split and are always taken",
        "ps": "fast_p thresholds",
        "compile_baseline": "measure the torch.compile baselines (--no-compile: do not)",
        "db_path": "store every sample and verdict in this code database",
        "model_concurrency": "proposer calls at once",
        "seed": "seeds the prompts' random choices (the judge's seeds stay secret whatever this is)",
        "template_dir": "folder of prompt templates overriding the built-in ones",
    },
    skip=frozenset({"eval"}))
# `train`'s flags: every field of the training config by its dotted path (`--grpo.trl max_steps=4`,
# `--model.path PATH`, `--output-dir PATH`), the evaluator's under the names every judging command
# gives them; a TRL table given on the command line merges into the config file's, key by key.
TRAIN_FLAGS = FlagTable(
    config=TrainConfig,
    helps={"tasks": "suites, task names, files or folders the run trains on",
           "output_dir": "stage folders go under it: OUTPUT_DIR/sft, /rft, /grpo"},
    skip=frozenset({"eval"}))
TRAIN_TABLES = (TRAIN_FLAGS, dataclasses.replace(EVAL_FLAGS, prefix="eval."))
COLLECT_TABLES = (COLLECT_FLAGS, dataclasses.replace(EVAL_FLAGS, prefix="eval."))
BENCH_TABLES = (BENCH_FLAGS, dataclasses.replace(EVAL_FLAGS, prefix="eval."))


def _config(args: argparse.Namespace, cls: type[_C], tables: tuple[FlagTable, ...], command: str,
            adjust: Callable[[dict[str, Any]], None] | None = None) -> _C:
    """A command's config: the named run config file, then the flags given on top; `adjust`
    rewrites the merged settings before they are built."""
    from kernelrl.config import ConfigError, build, with_overrides

    try:
        values = given_values(args, *tables, legacy=nest_episode_keys)
        if getattr(args, "recipe", None):
            values = with_overrides(_recipe(args.recipe, command), values)
        if adjust is not None:
            adjust(values)
        config = build(cls, values)  # `tables[0].config` is `cls`
    except (ConfigError, ValueError) as e:
        raise UsageError(user_words(str(e), *tables)) from e
    check_device(config.eval.device)
    return config


def _recipe(name: str, command: str) -> dict[str, Any]:
    """A training run config's settings for `collect` or `bench` (`kernelrl.train.recipe.recipe_values`)."""
    from kernelrl.train.recipe import load_train_config, recipe_values

    return recipe_values(load_train_config(name), command)


def _preflight(config: CollectConfig | BenchConfig, proposers: list[tuple[str, dict[str, object]]]) -> None:
    """What `collect` and `bench` can check before a worker or a model starts: each proposer spec
    (with its own options), the tasks, the templates folder, the database and the run page's port."""
    from kernelrl.proposers.spec import ProposerSpec

    for text, shared in proposers:
        try:
            spec = ProposerSpec.parse(text)
            opts = {**shared, **spec.options()}
        except ValueError as e:
            raise UsageError(f"--proposer {text}: {e}") from e
        if not spec.spec.startswith("openai"):
            # as `kernelrl.train.collect` makes them: endpoint options given for every proposer
            # apply to the OpenAI-compatible ones only
            for key in ("base_url", "temperature", "max_tokens"):
                if key not in spec.opts:
                    opts.pop(key, None)
        check_proposer(spec.spec, {**opts, "policy": config.eval.policy, "device": config.eval.device})
    check_tasks(config.tasks)
    check_files([("--templates", config.template_dir)], folder=True)
    check_watch(config.watch)
    if config.db_path is not None:
        if config.db_path.exists():
            check_run_database(config.db_path)
        else:
            check_writable_parent(config.db_path, flag="--db")


# Any: the settings as read, rewritten before `build` checks their types.
def _bench_values(values: dict[str, Any]) -> None:
    """`bench`: the builtin suite by default; "hf:PATH key=value ...": the spec, its options on top of
    the config file's `proposer_opts`."""
    from kernelrl.proposers.spec import inline_options

    values.setdefault("tasks", ["builtin"])
    inline_options(values)


def cmd_collect(args: argparse.Namespace) -> int:
    from kernelrl.train.collect import collect
    from kernelrl.train.console import render_collect

    config = _config(args, CollectConfig, COLLECT_TABLES, "collect")
    _preflight(config, [(spec, dict(config.proposer_opts)) for spec in config.proposers])
    check_writable_parent(config.out, flag="--out")
    console = console_for()
    errors: tuple[type[Exception], ...] = (*_train_errors(), ValueError)
    try:
        summary = collect(config, console=console)
    except errors as e:
        raise UsageError(str(e)) from e
    render_collect(summary, console)
    return 0


_STAGES = {"sft": "Train a model on TRL, supervised, on the SFT set (`kernelrl collect`).",
           "rft": "Train a model on TRL by rejection sampling: sample, keep what the judge accepts, fine-tune.",
           "grpo": "Train a model on TRL with contrastive GRPO, rewarded by the judge."}


# What each stage's help leaves out (accepted, not listed): the other stages' settings. RFT reads
# the SFT set (`sft.data`), so it keeps that one.
_OTHER_STAGES = {"sft": ("rft", "grpo"), "rft": ("sft.trl", "sft.min_speedup", "sft.init_from", "grpo"),
                 "grpo": ("sft", "rft")}


def train_parser(stage: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"kernelrl train {stage or '{sft,rft,grpo}'}",
                                usage="%(prog)s --config NAME|FILE [--resume] [--print-config] [--dry-run] "
                                      "[--SETTING VALUE ...]",
                                description=_STAGES.get(stage or "", "Train a model on TRL: sft, rft (rejection "
                                                                     "sampling) or grpo."))
    p.add_argument("--config", required=True, help="named training config (kernelrl/configs/train/NAME.toml) or a "
                                                   ".toml file")
    p.add_argument("--resume", action="store_true", help="continue from the stage's last checkpoint")
    p.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config, every file it names and the launch (any machine; nothing is loaded or "
                        "trained) and print the launch command; exit 2 when a check fails")
    add_flags(p, *TRAIN_TABLES, hidden=_OTHER_STAGES.get(stage or "", ()))
    return p


def cmd_train(args: argparse.Namespace) -> int:
    # parsed before the trainer is imported: `kernelrl train grpo -h` answers at once
    rest = list(args.rest)
    with config_for_help(rest):
        parser = train_parser(args.stage)
    parsed, extra = parser.parse_known_intermixed_args(rest)
    if extra:
        settings = [a for a in extra if "=" in a and not a.startswith("-")]
        if settings:
            raise UsageError("settings are flags: " + ", ".join(f"{a} is `{flag_for(a, *TRAIN_TABLES)}`" for a in settings)
                             + f" (`kernelrl train {args.stage} -h` lists them)")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args = argparse.Namespace(stage=args.stage, **vars(parsed))
    from kernelrl.cli import import_runtime

    import_runtime()  # deferred until the stage's flags are read (`main` skips it for `train`)
    from kernelrl.config import to_dict
    from kernelrl.train.console import render_stage_report
    from kernelrl.train.recipe import load_train_config, run_stage
    from kernelrl.train.stage import Stage

    errors = _train_errors()
    try:
        config = load_train_config(args.config, overrides(args, *TRAIN_TABLES))
    except errors as e:
        raise UsageError(f"bad training configuration: {user_words(str(e), *TRAIN_TABLES)}") from e
    if args.print_config:
        print(json.dumps(to_dict(config), indent=1, default=str))
        return 0
    if args.dry_run:
        return _dry_run(config, Stage(args.stage), args.config, _settings_given(rest))
    check_device(config.eval.device)
    check_watch(config.watch)
    console = console_for()
    try:
        report = run_stage(config, Stage(args.stage), resume=args.resume, console=console)
    except errors as e:
        raise UsageError(str(e)) from e
    render_stage_report(report, console)
    return 0


def _settings_given(rest: Sequence[str]) -> list[str]:
    """The command line's settings and `--resume`, as given: what a launch of this run repeats
    (`--config` is the launch command's own; `--dry-run` and `--print-config` are not the run's)."""
    out: list[str] = []
    skip = False
    for arg in rest:
        if skip:
            skip = False
        elif arg == "--config":
            skip = True
        elif not (arg.startswith("--config=") or arg in ("--dry-run", "--print-config")):
            out.append(arg)
    return out


def _dry_run(config: TrainConfig, stage: Stage, name: str, settings: Sequence[str] = ()) -> int:
    from kernelrl.train.launch import CheckLevel, dry_run

    try:
        report = dry_run(config, stage, name=name, settings=settings)
    except _train_errors() as e:
        raise UsageError(str(e)) from e
    marks = {CheckLevel.OK: "ok   ", CheckLevel.NOTE: "note ", CheckLevel.ERROR: "ERROR"}
    for c in report.checks:
        print(f"{marks[c.level]} {c.what}: {c.detail}")
    print(f"launch: {report.command}")
    if not report.ok:
        errors = [c for c in report.checks if c.level is CheckLevel.ERROR]
        raise UsageError(f"dry run of {stage.value} with {name}: {len(errors)} check(s) failed "
                         f"({'; '.join(c.what for c in errors)})")
    print(f"dry run of {stage.value} with {name}: every check passed")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from kernelrl.train.bench import plot_bench, run_bench
    from kernelrl.train.console import render_bench

    config = _config(args, BenchConfig, BENCH_TABLES, "bench", adjust=_bench_values)
    _preflight(config, [(config.proposer, dict(config.proposer_opts))])
    if args.plot:
        check_writable_parent(args.plot, flag="--plot")
    console = console_for(args.json)
    if config.episode.turns > 1:
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


def cmd_reward(args: argparse.Namespace) -> int:
    """`kernelrl reward`: what training would pay each completion, and why (`kernelrl.train.explain`)."""
    import contextlib
    from pathlib import Path

    from kernelrl.backends.judges import make_judge
    from kernelrl.reward import RewardModel
    from kernelrl.store import Database
    from kernelrl.train.console import render_explained
    from kernelrl.train.copies import CopyRule
    from kernelrl.train.explain import ExplainError, explain, prompted, run_windows, state_windows
    from kernelrl.train.recipe import load_train_config
    from kernelrl.train.rollouts import EvalSettings

    db_path = Path(args.db)
    if not db_path.is_file():
        raise UsageError(f"--db {db_path}: no such database")
    if (args.shown is None) == (args.prompt_row is None):
        raise UsageError("give --shown ID[,ID...] (the versions the prompt showed) or --prompt-row ID, one of the two")
    try:
        shown = None if args.shown is None else [int(i) for i in args.shown.split(",") if i.strip()]
    except ValueError:
        raise UsageError(f"--shown takes candidate ids, comma-separated, not {args.shown!r}") from None
    completions = []
    for name in args.completions:
        path = Path(name)
        if not path.is_file():
            raise UsageError(f"no such completion file: {path}")
        text = path.read_text(errors="replace")
        completions.append((path.name, text if path.suffix in (".md", ".txt", ".answer") else f"```python\n{text}```\n"))
    if args.config is not None:
        try:
            config = load_train_config(args.config)
        except _train_errors() as e:
            raise UsageError(str(e)) from e
        reward_config, eval_cfg, backend, rule = config.reward, config.eval, config.backend, config.grpo.copies
        header = f"as training with {args.config} pays"
    else:
        from kernelrl.judge.eval_config import EvalConfig
        from kernelrl.reward import RewardConfig

        reward_config, eval_cfg, backend, rule = RewardConfig(), EvalConfig(), None, CopyRule()
        header = "as training pays with the default reward and evaluator settings (--config names a training config)"
    check_device(str(eval_cfg.device))
    task = load_one_task(args.task) if args.task else None
    console = console_for(args.json)
    model = RewardModel(reward_config)
    with Database(db_path, readonly=True) as db:
        try:
            at = prompted(db, task=task, shown=shown, prompt_row=args.prompt_row)
            windows = (state_windows(Path(args.state), model) if args.state
                       else run_windows(db, at.task, reward_config.smoothing.window))
            with contextlib.closing(make_judge(eval_cfg, backend)) as judge:
                items = explain(db, at, completions, judge=judge, reward=model, settings=EvalSettings.of(eval_cfg),
                                copy_rule=rule, windows=windows)
        except ExplainError as e:
            raise UsageError(str(e)) from e
    if args.json:
        print(json.dumps([e.to_dict() for e in items]))
    else:
        listed = ", ".join(map(str, at.shown)) if at.shown else "none recorded: read from the prompt's text"
        render_explained(items, console, header=f"{at.task.name}: shown versions {listed}; {header}")
    return 0


def _bench_turns(config: BenchConfig, args: argparse.Namespace, console: Console) -> int:
    """`kernelrl bench --turns T`: refinement episodes, reported by turn."""
    from kernelrl.train.bench_turns import plot_turn_bench, run_turn_bench
    from kernelrl.train.console import render_turn_bench

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
    p.add_argument("--config", default=None, help="run config (.toml) whose settings the flags override")
    p.add_argument("--recipe", default=None, metavar="NAME|FILE",
                   help="a training run config: collect for its tasks, under its [eval], into the SFT set and database "
                        "its stages read, with its [collect] table (flags and --config override)")
    add_flags(p, *COLLECT_TABLES)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("train", help="train a model: sft, rft (rejection sampling) or grpo (contrastive RL), on TRL",
                       usage="kernelrl train {sft,rft,grpo} --config NAME|FILE [--resume] [--print-config] "
                             "[--dry-run] [--SETTING VALUE ...]",
                       epilog="every setting of the config is a flag, e.g. --grpo.trl max_steps=4 --model.path PATH; "
                              "`kernelrl train grpo -h` lists them")
    p.add_argument("stage", choices=("sft", "rft", "grpo"),
                   help="sft: supervised on the SFT set; rft: rejection sampling; grpo: contrastive RL")
    # The stage's flags are parsed by `train_parser`, so that `kernelrl train grpo -h` lists them.
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="...", help="--config NAME and the rest, as in the usage")
    p.set_defaults(func=cmd_train, runtime=False)

    p = sub.add_parser("reward", help="why was this paid that: completions scored as GRPO training scores them "
                                      "(verdict, copy, raw reward, clip, what is paid)")
    p.add_argument("completions", nargs="+", metavar="COMPLETION",
                   help="answers (.md/.txt: a model's whole answer) or programs (.py)")
    p.add_argument("--db", required=True, help="the training run's database (its tasks, versions and verdicts)")
    p.add_argument("--task", default=None, help="the task (default: the shown versions' or the prompt row's)")
    p.add_argument("--shown", default=None, metavar="ID[,ID...]",
                   help="the candidate ids of the versions the prompt showed, comma-separated")
    p.add_argument("--prompt-row", type=int, default=None, metavar="ID",
                   help="a stored GRPO rollout: its prompt and the versions it showed")
    p.add_argument("--config", default=None, help="the training config (NAME or FILE) whose [reward], [eval] and "
                                                  "[grpo.copies] training used (default: the defaults)")
    p.add_argument("--state", default=None, metavar="FILE", help="a checkpoint's kernelrl_state.rank0.json: its clip "
                                                                 "windows (default: the run's stored raw rewards)")
    p.add_argument("--json", action="store_true", help="one JSON object per completion, in a list")
    p.set_defaults(func=cmd_reward)

    p = sub.add_parser("bench", help="evaluate a model or proposer on a suite: pass@k, fast_p@k, speedups")
    p.add_argument("--config", default=None, help="run config (.toml) whose settings the flags override")
    p.add_argument("--recipe", default=None, metavar="NAME|FILE",
                   help="a training run config: bench its tasks under its [eval], stored in its database, with its "
                        "[bench] table (flags and --config override)")
    add_flags(p, *BENCH_TABLES)
    p.add_argument("--plot", default=None, metavar="FILE.png", help="also draw pass@k, fast_p@k and the per-task "
                                                                   "best speedups into this PNG")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=cmd_bench)
