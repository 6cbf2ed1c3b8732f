"""Stage 2, rejection-sampling fine-tuning (CUDA-L1's self-supervised stage), K rounds.

Each round: the current model answers every task `samples_per_task` times (the task's
contrastive prompt from the code database, as in GRPO); the answers are judged and stored in
the database (proposer `rft:round-R`); answers that are executable and correct are kept (speed
does not matter in this stage, unless `min_speedup` is set); the model is fine-tuned
(`kernelrl.train.sft.finetune`, TRL's `SFTTrainer`) on everything kept so far (plus the SFT set
when `include_sft_set`), and the next round samples from the result.

Sampling goes through `kernelrl.train.sampling`: vLLM when it is installed on a CUDA machine
(colocated, or a `trl vllm-serve` server), transformers' `generate` otherwise. With several
processes (accelerate), the main process plans the round (what is missing, one prompt per task)
and broadcasts the plan; each rank samples, judges and stores its own share of the samples
(`sampling.share`: disjoint, together the whole round); after a barrier the main process reads
the round back from the database and every rank fine-tunes on the same rows.

Guarantees: a finished round is not run again (its folder holds `final/` and `round.json`); a
round interrupted after sampling reuses its stored samples from the database instead of asking
the model again; no sample of a round is drawn twice, whatever the number of processes; a round
that keeps nothing (and has nothing earlier to train on) leaves the model as it was and says so.

Does not judge (the backend does) or choose the fine-tuning recipe (TRL's `SFTTrainer` with
`[rft.trl]`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from kernelrl.result import Status
from kernelrl.store.records import RunMeta, RunStage
from kernelrl.tasks.task import Task
from kernelrl.train.model import (
    ModelConfig,
    as_prompt,
    is_model_folder,
    load_tokenizer,
    system_text,
)
from kernelrl.train.ranks import Ranks, SingleProcess
from kernelrl.train.rollouts import (
    EvalSettings,
    Judged,
    Rollout,
    evaluate_rollouts,
    store_rollouts,
    task_profiles,
)
from kernelrl.train.sampling import SamplingConfig, open_sampler, share
from kernelrl.train.sft import finetune
from kernelrl.train.sft_set import SFTRow, unique_rows
from kernelrl.train.stage import StageOutcome
from kernelrl.train.trl_args import check_keys, trl_class

if TYPE_CHECKING:

    from kernelrl.jsontypes import JSONValue
    from kernelrl.judge.harness.profile import TaskProfile
    from kernelrl.run_parts import RunParts
    from kernelrl.store import Database

ROUND_FILE = "round.json"


@dataclass(frozen=True, kw_only=True)
class RFTStageConfig:
    init_from: str = "auto"  # "auto": the sft stage's final model, else the base model
    rounds: int = 2
    samples_per_task: int = 4
    max_new_tokens: int = 2048
    temperature: float = 0.8
    batch_size: int = 4  # prompts generated at once (hf engine)
    include_sft_set: bool = True  # the SFT set's rows join every round's training data
    min_speedup: float | None = None  # None: correct is enough (CUDA-L1's stage 2)
    k_shown: int = 4  # earlier versions shown in each prompt
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # vLLM or generate (kernelrl.train.sampling)
    trl: dict[str, Any] = field(default_factory=dict)  # TRL SFTConfig settings for each round's fine-tune

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.samples_per_task < 1 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("rft: rounds, samples_per_task, max_new_tokens and batch_size must be >= 1")
        if self.temperature < 0:
            raise ValueError("rft.temperature must be >= 0")
        if self.min_speedup is not None and self.min_speedup <= 0:
            raise ValueError("rft.min_speedup must be positive or unset")
        check_keys(trl_class("SFTConfig"), self.trl, where="rft.trl")


@dataclass(frozen=True, kw_only=True)
class RoundResult:
    round: int
    source: str  # the model that sampled
    sampled: int
    reused_samples: int  # samples taken from the database (an interrupted round)
    correct: int
    kept_rows: int  # rows trained on this round (all rounds' kept rows, plus the SFT set)
    statuses: dict[str, int]
    outcome: StageOutcome | None  # None: nothing to train on, the model is unchanged
    final: str  # the model the next round samples from


def round_dir(stage_folder: Path, r: int) -> Path:
    return Path(stage_folder) / f"round-{r}"


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One prompt of a round and how many answers it still needs (the main process's plan)."""

    task: str
    prompt: str  # the text kernelrl wrote (stored with each answer)
    parents: tuple[int, ...]
    count: int


