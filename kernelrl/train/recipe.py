"""The training recipe: one run config for collect -> sft -> rft -> grpo, and running one stage.

`TrainConfig` holds what the stages share (tasks, output folder, code database, the base model
and LoRA, the evaluator or reward server, the reward mapping) and one table per stage
(`[sft]`, `[rft]`, `[grpo]`, each with TRL's options under `[<stage>.trl]`). Named configs live in
`kernelrl/configs/train/` (`kernelrl train grpo --config tiny-cpu`); `load_train_config` reads
one (or a file) with dotted overrides on top (`{"grpo.trl": {"max_steps": 4}}`, which
`kernelrl train`'s flags give, merged into the file's TRL table).

`run_stage(config, stage)` loads the tasks, opens the database (a run row per stage
invocation), builds the tiny base model when the config asks for one and none is there, picks
the stage's starting model (`kernelrl.train.stage.resolve_init`), runs the stage and marks it
done. The evaluator is built here and closed at the end; a reward server is used through its
client instead when `backend.url` is set.

Guarantees: a bad key or value in a run config is a `ConfigError` naming it, before any model
is loaded; the database run is marked finished, interrupted (Ctrl-C) or failed, and everything
judged before an interruption stays in it.

Does not define any training algorithm: the stage modules wrap TRL.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Required, TypedDict

from kernelrl.backends.judges import BackendConfig
from kernelrl.config import CONFIG_DIR, build, load_toml, to_dict, with_overrides
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.reward import RewardConfig
from kernelrl.tasks.splits import Split, for_training, split_of, split_of_name
from kernelrl.train.grpo import GRPOResult, GRPOStageConfig
from kernelrl.train.launch_config import LaunchConfig
from kernelrl.train.model import ModelConfig
from kernelrl.train.rft import RFTStageConfig, RoundResult
from kernelrl.train.sft import SFTStageConfig
from kernelrl.train.stage import Init, Stage, StageOutcome
from kernelrl.web.config import WatchConfig

if TYPE_CHECKING:
    from rich.console import Console

    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.run_parts import RunParts
    from kernelrl.train.ranks import Ranks
    from kernelrl.train.rollouts import EvalSettings

TRAIN_CONFIG_DIR = CONFIG_DIR / "train"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    tasks: tuple[str, ...]  # suites, task names, files or folders (kernelrl.tasks.suites.load_tasks)
    splits: tuple[str, ...] = ("train",)  # which split's tasks train (kernelrl.tasks.splits); never test
    output_dir: Path  # stage folders go under it: <output_dir>/sft, /rft, /grpo
    model: ModelConfig
    db_path: Path | None = None  # the code database; None: <output_dir>/code.db
    seed: int = 0
    template_dir: Path | None = None  # prompt templates overriding the built-in ones
    eval: EvalConfig = field(default_factory=EvalConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)  # processes per stage, the accelerate config
    sft: SFTStageConfig = field(default_factory=SFTStageConfig)
    rft: RFTStageConfig = field(default_factory=RFTStageConfig)
    grpo: GRPOStageConfig = field(default_factory=lambda: GRPOStageConfig(trl={"max_steps": 100}))
    watch: WatchConfig = field(default_factory=WatchConfig)  # the run page served while the run goes: watch.port
    # `kernelrl collect --recipe NAME` and `kernelrl bench --recipe NAME`: the run's tasks, seed,
    # templates, [eval], database and SFT set, and these tables (each command's own settings, by
    # CollectConfig's and BenchConfig's names), so the whole recipe is judged under one [eval]
    collect: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)  # `kernelrl bench --recipe`'s own settings (BenchConfig's names)

    def __post_init__(self) -> None:
        _check_command_table("collect", self.collect)
        _check_command_table("bench", self.bench)
        specs = (self.tasks,) if isinstance(self.tasks, str) else self.tasks
        object.__setattr__(self, "tasks", tuple(s.strip() for v in specs for s in v.split(",") if s.strip()))
        if not self.tasks:
            raise ValueError("no tasks given")
        object.__setattr__(self, "splits", tuple(Split(s) for s in self.splits))
        if Split.TEST in self.splits:
            raise ValueError("splits: training refuses test tasks (the test split is for `kernelrl bench`)")
        object.__setattr__(self, "output_dir", Path(self.output_dir))
        for name in ("db_path", "template_dir"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))

    @property
    def database(self) -> Path:
        return self.db_path if self.db_path is not None else self.output_dir / "code.db"

    @property
    def sft_data(self) -> Path:
        return self.sft.data if self.sft.data is not None else self.output_dir / "sft.jsonl"


# What a recipe's run decides for `collect` and `bench` (`recipe_values`): not settable in their tables.
_RUN_OWNED = frozenset({"tasks", "splits", "seed", "template_dir", "eval", "watch", "db_path", "out"})


def _check_command_table(command: str, table: Mapping[str, Any]) -> None:
    import dataclasses

    from kernelrl.train.bench import BenchConfig
    from kernelrl.train.collect import CollectConfig

    cls = CollectConfig if command == "collect" else BenchConfig
    known = {f.name for f in dataclasses.fields(cls)} - _RUN_OWNED
    for key in table:
        if key in _RUN_OWNED:
            raise ValueError(f"[{command}] {key}: the run config sets it for every stage (its top level or [eval])")
        if key not in known:
            raise ValueError(f"[{command}] {key}: unknown setting (known: {', '.join(sorted(known))})")


def recipe_values(config: TrainConfig, command: str) -> dict[str, object]:
    """The settings `kernelrl collect --recipe` / `kernelrl bench --recipe` start from: the run's
    tasks, seed, templates, [eval], run page, database (and for collect the splits and the SFT set
    the sft stage reads), then the run config's [collect] or [bench] table; flags go on top."""
    if command not in ("collect", "bench"):
        raise ValueError(f"no recipe settings for {command!r}")
    values: dict[str, object] = {"tasks": list(config.tasks), "seed": config.seed, "eval": to_dict(config.eval),
                                 "watch": to_dict(config.watch), "db_path": str(config.database)}
    if config.template_dir is not None:
        values["template_dir"] = str(config.template_dir)
    if command == "collect":
        values.update(splits=[str(s) for s in config.splits], out=str(config.sft_data))
    return {**values, **(config.collect if command == "collect" else config.bench)}


