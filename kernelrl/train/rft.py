"""Stage 2, rejection-sampling fine-tuning (CUDA-L1's self-supervised stage), K rounds.

Each round: the current model answers every task `samples_per_task` times (the task's
contrastive prompt from the code database, as in GRPO); the whole round is judged in one
evaluator batch and stored in the database (proposer `rft:round-R`); answers that are
executable and correct are kept (speed does not matter in this stage, unless `min_speedup` is
set); the model is fine-tuned (`kernelrl.train.sft.finetune`, TRL's `SFTTrainer`) on everything
kept so far (plus the SFT set when `include_sft_set`), and the next round samples from the
result.

Guarantees: a finished round is not run again (its folder holds `final/` and `round.json`); a
round interrupted after sampling reuses its stored samples from the database instead of asking
the model again; a round that keeps nothing (and has nothing earlier to train on) leaves the
model as it was and says so.

Does not sample with vLLM: generation is `transformers`' `generate` on the training device.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.result import Status
from kernelrl.tasks.task import Task
from kernelrl.train.model import (
    ModelConfig,
    as_prompt,
    is_model_folder,
    load_model,
    sample_answers,
    system_text,
)
from kernelrl.train.rollouts import (
    EvalSettings,
    Judged,
    Rollout,
    evaluate_rollouts,
    store_rollouts,
    task_profiles,
)
from kernelrl.train.sft import finetune
from kernelrl.train.sft_set import SFTRow, unique_rows
from kernelrl.train.stage import StageOutcome
from kernelrl.train.trl_args import check_keys, trl_class

ROUND_FILE = "round.json"


@dataclass(frozen=True, kw_only=True)
class RFTStageConfig:
    init_from: str = "auto"  # "auto": the sft stage's final model, else the base model
    rounds: int = 2
    samples_per_task: int = 4
    max_new_tokens: int = 2048
    temperature: float = 0.8
    batch_size: int = 4  # prompts generated at once
    include_sft_set: bool = True  # the SFT set's rows join every round's training data
    min_speedup: float | None = None  # None: correct is enough (CUDA-L1's stage 2)
    k_shown: int = 4  # earlier versions shown in each prompt
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


def train_rft(stage: RFTStageConfig, *, model: ModelConfig, init_from: str, tasks: Sequence[Task], backend: Any,
              db: Any, output_dir: Path, eval_settings: EvalSettings, sft_rows: Sequence[SFTRow] = (),
              seed: int = 0, console: Any = None, template_dir: Path | None = None,
              run_id: int | None = None) -> list[RoundResult]:
    """Run (or continue) the rounds; the results in order. `output_dir` is the stage's folder.

    No resume flag: finished rounds are skipped, an interrupted round reuses its stored samples
    and continues its fine-tune from its last checkpoint."""
    output_dir = Path(output_dir)
    by_name = {t.name: t for t in tasks}
    profiles = task_profiles(backend, tasks)
    current = init_from
    kept: list[SFTRow] = []
    results: list[RoundResult] = []
    for r in range(1, stage.rounds + 1):
        folder = round_dir(output_dir, r)
        label = f"rft:round-{r}"
        done = _read_round(folder)
        rollouts, reused = _stored_samples(db, label, by_name, stage.samples_per_task)
        if done is None:
            missing = _missing(tasks, rollouts, stage.samples_per_task)
            if missing:
                _say(console, f"rft round {r}: sampling {sum(missing.values())} answers from {current}")
                fresh = _sample(stage, model, current, missing, by_name, db, eval_settings, seed=seed + r,
                                template_dir=template_dir, profiles=profiles)
                judged = evaluate_rollouts(backend, fresh, by_name, db=db, reuse=eval_settings)
                store_rollouts(db, judged, proposer=label, step=r, run_id=run_id, settings=eval_settings,
                               meta=[{"stage": "rft", "round": r}] * len(judged))
                rollouts += judged
        correct = [j for j in rollouts if j.status is Status.CORRECT and
                   (stage.min_speedup is None or ((j.result and j.result.speedup) or 0) >= stage.min_speedup)]
        kept = unique_rows([*kept, *(_row(j, label) for j in correct)])
        rows = unique_rows([*(sft_rows if stage.include_sft_set else ()), *kept])
        statuses: dict[str, int] = {}
        for j in rollouts:
            key = j.status.value if j.status else "no_code"
            statuses[key] = statuses.get(key, 0) + 1
        outcome = None
        if done is not None:
            final = done["final"]
        elif rows:
            _say(console, f"rft round {r}: {len(correct)} of {len(rollouts)} samples correct; fine-tuning on "
                          f"{len(rows)} rows")
            # An interrupted round's fine-tune continues from its checkpoint: rounds resume by themselves.
            outcome = finetune(rows, source=current, model=model, trl=stage.trl, output_dir=folder,
                               resume=_has_checkpoint(folder), where="rft.trl")
            final = str(outcome.final_dir)
        else:
            _say(console, f"rft round {r}: no correct sample and nothing earlier to train on; model unchanged")
            final = current
        if done is None:
            _write_round(folder, final=final, correct=len(correct), sampled=len(rollouts))
        results.append(RoundResult(round=r, source=current, sampled=len(rollouts), reused_samples=reused,
                                   correct=len(correct), kept_rows=len(rows), statuses=statuses, outcome=outcome,
                                   final=final))
        current = final
    return results


def _say(console: Any, text: str) -> None:
    if console is not None:
        console.print(text)


def _has_checkpoint(folder: Path) -> bool:
    return folder.is_dir() and any(p.name.startswith("checkpoint-") for p in folder.iterdir())


def _read_round(folder: Path) -> dict[str, Any] | None:
    try:
        done = json.loads((folder / ROUND_FILE).read_text())
    except (OSError, ValueError):
        return None
    final = done.get("final")
    if not isinstance(final, str) or (Path(final).exists() and not is_model_folder(final)):
        return None
    return done


def _write_round(folder: Path, **values: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (ROUND_FILE + ".tmp")
    tmp.write_text(json.dumps({**values, "finished": time.time()}, indent=1))
    tmp.replace(folder / ROUND_FILE)


def _stored_samples(db: Any, label: str, tasks: Mapping[str, Task], per_task: int) -> tuple[list[Judged], int]:
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


def _sample(stage: RFTStageConfig, model_cfg: ModelConfig, source: str, missing: Mapping[str, int],
            tasks: Mapping[str, Task], db: Any, settings: EvalSettings, *, seed: int,
            template_dir: Path | None, profiles: Mapping[str, Any]) -> list[Rollout]:
    import torch

    from kernelrl.search.prompt import build_prompt

    policy, tokenizer = load_model(source, model_cfg)
    if torch.cuda.is_available():
        policy = policy.to("cuda")
    torch.manual_seed(seed)
    system = system_text(model_cfg)
    names = list(missing)
    texts, rollouts = [], []
    for name in names:
        best = db.top_candidates(name, 1)
        extra = {"template_dir": template_dir} if template_dir is not None else {}
        texts.append(build_prompt(tasks[name], db=db, chain_best=best[0] if best else None, policy=settings.policy,
                                  device=settings.device, rng=random.Random(f"{seed}:{name}"), k=stage.k_shown,
                                  size=settings.size, profile=profiles.get(name), **extra))
    # One generate call per prompt batch, `max(missing)` samples each; extra ones are dropped.
    n = max(missing.values())
    samples = sample_answers(policy, tokenizer, [as_prompt(tokenizer, t, system) for t in texts], n=n,
                             max_new_tokens=stage.max_new_tokens, temperature=stage.temperature,
                             batch_size=stage.batch_size)
    for name, text, per in zip(names, texts, samples):
        best = db.top_candidates(name, 1)
        for s in per[: missing[name]]:
            rollouts.append(Rollout(task=name, prompt=text, answer=s.text, prompt_tokens=s.prompt_tokens,
                                    completion_tokens=s.completion_tokens,
                                    parents=(best[0].id,) if best else ()))
    del policy
    return rollouts


def _row(j: Judged, label: str) -> SFTRow:
    r = j.result
    return SFTRow(task=j.rollout.task, prompt=j.rollout.prompt, answer=j.rollout.answer,
                  verdict=r.status.value if r else "no_code", speedup=r.speedup if r else None, proposer=label,
                  candidate_id=j.candidate_id)
