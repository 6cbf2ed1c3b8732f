"""How a stage is launched, and the dry run that checks a launch could start, on any machine.

`launch_command(config, stage, name)` is the command line that starts a stage as the run
config's `[launch]` says (`kernelrl.train.launch_config.LaunchConfig`).

`dry_run(config, stage)` checks everything a launch needs that can be checked here, without
loading a model, starting a process or judging anything:

- the run config itself (already parsed and validated when it was loaded) and the TRL table of
  the stage, built into TRL's own config object (on a machine without CUDA with `bf16`/`fp16`
  off and `use_cpu` on, which only a GPU machine accepts otherwise);
- every file and folder it names: the tasks (loaded, split: training refuses test tasks), the
  model (a folder holding a model, a tiny model this config builds, or a hub id: fetched on the
  training machine), `init_from`, the SFT set (the sft stage needs it), the prompt templates,
  the reward server's token file, the database's folder, the accelerate config file (parsed:
  its process count, DeepSpeed's ZeRO stage and 16-bit save) and a DeepSpeed JSON named in the
  TRL table;
- GRPO's batch arithmetic at the launch's process count: a generation batch
  (`per_device_train_batch_size` x processes x `steps_per_generation`) must hold whole groups of
  `num_generations`;
- the optimizer steps each stage will take and a warmup that ends before them: RFT's per round,
  from the rows a round can keep over the suite's training tasks (`kernelrl.train.sizing`);
- GRPO's token budget: the prompt budget, a multi-turn episode's history and the completion
  within the context the policy generates in (a vLLM server's `--max-model-len`:
  `grpo.context_tokens`);
- the checkpoints' size times how many are kept at once against the free disk where they go
  (an error on the machine that trains, a note elsewhere);
- the packages the launch will import (TRL, accelerate, and where the config asks for them
  vLLM, DeepSpeed, flash-attn): missing ones are listed as needed on the training machine
  (`pip install 'kernelrl[gpu]'`), not as errors, so a GPU config passes on a CPU machine.

Guarantees: `DryRun.ok` is False exactly when a check found an error; every check says what it
looked at.

Does not download, check that a hub id exists, or reserve GPUs.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.config import ConfigError
from kernelrl.tasks.splits import for_training, split_of
from kernelrl.tasks.suites import load_tasks
from kernelrl.tasks.task import TaskError
from kernelrl.train.grpo import DEFAULTS, FORCED
from kernelrl.train.model import is_model_folder
from kernelrl.train.recipe import judge_notice
from kernelrl.train.sizing import (
    checkpoint_bytes,
    free_bytes,
    generation_context,
    gigabytes,
    optimizer_steps,
    rft_rounds,
    rows_for_steps,
    warmup_steps,
)
from kernelrl.train.stage import AUTO, Stage
from kernelrl.train.trl_args import build_args, trl_class

if TYPE_CHECKING:
    from kernelrl.train.grpo import GRPOStageConfig
    from kernelrl.train.launch_config import LaunchConfig
    from kernelrl.train.recipe import TrainConfig
    from kernelrl.train.rft import RFTStageConfig
    from kernelrl.train.sft import SFTStageConfig

CPU_ONLY = {"bf16": False, "fp16": False, "use_cpu": True}  # what a machine without CUDA accepts


def launch_command(config: TrainConfig, stage: Stage, name: str, settings: Sequence[str] = ()) -> str:
    """The command line that starts `stage` of the run config `name` as the config says, with the
    command-line `settings` (flags and their values) the config was given on top."""
    launch: LaunchConfig = config.launch
    n = launch.processes(stage)
    tail = " ".join([f"-m kernelrl train {Stage(stage).value} --config {shlex.quote(name)}",
                     *map(shlex.quote, settings)])
    if launch.accelerate_config is None:
        return f"python3 {tail}"
    env = f"CUDA_VISIBLE_DEVICES={launch.grpo_visible_devices} " if (
        stage is Stage.GRPO and launch.grpo_visible_devices) else ""
    return (f"{env}accelerate launch --config_file {shlex.quote(_shown(launch.accelerate_file()))} "
            f"--num_processes {n} {tail}")


def _shown(path: Path | None) -> str:
    """A path as a command line in the current folder names it (relative when it is below it)."""
    absolute = Path(path or "").resolve()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class CheckLevel(enum.StrEnum):
    OK = "ok"
    NOTE = "note"  # needed elsewhere (a hub id, a file made by an earlier stage), not checked here
    ERROR = "error"


@dataclass(frozen=True, kw_only=True)
class Check:
    what: str
    level: CheckLevel
    detail: str


@dataclass(frozen=True, kw_only=True)
class DryRun:
    stage: Stage
    command: str
    checks: tuple[Check, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(c.level != CheckLevel.ERROR for c in self.checks)


AddCheck = Callable[[str, CheckLevel, str], None]  # what was checked, its level, what was found


def dry_run(config: TrainConfig, stage: Stage, *, name: str, settings: Sequence[str] = ()) -> DryRun:
    stage = Stage(stage)
    checks: list[Check] = []

    def add(what: str, level: CheckLevel, detail: str) -> None:
        checks.append(Check(what=what, level=level, detail=detail))

    _check_tasks(config, add)
    _check_model(config, stage, add)
    _check_files(config, stage, add)
    processes = config.launch.processes(stage)
    accel = _check_accelerate(config, stage, processes, add)
    trl_values = _check_trl(config, stage, processes, add)
    _check_steps(config, stage, processes, add)
    if stage is Stage.GRPO:
        _check_context(config, add)
    _check_disk(config, stage, accel, add)
    _check_layout(config, stage, processes, add)
    if stage is not Stage.SFT:
        add("hack defences", CheckLevel.OK if config.eval.llm_judge.enabled else CheckLevel.NOTE, judge_notice(config))
    _check_packages(config, stage, accel, trl_values, add)
    _check_run_page(config, add)
    return DryRun(stage=stage, command=launch_command(config, stage, name, settings), checks=tuple(checks))


def _check_run_page(config: TrainConfig, add: AddCheck) -> None:
    """`watch.port`: free on this machine now (the main process binds it when the stage starts)."""
    port, host = config.watch.port, config.watch.host
    if port is None:
        return
    from kernelrl.web.app import bind  # how the page will listen

    try:
        bind(host, port).close()
    except OSError as e:
        add("watch.port", CheckLevel.ERROR, f"{host}:{port}: cannot listen there ({e.strerror or e})")
        return
    add("watch.port", CheckLevel.OK, f"{host}:{port}: free here now; the main process serves the run page there"
        + (" (0: any free port, printed when it starts)" if port == 0 else ""))


def _stage_config(config: TrainConfig, stage: Stage) -> SFTStageConfig | RFTStageConfig | GRPOStageConfig:
    """The config table of `stage` (each has its own `init_from` and `trl`)."""
    tables: dict[Stage, SFTStageConfig | RFTStageConfig | GRPOStageConfig] = {
        Stage.SFT: config.sft, Stage.RFT: config.rft, Stage.GRPO: config.grpo}
    return tables[stage]


def _check_tasks(config: TrainConfig, add: AddCheck) -> None:
    try:
        tasks, left = for_training(load_tasks(list(config.tasks)), config.splits)
    except TaskError as e:
        add("tasks", CheckLevel.ERROR, str(e))
        return
    kinds: dict[str, int] = {}
    for t in tasks:
        kinds[split_of(t).value] = kinds.get(split_of(t).value, 0) + 1
    gone = ", ".join(f"{len(v)} {k.value}" for k, v in left.items())
    add("tasks", CheckLevel.OK, f"{len(tasks)} to train on ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})"
        + (f"; left out by their split: {gone}" if gone else ""))


def _is_local(text: str) -> bool:
    return text.startswith((".", "/", "~")) or Path(text).exists() or text.count("/") != 1


def _check_model(config: TrainConfig, stage: Stage, add: AddCheck) -> None:
    path = config.model.path
    if is_model_folder(path):
        add("model.path", CheckLevel.OK, f"{path}: a model folder")
    elif config.model.tiny is not None:
        add("model.path", CheckLevel.OK, f"{path}: the tiny model is built there on first use")
    elif _is_local(path):
        add("model.path", CheckLevel.ERROR, f"{path}: no model there (no config.json) and not a hub id")
    else:
        add("model.path", CheckLevel.NOTE, f"{path}: a hub id, fetched on the training machine (not checked offline)")
    init = _stage_config(config, stage).init_from
    if init != AUTO:
        if is_model_folder(init):
            add("init_from", CheckLevel.OK, f"{init}: a model folder")
        elif _is_local(init):
            add("init_from", CheckLevel.ERROR, f"{init}: no model there")
        else:
            add("init_from", CheckLevel.NOTE, f"{init}: a hub id (not checked offline)")


def _check_files(config: TrainConfig, stage: Stage, add: AddCheck) -> None:
    data = config.sft_data
    if stage is Stage.SFT:
        add("sft.data", CheckLevel.OK if data.is_file() else CheckLevel.ERROR,
            f"{data}: {'present' if data.is_file() else 'missing: run `kernelrl collect --out ' + str(data) + '` first'}")
    elif stage is Stage.RFT and config.rft.include_sft_set:
        add("sft.data", CheckLevel.OK if data.is_file() else CheckLevel.NOTE,
            f"{data}: {'present' if data.is_file() else 'absent: rounds train on their own samples only'}")
    if config.template_dir is not None:
        there = Path(config.template_dir).is_dir()
        add("template_dir", CheckLevel.OK if there else CheckLevel.ERROR,
            f"{config.template_dir}: {'a folder' if there else 'missing'}")
    token = config.backend.token_file
    if config.backend.url and stage is not Stage.SFT:
        if token is None:
            add("backend.token_file", CheckLevel.NOTE, f"unset: {config.backend.url} is asked without a token")
        else:
            readable = Path(token).is_file()
            add("backend.token_file", CheckLevel.OK if readable else CheckLevel.ERROR,
                f"{token}: {'present' if readable else 'missing'}")
    folder = Path(config.database).parent
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    writable = existing is not None and existing.is_dir()
    add("database", CheckLevel.OK if writable else CheckLevel.ERROR, f"{config.database}: "
        + ("its folder exists or can be made" if writable else "its folder cannot be made"))


def _check_accelerate(config: TrainConfig, stage: Stage, processes: int, add: AddCheck) -> Mapping[str, object]:
    path = config.launch.accelerate_file()
    if path is None:
        add("launch", CheckLevel.OK, "one process, no accelerate config")
        return {}
    if not path.is_file():
        add("launch.accelerate_config", CheckLevel.ERROR, f"{path}: missing")
        return {}
    import yaml

    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        add("launch.accelerate_config", CheckLevel.ERROR, f"{path}: not YAML ({e})")
        return {}
    if not isinstance(values, dict) or "distributed_type" not in values:
        add("launch.accelerate_config", CheckLevel.ERROR, f"{path}: not an accelerate config (no distributed_type)")
        return {}
    detail = f"{path}: {values['distributed_type']}, {processes} process(es) for {stage.value}"
    level = CheckLevel.OK
    ds = values.get("deepspeed_config") or {}
    if values["distributed_type"] == "DEEPSPEED":
        detail += f", ZeRO stage {ds.get('zero_stage')}"
        if ds.get("zero_stage") == 3 and not ds.get("zero3_save_16bit_model"):
            level, detail = CheckLevel.ERROR, detail + ": zero3_save_16bit_model is off, so final/ would hold shards only"
    add("launch.accelerate_config", level, detail)
    return values


def _check_trl(config: TrainConfig, stage: Stage, processes: int, add: AddCheck) -> dict[str, bool]:
    table = _stage_config(config, stage).trl
    values = dict(table)
    name = "GRPOConfig" if stage is Stage.GRPO else "SFTConfig"
    import torch

    overrides = {} if torch.cuda.is_available() else CPU_ONLY
    if stage is Stage.GRPO:
        values = {**DEFAULTS, **values}
    deepspeed_file = values.get("deepspeed")
    if isinstance(deepspeed_file, str):
        there = Path(deepspeed_file).is_file()
        add(f"{stage.value}.trl.deepspeed", CheckLevel.OK if there else CheckLevel.ERROR,
            f"{deepspeed_file}: {'present' if there else 'missing'}")
        if there:
            try:
                json.loads(Path(deepspeed_file).read_text())
            except ValueError as e:
                add(f"{stage.value}.trl.deepspeed", CheckLevel.ERROR, f"{deepspeed_file}: not JSON ({e})")
        values.pop("deepspeed")
    asks = {"use_vllm": bool(values.get("use_vllm"))}
    cls = trl_class(name)
    if stage is Stage.GRPO:
        values = _check_grpo_batch(cls, values, processes, add)
    try:
        build_args(cls, {**values, **overrides}, output_dir=Path(config.output_dir) / stage.value,
                   where=f"{stage.value}.trl", forced=FORCED if stage is Stage.GRPO else None)
    except ConfigError as e:
        add(f"{stage.value}.trl", CheckLevel.ERROR, str(e))
        return asks
    checked = "checked as on a CPU: bf16/fp16 off, use_cpu on" if overrides else "checked as on this GPU machine"
    add(f"{stage.value}.trl", CheckLevel.OK, f"TRL's {name} accepts the table ({checked})")
    return asks


def _check_grpo_batch(cls: type, values: dict[str, Any], processes: int, add: AddCheck) -> dict[str, Any]:
    """A generation batch at the launch's process count holds whole groups. TRL checks the same
    when it starts, with the processes it then has; here its config is given the batch size the
    launch will have instead of this machine's one process."""
    defaults: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(cls) if f.init}
    per_device = int(values.get("per_device_train_batch_size", defaults["per_device_train_batch_size"]))
    steps = int(values.get("steps_per_generation") or values.get("gradient_accumulation_steps")
                or defaults["gradient_accumulation_steps"])
    n = int(values.get("num_generations") or defaults["num_generations"])
    batch = int(values.get("generation_batch_size") or per_device * processes * steps)
    whole = batch % n == 0
    add("grpo batch", CheckLevel.OK if whole else CheckLevel.ERROR,
        f"{per_device} per device x {processes} processes x {steps} steps per generation = {batch} rollouts = "
        f"{batch / n:g} groups of {n}" + ("" if whole else ": not whole groups"))
    if not whole:
        return values
    return {**{k: v for k, v in values.items() if k != "steps_per_generation"}, "generation_batch_size": batch}


