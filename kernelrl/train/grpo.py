"""Stage 3, contrastive RL: a thin wrapper over TRL's `GRPOTrainer`.

What kernelrl adds around TRL, and nothing else:
- the prompts: `kernelrl.train.stream.PromptStream`, rebuilt from the code database as the
  trainer reads them (the task's earlier codes with their measured speedups, refused hacks, the
  protocol: analysis first, then code), tasks chosen by `kernelrl.train.curriculum`;
- the reward: `kernelrl.train.reward_fn.KernelRewardFunction` (the evaluator's verdicts through
  `kernelrl.reward.RewardModel`, CUDA-L1's clip, GRPO-RoC selection, every code and verdict
  written back to the database);
- kernelrl's state in each checkpoint, one file per rank (`kernelrl_state.rank<R>.json`: the
  reward's clip windows, the curriculum, GRPO-RoC's generator, measured compile baselines, the
  prompt stream's count), restored on resume with TRL's own checkpoint, each rank its own;
- rank consistency under accelerate (`kernelrl.train.ranks`): the main process builds every
  prompt and broadcasts it, every rank applies every group's rewards in one order, and every
  completion is checked against the task its prompt came from (`kernelrl.train.reward_fn`).

The trainer is TRL's with one change (`kernelrl.train.trainer.KernelGRPOTrainer`): the rows that
train on nothing (no reward, or dropped by GRPO-RoC) leave the batch before the loss, so they
cost no forward or backward pass and do not count in the loss's normaliser.

The single-turn path is `GRPOTrainer(..., reward_funcs=[reward_fn], train_dataset=stream)`:
TRL generates one answer per row and the reward function judges it. With `grpo.episode.turns`
> 1, TRL's `rollout_func` runs refinement episodes (`kernelrl.train.multiturn`): each turn is
shown the previous answers and their verdicts, judged through `KernelRewardFunction.score_rollouts`,
and returned as a sample of its own paid its discounted return (`EpisodeReturn`, which checks
each row's task and key as the single-turn reward function does).

Everything else is TRL's, set in `[grpo.trl]` under TRL's names: `num_generations`, `beta`
(0: no KL term), `epsilon_high` (Clip-Higher), `loss_type`, `scale_rewards`,
`mask_truncated_completions`, `use_vllm` with `vllm_mode = "colocate"` or `"server"`,
`gradient_accumulation_steps`, `save_steps`, `max_steps` (required: the prompt stream is
endless). Two settings are fixed because the stream needs them: `shuffle_dataset = false` and,
unless set, `ignore_data_skip = true` (see `kernelrl.train.stream`).

Guarantees: with `resume`, TRL continues from the stage's last checkpoint and every rank's
kernelrl state from the same checkpoint (`StageError` when there is none; a rank whose file is
missing, a run resumed on more processes than it was saved with, takes rank 0's and says so);
the final model is saved before the stage is marked done; the database is written batch by
batch, so an interrupted run keeps every judged rollout.

Does not evaluate: the backend (an `Evaluator`, the reward server's client) does.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.config import ConfigError
from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.reward import RewardModel
from kernelrl.run_parts import Reporter
from kernelrl.train.copies import CopyRule
from kernelrl.train.curriculum import Curriculum, CurriculumConfig
from kernelrl.train.model import (
    ModelConfig,
    as_prompt,
    has_chat_template,
    load_model,
    norm_probe,
    peft_config,
    save_final,
    system_text,
    trainable_norm,
)
from kernelrl.train.multiturn import EpisodeReturn, MultiTurnRollout, TurnCredit
from kernelrl.train.ranks import Ranks, SingleProcess
from kernelrl.train.reward_fn import KernelRewardFunction, RewardShaping
from kernelrl.train.roc import RoCConfig
from kernelrl.train.rollouts import EvalSettings, task_profiles
from kernelrl.train.stage import StageOutcome, checkpoint_to_resume
from kernelrl.train.step_log import step_log_callback
from kernelrl.train.stream import ContrastConfig, PromptContent, PromptForm, PromptStream
from kernelrl.train.trainer import ROW_MEAN_LOSSES, grpo_trainer_class
from kernelrl.train.trl_args import build_args, check_keys, trl_class

if TYPE_CHECKING:
    from transformers import TrainerCallback, TrainerControl, TrainerState

    from kernelrl.judge.harness.profile import TaskProfile
    from kernelrl.run_parts import RunParts

STATE_FILE = "kernelrl_state.rank{rank}.json"
LEGACY_STATE_FILE = "kernelrl_state.json"  # rank 0's state, in checkpoints of earlier versions
# The prompt stream is endless and built from the database: never shuffled, never replayed.
FORCED = {"shuffle_dataset": False}
DEFAULTS = {"ignore_data_skip": True}


@dataclass(frozen=True, kw_only=True)
class GRPOStageConfig:
    init_from: str = "auto"  # "auto": rft's final model, else sft's, else the base model
    k_shown: int = 4  # earlier versions of the task shown in each prompt
    contrast: ContrastConfig = field(default_factory=ContrastConfig)  # how they are drawn: the best, or by score
    roc: RoCConfig = field(default_factory=RoCConfig)
    # how close to a shown version an answer must be to be paid as its copy (kernelrl.train.copies)
    copies: CopyRule = field(default_factory=CopyRule)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    # turns > 1: refinement episodes, each turn a sample paid its discounted return (kernelrl.train.multiturn)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    # turns > 1: returns centred per turn index within each group ("turn"), or handed to TRL as
    # they are ("group": all turns normalised together, which teaches turn position; for comparison)
    credit: TurnCredit = TurnCredit.TURN
    # the most tokens a prompt may take (the policy's tokenizer, chat template applied): a prompt over
    # it shows fewer earlier versions; None: no limit (keep prompt + max_completion_length within the
    # model's context)
    max_prompt_tokens: int | None = None
    # the most tokens the policy generates in (prompt, history and completion): a vLLM server's
    # --max-model-len; None: grpo.trl.vllm_max_model_length, else the model's own (the dry run reads it)
    context_tokens: int | None = None
    trl: dict[str, Any] = field(default_factory=dict)  # TRL GRPOConfig settings, by TRL's names

    def __post_init__(self) -> None:
        object.__setattr__(self, "credit", TurnCredit(self.credit))
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError("grpo.max_prompt_tokens must be >= 1 or unset")
        if self.k_shown < 0:
            raise ValueError("grpo.k_shown must be >= 0")
        if self.context_tokens is not None and self.context_tokens < 1:
            raise ValueError("grpo.context_tokens must be >= 1 or unset")
        context = self.context_tokens or self.trl.get("vllm_max_model_length")
        if isinstance(context, int) and self.max_prompt_tokens is not None:
            history = self.episode.history_tokens if self.episode.turns > 1 else 0
            need = self.max_prompt_tokens + history + int(self.trl.get("max_completion_length", 256))
            if need > context:
                raise ValueError(f"grpo: a prompt ({self.max_prompt_tokens}"
                                 + (f" + history {history}" if history else "")
                                 + f" + completion {self.trl.get('max_completion_length', 256)} = {need} tokens) does "
                                 f"not fit the {context} the policy generates in; lower grpo.max_prompt_tokens"
                                 + (", grpo.episode.history_tokens" if history else "")
                                 + " or grpo.trl.max_completion_length")
        check_keys(trl_class("GRPOConfig"), self.trl, where="grpo.trl")
        steps = self.trl.get("max_steps")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError("grpo.trl.max_steps must be set (>= 1): the prompt stream has no end")
        if self.trl.get("shuffle_dataset"):
            raise ValueError("grpo.trl.shuffle_dataset must stay false: the curriculum orders the prompt stream")
        n = self.trl.get("num_generations", 8)
        turns = self.episode.turns
        if turns > 1 and self.roc.enabled:
            raise ValueError("grpo.roc must be disabled with grpo.episode.turns > 1: RoC drops samples, which would "
                             "cut a trajectory's discounted return short")
        if turns > 1 and isinstance(n, int) and n % turns:
            raise ValueError(f"grpo.trl.num_generations ({n}) must be a multiple of grpo.episode.turns ({turns}): "
                             "a group is cut into trajectories of that many turns")
        share = self.trl.get("per_device_train_batch_size", 8) * (
            self.trl.get("steps_per_generation") or self.trl.get("gradient_accumulation_steps") or 1)
        if turns > 1 and "generation_batch_size" not in self.trl and isinstance(share, int) and share % turns:
            raise ValueError(f"grpo.trl: each process generates {share} rows at a time "
                             f"(per_device_train_batch_size x steps_per_generation), not a multiple of "
                             f"grpo.episode.turns ({turns}): a trajectory would span two processes")
        loss = self.trl.get("loss_type", "dapo")
        if self.roc.enabled and loss in ROW_MEAN_LOSSES:
            raise ValueError(f"grpo.roc needs a token-normalised grpo.trl.loss_type (dapo, bnpo, cispo), not {loss!r}: "
                             "the rows RoC drops leave the batch, and a row-averaged loss would count the filler rows "
                             "that keep its micro-batches equal")
        if self.roc.enabled and isinstance(n, int) and round(n * self.roc.keep) < 2:
            raise ValueError(f"grpo.roc: num_generations {n} x keep {self.roc.keep} leaves fewer than 2 rollouts "
                             "per group; raise num_generations (RoC samples the oversampled group)")


@dataclass(frozen=True, kw_only=True)
class GRPOResult:
    outcome: StageOutcome
    checkpoint: str | None  # the checkpoint this invocation resumed from
    reward_calls: int
    rollouts: int
    evaluated: int  # candidates sent to the backend
    statuses: dict[str, int]
    clipped: int
    db_candidates: int  # candidates this invocation added to the code database


def state_file(checkpoint: Path, rank: int) -> Path:
    return Path(checkpoint) / STATE_FILE.format(rank=rank)


def state_callback(reward_fn: KernelRewardFunction, stream: PromptStream, rank: int) -> TrainerCallback:
    """A TrainerCallback writing this rank's kernelrl state next to TRL's in every checkpoint."""
    from transformers import TrainerCallback

    class KernelrlState(TrainerCallback):
        # args stays untyped: TrainingArguments types output_dir as optional, and Path() of it is what the
        # Trainer's own checkpoint code does (it is set by then).
        def on_save(self, args: Any, state: TrainerState, control: TrainerControl,
                    **kwargs: object) -> TrainerControl:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)  # as the Trainer does for each rank's RNG state
            path = state_file(folder, rank)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(_state_text(reward_fn, stream, rank))
            tmp.replace(path)
            return control

    return KernelrlState()


def load_rank_state(checkpoint: Path, rank: int, reward_fn: KernelRewardFunction, stream: PromptStream,
                    reporter: Reporter | None = None) -> Path | None:
    """Restore this rank's state from `checkpoint` (rank 0's when this rank has none, then the one
    file of a checkpoint written before states were kept per rank); the file used."""
    for path in (state_file(checkpoint, rank), state_file(checkpoint, 0), Path(checkpoint) / LEGACY_STATE_FILE):
        if path.is_file():
            text = path.read_text()
            saved = json.loads(text)
            reward_fn.load_state(saved)
            stream.load_state(saved.get("stream") or {})
            note = "" if path.name == state_file(checkpoint, rank).name else " (none saved for this rank)"
            # what is in memory now, written as it was saved: equal when the restore is faithful
            now = _state_text(reward_fn, stream, int(saved.get("rank", rank)))
            (reporter or Reporter.quiet()).console.print(
                f"rank {rank}: kernelrl state restored from {path}{note}; "
                f"{'identical to' if now == text else 'DIFFERS from'} the saved state "
                f"(sha256 {hashlib.sha256(now.encode()).hexdigest()[:12]})", highlight=False, soft_wrap=True)
            return path
    return None


def _state_text(reward_fn: KernelRewardFunction, stream: PromptStream, rank: int) -> str:
    return json.dumps({**reward_fn.state(), "stream": stream.state(), "rank": rank})


def _quiet_dropped_rollouts() -> None:
    """A rollout that trains on nothing gets no reward, by design (RoC dropped it, its verdict has
    no reward, a later turn of its episode has none); TRL warns about every such row with the
    row's whole prompt, at every step. Those warnings are dropped (the reward line of each batch
    counts the rows not trained on, and the step log says why: `kernelrl/excluded/<why>`)."""
    import logging

    class DroppedByRoC(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "All reward functions returned None" not in record.getMessage()

    target = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(type(f).__name__ == "DroppedByRoC" for f in target.filters):
        target.addFilter(DroppedByRoC())


def prompt_token_counter(tokenizer: Any, system: str) -> Callable[[str], int]:
    """Tokens of a prompt's text as the trainer will feed it: the chat template applied when the
    tokenizer has one (with the generation prompt), the plain text otherwise."""

    def count(text: str) -> int:
        prompt = as_prompt(tokenizer, text, system)
        if isinstance(prompt, str):
            return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        return len(ids)

    return count


def check_episode_layout(turns: int, generation_batch_size: int | None, processes: int) -> None:
    """Each process's share of a generation batch must hold whole trajectories (with num_generations
    a multiple of turns, a trajectory then never spans two processes)."""
    if generation_batch_size is None:
        return
    share = generation_batch_size // max(1, processes)
    if share % turns:
        raise ConfigError(f"grpo.episode.turns = {turns}: each process's {share} rows per generation batch "
                         f"(generation_batch_size {generation_batch_size} over {processes} process(es)) cannot be "
                         "cut into whole trajectories; make per_device_train_batch_size x steps_per_generation a "
                         "multiple of turns")


def train_grpo(stage: GRPOStageConfig, *, run: RunParts, model: ModelConfig, init_from: str, output_dir: Path,
               reward: RewardModel, eval_settings: EvalSettings | None, resume: bool = False, seed: int = 0,
               template_dir: Path | None = None, profiles: dict[str, TaskProfile | None] | None = None,
               ranks: Ranks | None = None) -> GRPOResult:
    """Train on the run's tasks, judged by its judge, stored in its database under its row, told
    on its console, its prompts stating its evaluator's policy, device and size (`run`:
    `kernelrl.run_parts.build_run`'s parts); `output_dir` is the stage's folder. `eval_settings`
    (None: do not reuse stored verdicts) say which database results stand for the judge's; `ranks`
    are the run's processes (one by default)."""
    from trl.trainer.grpo_config import GRPOConfig

    ranks = ranks or SingleProcess()
    tasks, backend, db, run_id = run.tasks, run.judge, run.db, run.run_id
    if db is None:
        raise ValueError("GRPO stores its rollouts and shows programs from them: the run needs a database")
    started = time.monotonic()
    output_dir = Path(output_dir)
    checkpoint = checkpoint_to_resume(output_dir, resume=resume)
    values = {**DEFAULTS, **stage.trl}
    args = build_args(GRPOConfig, values, output_dir=output_dir, where="grpo.trl", forced=FORCED)
    policy, tokenizer = load_model(init_from, model)
    system = system_text(model)
    curriculum = Curriculum(tasks, stage.curriculum, seed=seed)
    if profiles is None:  # only the main process builds prompts
        profiles = task_profiles(backend, tasks) if ranks.is_main else {}
    form = PromptForm(as_prompt=lambda text: as_prompt(tokenizer, text, system), chat=has_chat_template(tokenizer),
                      count_tokens=prompt_token_counter(tokenizer, system), max_tokens=stage.max_prompt_tokens)
    content = PromptContent(k=stage.k_shown, contrast=stage.contrast, profiles=profiles, template_dir=template_dir)
    stream = PromptStream(run, curriculum, form=form, content=content, seed=seed, ranks=ranks)
    shaping = RewardShaping(reward=reward, copy_rule=stage.copies, max_completion_tokens=args.max_completion_length,
                            roc=stage.roc, group_size=args.num_generations, seed=seed)
    reward_fn = KernelRewardFunction(run, shaping=shaping, curriculum=curriculum, reuse=eval_settings, ranks=ranks)
    if checkpoint is not None:
        load_rank_state(Path(checkpoint), ranks.index, reward_fn, stream, run.reporter)
    _quiet_dropped_rollouts()
    probe = norm_probe()
    turns: dict[str, Any] = {"reward_funcs": [reward_fn]}
    if stage.episode.turns > 1:
        # Refinement episodes: TRL's rollout hook runs the turns, every turn a sample of its own.
        check_episode_layout(stage.episode.turns, args.generation_batch_size, ranks.count)
        reward_fn.group_size = int(args.num_generations or 1) // stage.episode.turns  # trajectories per group
        rollout = MultiTurnRollout(reward_fn, stream, stage.episode, template_dir=template_dir, reporter=run.reporter,
                                   count_tokens=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]),
                                   credit=stage.credit)
        turns = {"reward_funcs": [EpisodeReturn(rollout)], "rollout_func": rollout}
    trainer = grpo_trainer_class()(model=policy, **turns, args=args, train_dataset=stream.dataset(),
                          processing_class=tokenizer, peft_config=peft_config(model),
                          callbacks=[state_callback(reward_fn, stream, ranks.index), probe,
                                     step_log_callback(db, run_id=run_id, curriculum=curriculum)])
    before = trainable_norm(trainer.model)
    db_before = db.count_candidates()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    before = probe.before if probe.before is not None else before
    after = trainable_norm(trainer.model)
    final = save_final(trainer, tokenizer, output_dir / "final", model)
    metrics = {k: float(v) for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    outcome = StageOutcome(final_dir=final, steps=int(trainer.state.global_step), train_loss=result.training_loss,
                           norm_before=before, norm_after=after, seconds=time.monotonic() - started, metrics=metrics)
    totals = reward_fn.totals
    return GRPOResult(outcome=outcome, checkpoint=checkpoint, reward_calls=totals.calls, rollouts=totals.rollouts,
                      evaluated=totals.evaluated, statuses=dict(totals.statuses), clipped=totals.clipped,
                      db_candidates=db.count_candidates() - db_before)
