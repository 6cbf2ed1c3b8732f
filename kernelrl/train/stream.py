"""The GRPO prompt stream: contrastive prompts rebuilt from the code database as the trainer reads.

Each row is `{"prompt": ..., "task": NAME, "key": ..., "parents": [ids], "shown": [ids]}`: the curriculum picks
the task, and `kernelrl.episodes.prompt.build_prompt` writes the prompt from what the database
holds for it at that moment (the best correct code as the version to improve, earlier codes of
the task with their measured speedups, refused hacks, then the protocol: analysis first, then
code). `shown` holds the database ids of every version the prompt shows, so the reward can tell
a copy of one from the version's full source and stored verdict (`kernelrl.train.copies`), not
from the prompt's text. The reward function writes every generated code and its verdict back to the same
database, so later prompts show what the policy wrote before: weights and database evolve
together. `key` is `row_key(task, prompt)`: the task travels with its prompt, and the reward
function checks that every completion is scored against the task its prompt was built for.

`PromptStream(run, curriculum, form=PromptForm(...), content=PromptContent(...), seed=..., ranks=...)`:
the run's parts (`kernelrl.run_parts.RunParts`) give the database and the policy, device and size
every prompt states (`run.eval_config`); `form` how the policy reads a prompt (text or chat, the
token budget), `content` what it shows (k earlier versions, how they are drawn, task profiles,
templates).

It is a `datasets.IterableDataset` over an endless generator; TRL repeats each row
`num_generations` times, so a group shares its prompt. The trainer must not shuffle it (TRL's
buffered shuffle would read a thousand prompts ahead) and must not skip rows on resume (they
are rebuilt from the database, not replayed): the GRPO stage fixes `shuffle_dataset = false` and
`ignore_data_skip = true`.

With several processes (accelerate), every rank reads the whole stream and keeps its slice of
each generation batch, and a group of `num_generations` rows may span ranks. So the rows are
decided once: the main process draws the task and builds the prompt, and broadcasts the row;
every rank yields the same rows in the same order (`kernelrl.train.ranks`). Only the main
process's curriculum draws.

With a token budget (`PromptForm.max_tokens`, counted by the policy's tokenizer on the prompt as the
trainer reads it), a prompt that does not fit shows fewer earlier versions (then not even the
best one) until it does; a program is shown whole or not at all, and a task whose prompt alone
does not fit is a `PromptBudgetError` naming it.

Guarantees: a prompt is built when the data loader asks for it, which with TRL is one
generation batch ahead of training (the loader reads one batch ahead), so a step's prompts see
the database as the step before last left it; every rank yields identical rows.

Does not choose tasks (the curriculum does) or write to the database.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from kernelrl.store.records import ContrastDraw
from kernelrl.train.curriculum import Curriculum
from kernelrl.train.model import prompt_text
from kernelrl.train.ranks import Ranks, SingleProcess

if TYPE_CHECKING:
    from datasets import IterableDataset

    from kernelrl.judge.harness.profile import TaskProfile
    from kernelrl.run_parts import RunParts
    from kernelrl.train.sampling import Prompt

# `datasets` pickles a generator to fingerprint it, and a stream holds a database connection:
# the dataset's generator names its stream by number instead.
_STREAMS: weakref.WeakValueDictionary[int, PromptStream] = weakref.WeakValueDictionary()
_NUMBERS = itertools.count()
# Prompts whose task a stream remembers: many generation batches' worth.
_REMEMBERED = 4096


@dataclass(frozen=True, kw_only=True)
class ContrastConfig:
    """How each prompt's earlier versions are drawn (`kernelrl.store.records.ContrastDraw`).

    `best` always shows the task's best known version as the one to improve: once the policy has
    written it, writing it again is a copy and pays no speedup, so a policy that learned the fast
    program is not paid for it under these prompts. `score` draws the shown versions by their
    speedup (weight speedup ** (1 / temperature)) and marks the fastest drawn as the one to improve:
    the best is often shown, not always, and an answer faster than every shown version pays.
    `none` shows no earlier version at all: every prompt is the task's first-attempt prompt (plain
    GRPO, the ablation of the contrastive prompts). `first_attempt_share` of the prompts are the
    first-attempt prompt whatever the draw: the prompt a bench or a user's first call asks, kept
    in training so the policy's first answers are trained too, not only its answers to versions.
    """

    draw: ContrastDraw = ContrastDraw.BEST  # best (always the best), score (drawn by speedup) or none (no version)
    temperature: float = 1.0  # score: weight speedup ** (1 / temperature); lower favours the fast ones
    first_attempt_share: float = 0.0  # the share of prompts that are the first-attempt prompt, whatever the draw

    def __post_init__(self) -> None:
        object.__setattr__(self, "draw", ContrastDraw(self.draw))
        if self.temperature <= 0:
            raise ValueError("contrast.temperature must be > 0")
        if not 0.0 <= self.first_attempt_share <= 1.0:
            raise ValueError("contrast.first_attempt_share must be in [0, 1]")


class PromptRow(TypedDict):
    """One row of the stream's dataset (its columns are `PromptStream.dataset`'s features)."""

    prompt: Prompt  # what the policy reads: the text, or chat messages
    task: str
    key: str  # `row_key(task, prompt)`
    parents: list[int]  # the candidate the prompt builds on, if any
    shown: list[int]  # every version the prompt shows (database ids)


class PromptBudgetError(ValueError):
    """A task's prompt does not fit the token budget even with no earlier version shown."""