def gpu_layout(config: TrainConfig, stage: Stage, processes: int) -> tuple[str, int, int]:
    """Where a stage's GPUs go (training, generation, judging), in words, and how many GPUs it
    uses on the training node and elsewhere."""
    launch = config.launch
    cuda = str(config.eval.device).startswith("cuda")
    if stage is Stage.GRPO and launch.grpo_visible_devices:
        train = [d.strip() for d in launch.grpo_visible_devices.split(",") if d.strip()]
    else:
        train = [str(i) for i in range(processes)]
    parts = [f"training on {len(train)} GPU(s) ({','.join(train)})"]
    node = len(train)
    trl = _stage_config(config, stage).trl
    if stage is Stage.GRPO and trl.get("use_vllm") and trl.get("vllm_mode") == "server":
        rest = [str(i) for i in range(launch.node_gpus or 0) if str(i) not in train]
        parts.append(f"generation on the vLLM server's GPU ({rest[0] if rest else 'one more GPU'})")
        node += 1
    elif stage is not Stage.SFT:
        parts.append("generation on the training GPUs")
    elsewhere = 0
    if stage is not Stage.SFT:
        if config.backend.url:
            elsewhere = launch.judge_gpus
            parts.append(f"judging on the reward server's {launch.judge_gpus or 'unstated (launch.judge_gpus)'} "
                         "GPU(s), on its own machine")
        elif cuda:
            parts.append(f"judging in this process on {config.eval.device} (shared with training)")
        else:
            parts.append("judging on this machine's CPU")
    return "; ".join(parts), node, elsewhere


