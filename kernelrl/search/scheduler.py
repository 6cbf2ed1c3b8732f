"""Scheduling: what the search asks the model next, and the loop that waits for what it started.

`Scheduler.drive` runs an opened run to its end. It first judges what an earlier invocation
stored but never judged (without asking the model again), starts each task's profile and
baseline (`kernelrl.search.judging`), then takes one event at a time from the workers (a model's
answer, a batch, a streamed result, a profile, a baseline), hands it to its handler on this
thread, and schedules: the waiting batch, when its moment has come, and, round-robin over the
tasks, one chain step per task per pass while slots and budgets allow. A step builds the chain's
contrastive prompt around its current best (in a multi-turn run, with its episode's history) and
asks the proposer; the answer is stored, then judged.

Guarantees:
- a chain has at most one step under way; a task takes at most `budget` candidates in this run,
  split evenly over its chains (the remainder to the first chains); no task starves the others
  of model slots;
- a task's first prompt waits for its profile and, when one is being measured, its baseline;
- once the token budget or the wall time runs out, or after a Ctrl-C, no new model call starts;
  the calls and evaluations under way finish and are stored;
- a Ctrl-C is a flag read between events, never an exception, so it cannot land in the middle
  of a write; a second one leaves at once (evaluations under way stay `proposed`, and a resume
  judges them);
- a task whose proposer fails `MAX_PROPOSER_FAILURES` times in a row, or says it is unavailable,
  is given up for this run; a finite proposer that has nothing more ends the task's chains.

Does not write to the database itself (`kernelrl.search.output` does) or judge anything.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING

from kernelrl.candidate import extract_code, source_hash
from kernelrl.judge.harness.device import DevicePeaks
from kernelrl.proposers import Exhausted, ProposalRequest, Proposer, ProposerUnavailable
from kernelrl.search.chains import Chain, TaskState
from kernelrl.search.judging import Judging, Key
from kernelrl.search.output import RunOutput
from kernelrl.search.state import RunState
from kernelrl.search.summary import StopReason
from kernelrl.search.workers import Workers
from kernelrl.store import Database
from kernelrl.store.records import CandidateRecord, NewCandidate, RunMeta

if TYPE_CHECKING:
    from kernelrl.proposers import Proposal

# A task whose proposer fails this many times in a row is given up for this run: the error is
# then not transient (bad model name, bad key), and retrying only burns the wall clock.
MAX_PROPOSER_FAILURES = 3
INTERRUPT_GRACE_S = 5.0  # seconds a Ctrl-C gives the work under way (see `Scheduler.drive`)
_POLL_S = 0.2

PromptFn = Callable[..., str]  # kernelrl.episodes.prompt.build_prompt's signature


class Scheduler:
    def __init__(self, run: RunState, out: RunOutput, judging: Judging, workers: Workers, db: Database, *,
                 proposer: Proposer, build_prompt: PromptFn, device: DevicePeaks | None = None) -> None:
        self.run = run
        self.config = run.config
        self.out = out
        self.judging = judging
        self.workers = workers
        self.db = db  # read for prompts and for what an earlier invocation left unjudged
        self.proposer = proposer
        self.build_prompt = build_prompt
        self.device = device  # what prompts say of the device, when known

    # ------------------------------------------------------------ what the status line reads
    @property
    def state(self) -> dict[str, TaskState]:
        return self.run.tasks

    @property
    def stop_reason(self) -> StopReason | None:
        return self.run.stop_reason

    @property
    def eval_pending(self) -> list[Key]:
        return self.judging.eval_pending

    @property
    def evals_in_flight(self) -> dict[Key, list[CandidateRecord]]:
        return self.judging.evals_in_flight

    @property
    def batch_running(self) -> bool:
        return self.judging.batch_running

    @property
    def baselines_in_flight(self) -> int:
        return self.judging.baselines_in_flight

    def busy(self) -> bool:
        return any(ts.in_flight or ts.profile_pending for ts in self.run.tasks.values()) or self.judging.busy()

    # ------------------------------------------------------------ the loop
    # After a Ctrl-C, what is under way has this long to finish; then the run leaves (a second Ctrl-C
    # leaves at once). Proposals are stored as they arrive, so nothing left is lost: a resume judges it.
    def drive(self) -> None:
        """Run until nothing is under way (the module docstring); the stop reason is set after."""
        interrupts = [0]

        def on_sigint(signum: int, frame: FrameType | None) -> None:
            interrupts[0] += 1

        old_handler = None
        if threading.current_thread() is threading.main_thread():
            # A flag, not an exception: a Ctrl-C must never land in the middle of a write.
            old_handler = signal.signal(signal.SIGINT, on_sigint)
        seen_interrupts = 0
        leave_by: float | None = None  # after a Ctrl-C: what is under way then has until this to finish
        try:
            with self.out.showing():
                self._judge_left_unjudged()
                self.judging.start_profiles()
                self.judging.start_baselines()
                self.schedule()
                while self.busy():
                    self.out.tick(self)
                    if interrupts[0] != seen_interrupts:
                        seen_interrupts = interrupts[0]
                        if seen_interrupts > 1:
                            break
                        self.run.stop_reason = StopReason.INTERRUPTED
                        leave_by = time.monotonic() + INTERRUPT_GRACE_S
                        self.out.say(f"[yellow]stopping: what finishes in the next {INTERRUPT_GRACE_S:g} s is kept, "
                                     "the rest is left to a resume (`--resume` judges it); Ctrl-C again to leave "
                                     "now[/yellow]")
                    if leave_by is not None and time.monotonic() >= leave_by:
                        break  # a prompt stop: every proposal is stored, a resume judges what is left
                    event = self.workers.next(_POLL_S)
                    if event is not None:
                        event()  # the handler its call was spawned with (`Workers.spawn`)
                    self.schedule()
                self.out.tick(self, final=True)  # the last frame says how the run ended, not what it waited for
        finally:
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
        if self.run.stop_reason is None:
            self.run.stop_reason = StopReason.BUDGET

    def _judge_left_unjudged(self) -> None:
        """Proposed but never evaluated (a killed run): evaluate, do not ask again."""
        for rec in self.db.pending_candidates(self.run.run_id):
            if rec.task not in self.run.tasks:
                continue  # a task this invocation does not run: it stays pending for a later resume
            self.run.tasks[rec.task].chains[rec.chain].busy = True
            self.judging.submit(rec)

    # ------------------------------------------------------------ what to ask next
    def _budget_stop(self) -> StopReason | None:
        cfg, run = self.config, self.run
        if cfg.wall_time_s is not None and time.monotonic() - run.started >= cfg.wall_time_s:
            return StopReason.WALL_TIME
        if cfg.token_budget is not None and run.prompt_tokens + run.completion_tokens >= cfg.token_budget:
            return StopReason.TOKENS
        return None

    def schedule(self) -> None:
        self.judging.start_batch()
        if self.run.stop_reason is not None:
            return
        reason = self._budget_stop()
        if reason is not None:
            self.run.stop_reason = reason
            return
        # Round-robin over tasks, one chain step each per pass, so no task starves the others of
        # model slots.
        progressed = True
        while progressed:
            progressed = False
            for ts in self.run.tasks.values():
                if (ts.gave_up or ts.baseline_pending or ts.profile_pending
                        or ts.proposed + ts.in_flight >= self.config.budget):
                    continue
                chain = next((c for c in ts.chains if c.active and not c.busy and c.step < self._quota(c.index)),
                             None)
                if chain is None:
                    continue
                self._start_step(ts, chain)
                progressed = True

    def _quota(self, index: int) -> int:
        """Steps chain `index` may take: the task's budget split evenly, the first chains taking the rest."""
        per, extra = divmod(self.config.budget, self.config.chains)
        return per + (1 if index < extra else 0)

    def _start_step(self, ts: TaskState, chain: Chain) -> None:
        cfg = self.config
        rng = random.Random(f"{cfg.seed}:{ts.task.name}:{chain.index}:{chain.step}")
        extra: dict[str, object] = {"template_dir": cfg.template_dir} if cfg.template_dir is not None else {}
        profile = self.run.profiles.get(ts.task.name)
        if profile is not None:
            extra["profile"] = profile
        prompt = self.build_prompt(ts.task, db=self.db, chain_best=chain.best, policy=cfg.eval.policy,
                                   device=self.device or cfg.eval.device, rng=rng, k=cfg.k_shown, size=cfg.eval.size,
                                   **extra)
        parent = chain.best
        if cfg.episode.turns > 1:
            prompt, parent = chain.next_turn(prompt, cfg.episode, cfg.template_dir)
        request = ProposalRequest(task=ts.task, prompt=prompt, parent=parent.source if parent else None,
                                  chain=chain.index, step=chain.step, profile=profile)
        chain.busy = True
        ts.in_flight += 1
        self.workers.spawn("proposal", self.workers.model_slots, lambda: self.proposer.propose(request),
                           partial(self.on_proposal, (ts.task.name, chain.index, chain.step, prompt, parent)))
        chain.step += 1

    def on_proposal(self, payload: tuple[str, int, int, str, CandidateRecord | None],
                    out: Proposal | BaseException) -> None:
        """A model's answer (or its failure): stored as a candidate, then sent to be judged."""
        name, index, step, prompt, parent = payload
        ts = self.run.tasks[name]
        chain = ts.chains[index]
        ts.in_flight -= 1
        if isinstance(out, Exhausted):
            # a finite proposer has nothing more for this task: its chains end, quietly
            chain.busy = False
            chain.step -= 1
            for c in ts.chains:
                c.active = False
            ts.gave_up = ts.gave_up or f"proposer exhausted: {out}"
            return
        if isinstance(out, BaseException):
            chain.busy = False
            chain.step -= 1  # the step did not happen
            ts.failures += 1
            self.out.error(f"{name}: proposer failed: {type(out).__name__}: {out}", "yellow")
            if ts.failures >= MAX_PROPOSER_FAILURES or isinstance(out, ProposerUnavailable):
                ts.gave_up = f"proposer failed {ts.failures} times in a row"
            return
        ts.failures = 0
        code = out.code if out.code is not None else extract_code(out.answer)
        source = code or ""
        self.run.spent(int(out.prompt_tokens), int(out.completion_tokens))
        rec = self.out.candidate(NewCandidate(
            task=name, hash=source_hash(source), source=source, parents=(parent.id,) if parent else (),
            chain=index, step=step, proposer=self.config.proposer, prompt=prompt, answer=out.answer,
            prompt_tokens=int(out.prompt_tokens), completion_tokens=int(out.completion_tokens),
            run_id=self.run.run_id,
            meta=RunMeta(proposer=dict(getattr(out, "meta", None) or {})).merged(chain.turn_meta())))
        ts.proposed += 1
        self.judging.submit(rec)
