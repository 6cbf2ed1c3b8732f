"""Stage 0, the SFT set: several proposers try every task, the evaluator decides what to keep.

`collect(config)` asks each proposer (OpenAI-compatible endpoints, local HF models, replay files,
the heuristic) for every task, up to `tries` answers per task and proposer, and stops asking a
pair once it has `keep` correct answers. It works in rounds: one answer per open (task,
proposer) pair at a time, model calls on `model_concurrency` threads, then the round's answers
judged in one evaluator batch and stored in the code database. Prompts are the contrastive
prompts of the search (`kernelrl.episodes.prompt.build_prompt`), so later tries see earlier
attempts, their verdicts and refused hacks.

The accepted (correct) answers are the SFT set, written after every round as JSONL (`out`) and
at the end also as a `datasets.Dataset` (`kernelrl.train.sft_set`): task, prompt, answer,
verdict, speedup, proposer. With `first_prompt` (the default) every accepted answer is also a row
under the task's first-attempt prompt (`kernelrl.episodes.prompt.first_attempt_prompt`, what
`kernelrl bench` asks), judged once: a model trained on the set has seen every kept program, fast
and slow, after the prompt it is benched with, not only after the prompt that happened to ask it.
With `keep` above 1 a pair goes on asking after its first correct answer, so the set holds several
programs per task.

Proposer specs are `make_proposer` specs, optionally followed by `key=value` options separated by
spaces (`kernelrl.proposers.spec`, the syntax every command takes):
`"openai:qwen-coder base_url=http://127.0.0.1:8000/v1 temperature=0.8"`. An API key is never
written in a spec: `api_key_env=NAME` names the environment variable holding it.

Guarantees: resumable by construction: the database records every try, a re-run counts the
tries and accepted answers each pair already has and asks only for the rest, and the SFT set is
rewritten from the database; a proposer that keeps failing (3 times in a row, or unavailable)
ends its pairs with the reason recorded, never the whole collection.

Does not train: the SFT stage reads the set.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.judge.eval_config import EvalConfig
from kernelrl.proposers.spec import ProposerSpec
from kernelrl.result import Status
from kernelrl.store.records import RunMeta, RunStage
from kernelrl.tasks.task import Task
from kernelrl.train.rollouts import (
    EvalSettings,
    Rollout,
    evaluate_rollouts,
    store_rollouts,
    task_profiles,
)
from kernelrl.train.sft_set import SFTRow, dataset_dir, write_sft_set
from kernelrl.web.config import WatchConfig

if TYPE_CHECKING:
    from rich.console import Console

    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.judge.harness.profile import TaskProfile
    from kernelrl.proposers import Proposal, Proposer
    from kernelrl.store import Database
    from kernelrl.store.records import CandidateRecord

MAX_FAILURES = 3
STAGE = RunStage.COLLECT
DEFAULT_DB = "code.db"


@dataclass(frozen=True, kw_only=True)
class CollectConfig:
    tasks: tuple[str, ...]
    proposers: tuple[str, ...]  # proposer specs with options (see the module docstring)
    out: Path  # the SFT set as JSONL; the Dataset goes next to it (<name>.dataset/)
    tries: int = 20  # answers per task and proposer, at most
    keep: int = 1  # correct answers per task and proposer after which it stops asking
    first_prompt: bool = True  # each accepted answer also a row under the first-attempt prompt (bench's)
    # each accepted answer also a row under a prompt showing each other accepted program of its task,
    # one at a time: the contrastive prompts GRPO asks, seen with every program the set holds
    shown_prompts: bool = False
    db_path: Path | None = None  # None: code.db next to `out`, the database training reads by default
    splits: tuple[str, ...] = ("train",)  # which split's tasks to collect for (never test: kernelrl.tasks.splits)
    k_shown: int = 4
    model_concurrency: int = 4
    seed: int = 0
    template_dir: Path | None = None
    proposer_opts: dict[str, Any] = field(default_factory=dict)  # applied to every proposer under its own
    eval: EvalConfig = field(default_factory=EvalConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)  # the run page served while the run goes: watch.port

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        if self.db_path is not None:
            object.__setattr__(self, "db_path", Path(self.db_path))
        if not self.tasks:
            raise ValueError("no tasks given")
        if not self.proposers:
            raise ValueError("no proposer given")
        specs = [ProposerSpec.parse(p) for p in self.proposers]
        labels = [s.label for s in specs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"the same proposer is given twice: {labels}")
        if self.tries < 1 or self.keep < 1 or self.model_concurrency < 1:
            raise ValueError("tries, keep and model_concurrency must be >= 1")

    @property
    def database(self) -> Path:
        """`code.db` next to the SFT set: with `--out <output_dir>/sft.jsonl` (a training config's
        `sft_data`), the very database its rft and grpo stages read (`<output_dir>/code.db`)."""
        return self.db_path if self.db_path is not None else self.out.with_name(DEFAULT_DB)


@dataclass(frozen=True, kw_only=True)
class PairSummary:
    task: str
    proposer: str
    tries: int  # answers stored, over every run of this collection
    accepted: int
    stopped: str  # "kept enough", "tries used", or why the proposer was given up


@dataclass(frozen=True, kw_only=True)
class CollectSummary:
    out: Path
    dataset: Path
    db_path: Path
    rows: int  # rows in the SFT set
    pairs: tuple[PairSummary, ...]
    asked: int  # model calls made by this invocation
    evaluated: int
    errors: tuple[str, ...] = ()


@dataclass
class _Pair:
    task: Task
    spec: ProposerSpec
    tries: int = 0
    accepted: int = 0
    failures: int = 0
    stopped: str = ""


def collect(config: CollectConfig, *, console: Console | None = None, backend: ProfilingJudge | None = None,
            proposers: Mapping[str, Proposer] | None = None, tasks: Sequence[Task] | None = None) -> CollectSummary:
    """Run (or continue) a collection; see the module docstring. `backend` and `proposers` (by
    label) replace the configured evaluator and proposers (tests)."""
    from kernelrl.config import to_dict
    from kernelrl.run_parts import build_run
    from kernelrl.tasks.splits import for_training
    from kernelrl.tasks.suites import load_tasks

    tasks = list(tasks) if tasks is not None else load_tasks(list(config.tasks))
    tasks, left_out = for_training(tasks, config.splits)  # collected answers are training data
    if left_out and console is not None:
        console.print("collect: left out by their split: " + "; ".join(
            f"{s.value} {', '.join(names)}" for s, names in left_out.items()), soft_wrap=True)
    specs = [ProposerSpec.parse(p) for p in config.proposers]
    settings = EvalSettings.of(config.eval)
    made: dict[str, Proposer] = {}
    errors: list[str] = []
    asked = evaluated = 0
    with build_run(tasks=tasks, eval_config=config.eval, db_path=config.database, judge=backend,
                   proposers=proposers, console=console, watch=config.watch,
                   record={"stage": STAGE, "config": {**to_dict(config), "proposer_opts": sorted(
                       config.proposer_opts)}}) as run:
        db, run_id = run.db, run.run_id
        assert db is not None and run_id is not None  # a path was given
        pairs = _pairs(db, tasks, specs, config)
        # nothing left to ask (a finished collection resumed): no judge, no proposer starts
        backend = run.judge if any(not p.stopped for p in pairs) else None
        for s in specs:
            if any(p.spec.label == s.label and not p.stopped for p in pairs):
                made[s.label] = run.proposer(s.spec, label=s.label, **_options(s, config))
        profiles = task_profiles(backend, tasks) if backend is not None else {}
        if (config.first_prompt or config.shown_prompts) and not profiles:
            # a finished collection resumed: the prompts state the shapes only a judge reads
            profiles = task_profiles(run.judge, tasks)
        pairing = Pairing(tasks=tasks, profiles=profiles, settings=settings, config=config, db=db)
        round_no = 0
        while True:
            open_pairs = [p for p in pairs if not p.stopped]
            if not open_pairs:
                break
            round_no += 1
            answers = _ask(open_pairs, made, db, config, settings, errors, profiles)
            asked += len(open_pairs)
            rollouts = [(p, r) for p, r in answers if r is not None]
            if rollouts:
                assert backend is not None  # built when any pair was open
                judged = evaluate_rollouts(backend, [r for _, r in rollouts], {t.name: t for t in tasks}, db=db,
                                           reuse=settings)
                evaluated += sum(1 for j in judged if j.judged_here)
                for (p, _), j in zip(rollouts, judged):
                    store_rollouts(db, [j], proposer=p.spec.label, step=p.tries, run_id=run_id,
                                   settings=settings, meta=[RunMeta(stage=STAGE)])
                    p.tries += 1
                    p.accepted += j.status is Status.CORRECT
            for p in open_pairs:
                if not p.stopped:
                    p.stopped = _stop_reason(p, config)
            run.say(f"collect round {round_no}: {len(rollouts)} answers, "
                    f"{sum(p.accepted for p in pairs)} accepted so far")
            write_sft_set(config.out, sft_rows(db, pairing), dataset=False)
        rows = sft_rows(db, pairing)
    write_sft_set(config.out, rows, dataset=True)
    return CollectSummary(out=config.out, dataset=dataset_dir(config.out), db_path=config.database, rows=len(rows),
                          pairs=tuple(PairSummary(task=p.task.name, proposer=p.spec.label, tries=p.tries,
                                                  accepted=p.accepted, stopped=p.stopped) for p in pairs),
                          asked=asked, evaluated=evaluated, errors=tuple(errors))


def sft_rows(db: Database, pairing: Pairing | None = None) -> list[SFTRow]:
    """Every accepted answer `collect` stored in the database, oldest first, under the prompt it was
    asked with and (with `pairing`) the prompts `Pairing.prompts` adds, once per (task, prompt, answer)."""
    accepted = [rec for rec in db.candidates() if rec.meta.stage is STAGE and rec.is_correct]
    by_task: dict[str, list[CandidateRecord]] = {}
    for rec in accepted:
        by_task.setdefault(rec.task, []).append(rec)
    rows = []
    seen: set[tuple[str, str, str]] = set()
    for rec in accepted:
        assert rec.status is not None  # a correct record has its verdict
        more = pairing.prompts(rec, by_task[rec.task]) if pairing is not None else []
        for prompt in dict.fromkeys([rec.prompt, *more]):
            if (rec.task, prompt, rec.answer) in seen:
                continue
            seen.add((rec.task, prompt, rec.answer))
            rows.append(SFTRow(task=rec.task, prompt=prompt, answer=rec.answer, verdict=rec.status.value,
                               speedup=rec.speedup, proposer=rec.proposer, candidate_id=rec.id))
    return rows


@dataclass(frozen=True, kw_only=True)
class Pairing:
    """The prompts an accepted answer is paired with besides the one that asked it: the task's
    first-attempt prompt (`first_prompt`) and one prompt showing each other accepted program of the
    task (`shown_prompts`), built as the search and GRPO build theirs."""

    tasks: Sequence[Task]
    profiles: Mapping[str, TaskProfile | None]
    settings: EvalSettings
    config: CollectConfig
    db: Database

    def prompts(self, rec: CandidateRecord, accepted: Sequence[CandidateRecord]) -> list[str]:
        from kernelrl.episodes.prompt import compose_prompt, first_attempt_prompt

        task = next((t for t in self.tasks if t.name == rec.task), None)
        if task is None:
            return []
        common = {"policy": self.settings.policy, "device": self.settings.device, "size": self.settings.size,
                  "profile": self.profiles.get(task.name), "template_dir": self.config.template_dir}
        out = [first_attempt_prompt(task, **common)] if self.config.first_prompt else []  # type: ignore[arg-type]
        if self.config.shown_prompts:
            # the program shown as the one to improve, as GRPO's stream shows a version it drew
            out += [compose_prompt(task, db=self.db, chain_best=other, rng=random.Random(0), k=1, shown=[other],
                                   **common).text  # type: ignore[arg-type]
                    for other in accepted if other.id != rec.id and other.source != rec.source]
        return out


def _pairs(db: Database, tasks: Sequence[Task], specs: Sequence[ProposerSpec], config: CollectConfig) -> list[_Pair]:
    counts: dict[tuple[str, str], list[int]] = {}
    for rec in db.candidates():
        if rec.meta.stage is not STAGE or rec.result is None:
            continue
        c = counts.setdefault((rec.task, rec.proposer), [0, 0])
        c[0] += 1
        c[1] += rec.is_correct
    pairs = []
    for s in specs:
        for t in tasks:
            tries, accepted = counts.get((t.name, s.label), [0, 0])
            p = _Pair(task=t, spec=s, tries=tries, accepted=accepted)
            p.stopped = _stop_reason(p, config)
            pairs.append(p)
    return pairs


def _stop_reason(p: _Pair, config: CollectConfig) -> str:
    if p.stopped:
        return p.stopped
    if p.accepted >= config.keep:
        return "kept enough"
    if p.tries >= config.tries:
        return "tries used"
    return ""


def _options(spec: ProposerSpec, config: CollectConfig) -> dict[str, object]:
    """The proposer's options: the collection's, then the spec's own."""
    opts = {**config.proposer_opts, **spec.options()}
    if not spec.spec.startswith("openai"):
        # endpoint options given for every proposer apply to the OpenAI-compatible ones only
        for key in ("base_url", "temperature", "max_tokens"):
            if key not in spec.opts:
                opts.pop(key, None)
    return opts