def load_train_config(name_or_path: str | Path, overrides: Mapping[str, object] | None = None) -> TrainConfig:
    """A named config from kernelrl/configs/train/ (or a .toml file), with dotted overrides."""
    values = with_overrides(load_toml(name_or_path, TRAIN_CONFIG_DIR), overrides or {})
    return build(TrainConfig, values)


@dataclass(frozen=True, kw_only=True)
class StageReport:
    stage: Stage
    init: Init
    final_dir: Path
    db_path: Path
    run_id: int
    seconds: float
    outcome: StageOutcome | None = None  # sft, and grpo's fine-tuning pass
    rounds: tuple[RoundResult, ...] = ()  # rft
    grpo: GRPOResult | None = None
    rows: int = 0  # sft: rows trained on


def run_stage(config: TrainConfig, stage: Stage, *, resume: bool = False, console: Console | None = None,
              backend: ProfilingJudge | None = None) -> StageReport:
    """Run one stage (see the module docstring). `backend` replaces the configured one (tests)."""
    from kernelrl.run_parts import Reporter, build_run
    from kernelrl.tasks.suites import load_tasks
    from kernelrl.train.model import is_model_folder
    from kernelrl.train.ranks import current_ranks
    from kernelrl.train.rollouts import EvalSettings
    from kernelrl.train.stage import (
        checkpoint_to_resume,
        mark_done,
        resolve_init,
        stage_dir,
    )
    from kernelrl.train.tiny import build_tiny_model

    started = time.monotonic()
    say = (Reporter(console) if console is not None else Reporter.quiet()).say  # before the run is built
    stage = Stage(stage)
    stage_cfg: SFTStageConfig | RFTStageConfig | GRPOStageConfig = (
        config.sft if stage is Stage.SFT else config.rft if stage is Stage.RFT else config.grpo)
    ranks = current_ranks(cpu=True if stage_cfg.trl.get("use_cpu") else None)
    tasks, left_out = for_training(load_tasks(list(config.tasks)), config.splits)
    if left_out and ranks.is_main:
        say("left out by their split: " + "; ".join(f"{len(n)} {s.value} task(s)" for s, n in left_out.items()))
    folder = stage_dir(config.output_dir, stage)
    if stage is not Stage.RFT:
        checkpoint_to_resume(folder, resume=resume)  # refused before anything is opened or written
    if ranks.count != config.launch.processes(stage) and ranks.is_main:
        say(f"{stage.value} runs on {ranks.count} process(es); the config launches it on "
            f"{config.launch.processes(stage)} (`--dry-run` prints its launch command)")
    if config.model.tiny is not None and not is_model_folder(config.model.path):
        if ranks.is_main:
            say(f"building the tiny model of this config at {config.model.path}")
            build_tiny_model(config.model.path, tasks, config.model.tiny, corpus=_sft_text(config))
        ranks.barrier()
    init = resolve_init(stage, stage_cfg.init_from, output_dir=config.output_dir, base=config.model.path)
    say(f"{stage.value}: starting from {init.source} ({init.reason})")
    settings = EvalSettings.of(config.eval)
    # one run row per stage invocation, whatever the number of processes: the main one writes it
    # (its builder opens and closes it); the run page is served by the main process only (one port, one writer)
    record = {"stage": stage.value, "resume": resume, "processes": ranks.count, "config": to_dict(config),
              "splits": {t.name: split_of(t).value for t in tasks},
              "left_out": {s.value: names for s, names in left_out.items()}}
    with build_run(tasks=tasks, eval_config=config.eval, db_path=config.database, backend=config.backend,
                   register_tasks=ranks.is_main, judge=backend, console=console,
                   watch=config.watch if ranks.is_main else None, record=record if ranks.is_main else None) as run:
        run_id = ranks.broadcast(run.run_id)
        assert run_id is not None  # the main process opened it
        run.adopt_row(run_id)  # the other ranks store their share under the main one's row
        reuse: EvalSettings | None = settings
        if stage is not Stage.SFT:
            if ranks.is_main and backend is None:
                run.say(judge_notice(config))
            reuse = settings if run.reuse_stored else None
        if stage is Stage.SFT:
            report = _run_sft(config, init, folder, resume=resume)
        elif stage is Stage.RFT:
            report = _run_rft(config, init, folder, run, settings, ranks)
        else:
            report = _run_grpo(config, init, folder, run, reuse, resume, ranks)
        if ranks.is_main:
            mark_done(config.output_dir, stage, report["final_dir"], run_id=run_id)
    return StageReport(stage=stage, init=init, db_path=config.database, run_id=run_id,
                       seconds=time.monotonic() - started, **report)