def train_rft(stage: RFTStageConfig, *, run: RunParts, model: ModelConfig, init_from: str, output_dir: Path,
              eval_settings: EvalSettings, sft_rows: Sequence[SFTRow] = (), seed: int = 0,
              template_dir: Path | None = None, ranks: Ranks | None = None) -> list[RoundResult]:
    """Run (or continue) the rounds on the run's tasks, judged by its judge, stored in its database
    under its row, told on its console (`run`: `kernelrl.run_parts.build_run`'s parts); the results
    in order. `output_dir` is the stage's folder.

    No resume flag: finished rounds are skipped, an interrupted round reuses its stored samples
    and continues its fine-tune from its last checkpoint."""
    ranks = ranks or SingleProcess()
    tasks, backend, db, run_id = run.tasks, run.judge, run.db, run.run_id
    if db is None:
        raise ValueError("rejection sampling stores its samples: the run needs a database")
    output_dir = Path(output_dir)
    by_name = {t.name: t for t in tasks}
    profiles = task_profiles(backend, tasks) if ranks.is_main else {}
    current = init_from
    kept: list[SFTRow] = []
    results: list[RoundResult] = []
    for r in range(1, stage.rounds + 1):
        folder = round_dir(output_dir, r)
        label = f"rft:round-{r}"
        done = ranks.broadcast(_read_round(folder) if ranks.is_main else None)
        plan: list[Planned] = []
        if done is None:
            planned = ranks.broadcast(_plan(stage, tasks, by_name, db, eval_settings, label, seed=seed + r,
                                            template_dir=template_dir, profiles=profiles) if ranks.is_main else None)
            plan = planned or []
            if plan:
                if ranks.is_main:
                    run.say(f"rft round {r}: sampling {sum(p.count for p in plan)} answers from {current} "
                            f"on {ranks.count} process(es)")
                fresh = sample_share(stage, model, current, plan, ranks, seed=seed + r)
                judged = evaluate_rollouts(backend, fresh, by_name, db=db, reuse=eval_settings)
                store_rollouts(db, judged, proposer=label, step=r, run_id=run_id, settings=eval_settings,
                               meta=[RunMeta(stage=RunStage.RFT, round=r, rank=ranks.index)] * len(judged))
            ranks.barrier()  # every rank's samples are stored before the round is read back
        stored = ranks.broadcast(_stored_samples(db, label, by_name, stage.samples_per_task)
                                 if ranks.is_main else None)
        assert stored is not None  # read by the main process
        rollouts = stored[0]
        reused = len(rollouts) - (sum(p.count for p in plan) if done is None else 0)
        correct = [j for j in rollouts if j.status is Status.CORRECT and
                   (stage.min_speedup is None or ((j.result and j.result.speedup) or 0) >= stage.min_speedup)]
        kept = unique_rows([*kept, *(_row(j, label) for j in correct)])
        rows = unique_rows([*(sft_rows if stage.include_sft_set else ()), *kept])
        statuses: dict[str, int] = {}
        for j in rollouts:
            key = (j.status or Status.NO_CODE).value
            statuses[key] = statuses.get(key, 0) + 1
        outcome = None
        if done is not None:
            final = done["final"]
        elif rows:
            run.say(f"rft round {r}: {len(correct)} of {len(rollouts)} samples correct; fine-tuning on "
                    f"{len(rows)} rows")
            # An interrupted round's fine-tune continues from its checkpoint: rounds resume by themselves.
            outcome = finetune(rows, source=current, model=model, trl=stage.trl, output_dir=folder,
                               resume=_has_checkpoint(folder), where="rft.trl")
            final = str(outcome.final_dir)
        else:
            run.say(f"rft round {r}: no correct sample and nothing earlier to train on; model unchanged")
            final = current
        if done is None and ranks.is_main:
            _write_round(folder, final=final, correct=len(correct), sampled=len(rollouts))
        ranks.barrier()
        results.append(RoundResult(round=r, source=current, sampled=len(rollouts), reused_samples=reused,
                                   correct=len(correct), kept_rows=len(rows), statuses=statuses, outcome=outcome,
                                   final=final))
        current = final
    return results