def _rows(stream: int) -> Iterator[PromptRow]:
    yield from _STREAMS[stream].rows()


def row_key(task: str, prompt: Prompt) -> str:
    """What ties a row's task to its prompt (a string, or chat messages): a hash of both."""
    text = f"{task}\0{prompt_text(prompt)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class PromptForm:
    """How the policy reads a prompt: `as_prompt` turns its text into what the trainer feeds (the
    text, or chat messages: `chat` says which, for the dataset's columns), and the token budget:
    `max_tokens` counted by `count_tokens` on the prompt as the trainer sees it (either None: no
    budget)."""

    as_prompt: Callable[[str], Prompt]
    chat: bool = False
    count_tokens: Callable[[str], int] | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1 or None")


@dataclass(frozen=True, kw_only=True)
class PromptContent:
    """What a prompt shows beside its task: up to `k` earlier versions, drawn as `contrast` says,
    each task's shapes from the judge's profile of it (`profiles`: task name -> `TaskProfile`), in
    the templates of `template_dir` (None: the built-in ones)."""

    k: int = 4
    contrast: ContrastConfig = field(default_factory=ContrastConfig)
    profiles: Mapping[str, TaskProfile | None] = field(default_factory=dict)
    template_dir: Path | None = None


class PromptStream:
    """The rows of the module docstring, from the run's database (`run.db`), stating the run's
    policy, device and size (`run.eval_config`)."""

    def __init__(self, run: RunParts, curriculum: Curriculum, *, form: PromptForm, content: PromptContent | None = None,
                 seed: int = 0, ranks: Ranks | None = None) -> None:
        self.form = form
        self.content = content or PromptContent()
        self.curriculum = curriculum
        self.ranks: Ranks = ranks or SingleProcess()
        self.db = run.db
        self.eval_config = run.eval_config
        self.seed = seed
        self.trimmed = 0  # prompts that showed fewer versions than k to fit the budget
        self.best_shown = 0  # prompts that showed the task's best known version
        self.built = 0  # prompts built so far (for logs and tests)
        # the row of each prompt this rank yielded lately (a rollout function is handed prompts only)
        self._rows: OrderedDict[str, PromptRow] = OrderedDict()

    def row(self) -> PromptRow:
        from kernelrl.episodes.prompt import compose_prompt

        task = self.curriculum.draw()
        best = self.db.top_candidates(task.name, 1) if self.db is not None else []
        content, form, config = self.content, self.form, self.eval_config
        k = content.k
        drawn = None
        first = random.Random(f"{self.seed}:{self.built}:first").random() < content.contrast.first_attempt_share
        plain = content.contrast.draw is ContrastDraw.NONE or first  # the first-attempt prompt: nothing from the database
        if plain:
            k, drawn = 0, []
        elif content.contrast.draw is ContrastDraw.SCORE and self.db is not None:
            # the versions drawn by score; the fastest of them is the one to improve
            drawn = self.db.contrast_set(task.name, k, random.Random(f"{self.seed}:{self.built}:draw"),
                                         draw=ContrastDraw.SCORE, temperature=content.contrast.temperature)
        chain_best = (drawn[0] if drawn else None) if drawn is not None else (best[0] if best else None)
        while True:
            composed = compose_prompt(task, db=None if plain else self.db, chain_best=chain_best,
                                      policy=str(config.policy), device=str(config.device), size=str(config.size),
                                      rng=random.Random(f"{self.seed}:{self.built}"), k=k,
                                      profile=content.profiles.get(task.name),
                                      template_dir=content.template_dir, shown=None if drawn is None else drawn[:k])
            text = composed.text
            if form.max_tokens is None or form.count_tokens is None:
                break
            n = form.count_tokens(text)
            if n <= form.max_tokens:
                break
            # Too long: show fewer earlier versions, then not even the best; a program is shown
            # whole or not at all (a prompt cut mid-program would teach from a broken example).
            if k > 0:
                k -= 1
            elif chain_best is not None:
                chain_best = None
            else:
                raise PromptBudgetError(f"{task.name}: its prompt with no earlier version is {n} tokens, over the "
                                        f"budget of {form.max_tokens} (grpo.max_prompt_tokens); raise it or leave "
                                        "the task out")
        if k < content.k or (best and chain_best is None):
            self.trimmed += 1
        self.best_shown += bool(best) and best[0].id in composed.shown
        self.built += 1
        prompt = form.as_prompt(text)
        return {"prompt": prompt, "task": task.name, "key": row_key(task.name, prompt),
                "parents": [chain_best.id] if chain_best is not None else [], "shown": list(composed.shown)}

    def rows(self) -> Iterator[PromptRow]:
        """Rows without end; with several ranks, the main process's rows on every rank."""
        while True:
            row = self.ranks.broadcast(self.row() if self.ranks.is_main else None)
            assert row is not None  # the main process always builds one
            self._rows[prompt_text(row["prompt"])] = row
            while len(self._rows) > _REMEMBERED:
                self._rows.popitem(last=False)
            yield row

    def row_of(self, prompt: object) -> PromptRow:
        """The row a prompt this stream yielded came in (its task, key and parents); KeyError for
        any other prompt."""
        text = prompt_text(prompt)
        if text not in self._rows:
            raise KeyError("a prompt this stream did not yield (or yielded too long ago)")
        return self._rows[text]

    def state(self) -> dict[str, int]:
        return {"built": self.built, "best_shown": self.best_shown}

    def load_state(self, state: Mapping[str, int]) -> None:
        self.built = int(state.get("built", 0))
        self.best_shown = int(state.get("best_shown", 0))

    def dataset(self) -> IterableDataset:
        from datasets import Features, IterableDataset, List, Value

        prompt = List({"role": Value("string"), "content": Value("string")}) if self.form.chat else Value("string")
        features = Features({"prompt": prompt, "task": Value("string"), "key": Value("string"),
                             "parents": List(Value("int64")), "shown": List(Value("int64"))})
        number = next(_NUMBERS)
        _STREAMS[number] = self  # weakly: the stream lives as long as its owner (the GRPO stage) holds it
        return IterableDataset.from_generator(_rows, gen_kwargs={"stream": number}, features=features)