class StageParts(TypedDict, total=False):
    """What a stage's runner adds to its `StageReport` (each stage its own fields)."""

    final_dir: Required[Path]
    outcome: StageOutcome  # sft, grpo
    rows: int  # sft
    rounds: tuple[RoundResult, ...]  # rft
    grpo: GRPOResult


def _sft_text(config: TrainConfig) -> list[str]:
    """The SFT set's prompts and answers (when `collect` wrote it): text the tiny model's tokenizer
    is trained on, so that the programs it learns to write are short in its tokens."""
    from kernelrl.train.sft_set import read_sft_set

    if not config.sft_data.is_file():
        return []
    return [text for row in read_sft_set(config.sft_data) for text in (row.prompt, row.answer)]


def _run_sft(config: TrainConfig, init: Init, folder: Path, *, resume: bool) -> StageParts:
    from kernelrl.train.sft import finetune, select_rows
    from kernelrl.train.sft_set import read_sft_set
    from kernelrl.train.stage import StageError

    allowed = {*config.splits, Split.UNSPLIT}
    rows = [r for r in select_rows(read_sft_set(config.sft_data), config.sft.min_speedup)
            if split_of_name(r.task) in allowed]  # training refuses test tasks, in the SFT set too
    if not rows:
        raise StageError(f"{config.sft_data}: no rows to train on (min_speedup {config.sft.min_speedup})")
    outcome = finetune(rows, source=init.source, model=config.model, trl=config.sft.trl, output_dir=folder,
                       resume=resume, where="sft.trl")
    return {"final_dir": outcome.final_dir, "outcome": outcome, "rows": len(rows)}


def _run_rft(config: TrainConfig, init: Init, folder: Path, run: RunParts, settings: EvalSettings,
             ranks: Ranks) -> StageParts:
    from kernelrl.train.rft import train_rft
    from kernelrl.train.sft_set import read_sft_set

    sft_rows = read_sft_set(config.sft_data) if config.rft.include_sft_set and config.sft_data.is_file() else []
    sft_rows = [r for r in sft_rows if split_of_name(r.task) in {*config.splits, Split.UNSPLIT}]
    rounds = train_rft(config.rft, run=run, model=config.model, init_from=init.source, output_dir=folder,
                       eval_settings=settings, sft_rows=sft_rows, seed=config.seed, template_dir=config.template_dir,
                       ranks=ranks)
    return {"final_dir": Path(rounds[-1].final), "rounds": tuple(rounds)}


def _run_grpo(config: TrainConfig, init: Init, folder: Path, run: RunParts, reuse: EvalSettings | None,
              resume: bool, ranks: Ranks) -> StageParts:
    from kernelrl.reward import RewardModel
    from kernelrl.train.grpo import train_grpo

    result = train_grpo(config.grpo, run=run, model=config.model, init_from=init.source, output_dir=folder,
                        reward=RewardModel(config.reward), eval_settings=reuse, resume=resume, seed=config.seed,
                        template_dir=config.template_dir, ranks=ranks)
    return {"final_dir": result.outcome.final_dir, "outcome": result.outcome, "grpo": result}


def judge_notice(config: TrainConfig) -> str:
    """What refuses hacks in this run, said at its start (training pays the lowest reward for
    every refusal; a run without the adversarial LLM judge relies on the static and dynamic
    defences alone)."""
    from kernelrl.checks import rules as R
    from kernelrl.checks.policy import STRICT, get_policy

    judge = config.eval.llm_judge
    where = f"the reward server at {config.backend.url}" if config.backend.url else "this process's evaluator"
    policy = f"policy {config.eval.policy}"
    # What `strict` refuses (its custom-kernel requirement aside) and this policy pays, said up front.
    paid = sorted(STRICT.reject - {R.NO_CUSTOM_KERNEL} - get_policy(config.eval.policy).reject)
    warned = f"; findings {policy} only warns on, and pays: {', '.join(paid)}" if paid else ""
    if judge.enabled and judge.model:
        return f"hacks: refused by {where} ({policy}) and the adversarial LLM judge {judge.model}{warned}"
    why = ("turned off by eval.llm_judge.enabled=false" if judge.model else
           "no endpoint configured: set eval.llm_judge.model and eval.llm_judge.base_url, and it is on")
    return (f"hacks: refused by {where} ({policy}); the adversarial LLM judge is OFF ({why}), so a hack "
            f"that only a reader would see is paid{warned}")