def _ask(pairs: Sequence[_Pair], proposers: Mapping[str, Proposer], db: Database, config: CollectConfig,
         settings: EvalSettings, errors: list[str], profiles: Mapping[str, TaskProfile | None]
         ) -> list[tuple[_Pair, Rollout | None]]:
    from kernelrl.episodes.prompt import build_prompt
    from kernelrl.proposers import (
        Exhausted,
        ProposalRequest,
        ProposerUnavailable,
    )

    requests = []
    for p in pairs:
        best = db.top_candidates(p.task.name, 1)
        # k_shown = 0: no earlier version shown, not even the best (the first-attempt prompt)
        prompt = build_prompt(p.task, db=db, chain_best=best[0] if best and config.k_shown else None,
                              policy=settings.policy,
                              device=settings.device, size=settings.size, k=config.k_shown,
                              rng=random.Random(f"{config.seed}:{p.task.name}:{p.spec.label}:{p.tries}"),
                              profile=profiles.get(p.task.name), template_dir=config.template_dir)
        requests.append((p, prompt, best[0].id if best else None))

    def one(item: tuple[_Pair, str, int | None]) -> Proposal | Exception:
        p, prompt, _ = item
        try:
            return proposers[p.spec.label].propose(ProposalRequest(task=p.task, prompt=prompt, step=p.tries))
        except Exception as e:  # noqa: BLE001 - a proposer's failure ends its pair, not the collection
            return e

    with ThreadPoolExecutor(max_workers=min(config.model_concurrency, len(requests))) as ex:
        outs = list(ex.map(one, requests))
    answers: list[tuple[_Pair, Rollout | None]] = []
    for (p, prompt, parent), out in zip(requests, outs):
        if isinstance(out, Exhausted):
            p.stopped = "proposer exhausted"
            answers.append((p, None))
            continue
        if isinstance(out, Exception):
            p.failures += 1
            errors.append(f"{p.task.name} / {p.spec.label}: {type(out).__name__}: {out}")
            if p.failures >= MAX_FAILURES or isinstance(out, ProposerUnavailable):
                p.stopped = f"proposer failed {p.failures} times: {type(out).__name__}"
            answers.append((p, None))
            continue
        p.failures = 0
        answers.append((p, Rollout(task=p.task.name, prompt=prompt, answer=out.answer,
                                   prompt_tokens=int(out.prompt_tokens), completion_tokens=int(out.completion_tokens),
                                   parents=(parent,) if parent is not None else ())))
    return answers