def _check_layout(config: TrainConfig, stage: Stage, processes: int, add: AddCheck) -> None:
    words, node, elsewhere = gpu_layout(config, stage, processes)
    limit = config.launch.node_gpus
    over = limit is not None and node > limit
    here = f"{node} GPU(s) on the training node" + (f" (it has {limit})" if limit else "")
    total = here + (f" + {elsewhere} on the judging machine = {node + elsewhere}" if elsewhere else "")
    add("gpu layout", CheckLevel.ERROR if over else CheckLevel.OK,
        f"{words}: {total}" + (": more than the node has" if over else ""))


def _check_steps(config: TrainConfig, stage: Stage, processes: int, add: AddCheck) -> None:
    """The stage's optimizer steps, and a warmup that ends before they do."""
    if stage is Stage.GRPO:
        trl = config.grpo.trl
        steps, where = int(trl["max_steps"]), "max_steps"
    elif stage is Stage.SFT:
        from kernelrl.train.sft_set import read_sft_set

        trl = config.sft.trl
        data = Path(config.sft.data or Path(config.output_dir) / "sft.jsonl")
        if int(trl.get("max_steps", -1) or -1) > 0:
            steps, where = int(trl["max_steps"]), "max_steps"
        elif data.is_file():
            rows = len(read_sft_set(data))
            steps, where = optimizer_steps(trl, examples=rows, processes=processes), f"{rows} rows of {data}"
        else:
            add("sft steps", CheckLevel.NOTE, f"{data} is not there yet: its rows decide the optimizer steps "
                                     f"(warmup {trl.get('warmup_steps', trl.get('warmup_ratio', 0))} must end first)")
            return
    else:
        _check_rft_steps(config, processes, add)
        return
    warm = warmup_steps(trl, steps)
    detail = f"{steps} optimizer steps ({where}) on {processes} process(es); warmup {warm}"
    add(f"{stage.value} steps", CheckLevel.ERROR if steps and warm >= steps else CheckLevel.OK,
        detail + (": the warmup outlasts the run, the learning rate never reaches its value"
                  if steps and warm >= steps else ""))