def sample_share(stage: RFTStageConfig, model_cfg: ModelConfig, source: str, plan: Sequence[Planned], ranks: Ranks,
                 *, seed: int) -> list[Rollout]:
    """This rank's share of a round's plan, sampled: sample k of the round goes to rank k mod count."""
    items = [(i, k) for i, p in enumerate(plan) for k in range(p.count)]
    mine: dict[int, int] = {}
    for i, _ in share(items, ranks):
        mine[i] = mine.get(i, 0) + 1
    sampler = open_sampler(stage.sampling, source=source, model=model_cfg, ranks=ranks, seed=seed)
    try:
        if not mine:
            return []
        tokenizer = load_tokenizer(source, model_cfg)
        system = system_text(model_cfg)
        order = sorted(mine)
        samples = sampler.sample([as_prompt(tokenizer, plan[i].prompt, system) for i in order],
                                 [mine[i] for i in order], max_new_tokens=stage.max_new_tokens,
                                 temperature=stage.temperature)
    finally:
        sampler.close()
    return [Rollout(task=plan[i].task, prompt=plan[i].prompt, answer=s.text, prompt_tokens=s.prompt_tokens,
                    completion_tokens=s.completion_tokens, parents=plan[i].parents)
            for i, per in zip(order, samples) for s in per]


def _has_checkpoint(folder: Path) -> bool:
    return folder.is_dir() and any(p.name.startswith("checkpoint-") for p in folder.iterdir())


class RoundFile(TypedDict):
    """A finished round's ROUND_FILE (`_write_round`)."""

    final: str  # the round's model folder
    correct: int
    sampled: int
    finished: float  # time.time() when it was written


def _read_round(folder: Path) -> RoundFile | None:
    try:
        done: RoundFile = json.loads((folder / ROUND_FILE).read_text())
    except (OSError, ValueError):
        return None
    final = done.get("final")
    if not isinstance(final, str) or (Path(final).exists() and not is_model_folder(final)):
        return None
    return done


def _write_round(folder: Path, **values: JSONValue) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (ROUND_FILE + ".tmp")
    tmp.write_text(json.dumps({**values, "finished": time.time()}, indent=1))
    tmp.replace(folder / ROUND_FILE)


def _stored_samples(db: Database, label: str, tasks: Mapping[str, Task], per_task: int) -> tuple[list[Judged], int]:
    """A round's samples already in the database (an interrupted round), at most `per_task` per task."""
    out: list[Judged] = []
    count: dict[str, int] = {}
    for rec in db.candidates():
        if rec.proposer != label or rec.task not in tasks or rec.result is None:
            continue
        if count.get(rec.task, 0) >= per_task:
            continue
        count[rec.task] = count.get(rec.task, 0) + 1
        no_code = not rec.source
        out.append(Judged(rollout=Rollout(task=rec.task, prompt=rec.prompt, answer=rec.answer,
                                          prompt_tokens=rec.prompt_tokens, completion_tokens=rec.completion_tokens,
                                          parents=rec.parents),
                          code=None if no_code else rec.source, result=None if no_code else rec.result,
                          candidate_id=rec.id))
    return out, len(out)


def _missing(tasks: Sequence[Task], have: Sequence[Judged], per_task: int) -> dict[str, int]:
    count: dict[str, int] = {}
    for j in have:
        count[j.rollout.task] = count.get(j.rollout.task, 0) + 1
    return {t.name: per_task - count.get(t.name, 0) for t in tasks if count.get(t.name, 0) < per_task}


def _plan(stage: RFTStageConfig, tasks: Sequence[Task], by_name: Mapping[str, Task], db: Database, settings: EvalSettings,
          label: str, *, seed: int, template_dir: Path | None, profiles: Mapping[str, TaskProfile | None]) -> list[Planned]:
    """What the round still needs: one prompt per task with samples missing (the main process)."""
    from kernelrl.episodes.prompt import build_prompt

    have, _ = _stored_samples(db, label, by_name, stage.samples_per_task)
    out = []
    for name, count in _missing(tasks, have, stage.samples_per_task).items():
        best = db.top_candidates(name, 1)
        text = build_prompt(by_name[name], db=db, chain_best=best[0] if best else None, policy=settings.policy,
                            device=settings.device, rng=random.Random(f"{seed}:{name}"), k=stage.k_shown,
                            size=settings.size, profile=profiles.get(name), template_dir=template_dir)
        out.append(Planned(task=name, prompt=text, parents=(best[0].id,) if best else (), count=count))
    return out


def _row(j: Judged, label: str) -> SFTRow:
    r = j.result
    return SFTRow(task=j.rollout.task, prompt=j.rollout.prompt, answer=j.rollout.answer,
                  verdict=r.status.value if r else Status.NO_CODE.value, speedup=r.speedup if r else None, proposer=label,
                  candidate_id=j.candidate_id)