def _check_rft_steps(config: TrainConfig, processes: int, add: AddCheck) -> None:
    """Each round's optimizer steps from the rows it can keep: the SFT set (when it joins) and every
    sample of the rounds so far (`kernelrl.train.sizing.rft_rounds`), over the suite's training tasks."""
    from kernelrl.train.sft_set import read_sft_set

    try:
        tasks = len(for_training(load_tasks(list(config.tasks)), config.splits)[0])
    except TaskError:
        return  # the tasks check says why
    data = config.sft_data
    sft_rows = len(read_sft_set(data)) if config.rft.include_sft_set and data.is_file() else 0
    trl = config.rft.trl
    rounds = rft_rounds(config, tasks=tasks, sft_rows=sft_rows, processes=processes)
    shown = "; ".join(f"round {r.round}: at most {r.rows} rows -> {r.steps} steps, warmup {r.warmup}" for r in rounds)
    first = rounds[0]
    sft_note = f"{sft_rows} SFT rows + " if sft_rows else ""
    detail = (f"{config.rft.samples_per_task} samples x {tasks} training tasks a round, each round trained on "
              f"{sft_note}every sample kept so far (correct ones only: at most these), on {processes} process(es): "
              f"{shown}")
    if first.steps and first.warmup >= first.steps:
        add("rft steps", CheckLevel.ERROR, detail + ": round 1's warmup outlasts its fine-tune even if every sample "
            "is kept; lower rft.trl warmup_steps (or give it as a ratio, below 1)")
        return
    fixed = trl.get("warmup_steps")
    if fixed is not None and float(fixed) >= 1 and int(trl.get("max_steps", -1) or -1) <= 0:
        need = rows_for_steps(trl, int(fixed), processes=processes)
        detail += (f"; a round that keeps fewer than {need} rows ends inside its warmup of {int(fixed)} steps "
                   "(a ratio below 1 scales with the round)")
    add("rft steps", CheckLevel.OK, detail)


def _check_context(config: TrainConfig, add: AddCheck) -> None:
    """A GRPO prompt (with a multi-turn episode's history) and its completion fit the context the
    policy generates in."""
    grpo = config.grpo
    context, where = generation_context(config)
    completion = int(grpo.trl.get("max_completion_length", 256))
    turns = grpo.episode.turns
    if grpo.max_prompt_tokens is None:
        add("grpo context", CheckLevel.NOTE, f"grpo.max_prompt_tokens is unset: prompts are not held to a budget "
            f"(context {context if context else 'unknown'}, {where})")
        return
    need = grpo.max_prompt_tokens + (grpo.episode.history_tokens if turns > 1 else 0) + completion
    parts = (f"prompt {grpo.max_prompt_tokens}" + (f" + history {grpo.episode.history_tokens} ({turns} turns)"
                                                   if turns > 1 else "") + f" + completion {completion} = {need}")
    if context is None:
        add("grpo context", CheckLevel.NOTE, f"{parts} tokens; the generation context is {where}")
    elif need > context:
        add("grpo context", CheckLevel.ERROR, f"{parts} tokens, over the {context} the policy generates in ({where}); "
            "lower grpo.max_prompt_tokens, grpo.episode.history_tokens or grpo.trl.max_completion_length")
    else:
        add("grpo context", CheckLevel.OK, f"{parts} tokens, within {context} ({where})")


def _check_disk(config: TrainConfig, stage: Stage, accel: Mapping[str, object], add: AddCheck) -> None:
    """The stage's checkpoints against the free space where they go, on this machine."""
    import torch

    trl = _stage_config(config, stage).trl
    deepspeed = accel.get("distributed_type") == "DEEPSPEED" or bool(trl.get("deepspeed"))
    if config.model.tiny is not None and not is_model_folder(config.model.path):
        add("checkpoints", CheckLevel.OK, "a tiny model built here: its checkpoints take megabytes")
        return
    size = checkpoint_bytes(config, stage, trl, deepspeed=deepspeed)
    if isinstance(size, str):
        add("checkpoints", CheckLevel.NOTE, f"not sized: {size}")
        return
    folder = Path(config.output_dir) / stage.value
    free, measured = free_bytes(folder)
    # Where the stage would train: this machine has its device (or the stage runs on the CPU).
    here = torch.cuda.is_available() or bool(trl.get("use_cpu"))
    detail = (f"{size.kept} checkpoint(s) at once (save_total_limit + 1) x {gigabytes(size.each)} = "
              f"{gigabytes(size.total)} ({size.how}); {gigabytes(free)} free at {measured}")
    if size.total <= free:
        add("checkpoints", CheckLevel.OK, detail)
    elif here:
        add("checkpoints", CheckLevel.ERROR, detail + ": not enough; lower "
            f"{stage.value}.trl save_total_limit, or set output_dir on a larger disk")
    else:
        add("checkpoints", CheckLevel.NOTE, detail + ": not enough here, which is not where the stage trains; "
            "run the dry run on the training machine")


def _check_packages(config: TrainConfig, stage: Stage, accel: Mapping[str, object], trl_values: Mapping[str, bool],
                    add: AddCheck) -> None:
    wanted = {"trl": "training", "accelerate": "training"}
    if accel.get("distributed_type") == "DEEPSPEED":
        wanted["deepspeed"] = "the accelerate config's DeepSpeed"
    if config.model.attn_implementation == "flash_attention_2":
        wanted["flash_attn"] = "model.attn_implementation = flash_attention_2"
    if trl_values.get("use_vllm") or (stage is Stage.RFT and config.rft.sampling.engine.value == "vllm"):
        wanted["vllm"] = "sampling through vLLM"
    for module, why in wanted.items():
        there = importlib.util.find_spec(module) is not None
        where = "installed" if there else "not installed here; on the training machine: pip install 'kernelrl[gpu]'"
        add(f"package {module}", CheckLevel.OK if there else CheckLevel.NOTE, f"{why}: {where}")
