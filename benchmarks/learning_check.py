"""Known-answer learning check: does a policy trained on kernelrl's reward learn the right thing?

Small tasks, each with a fixed menu of eight answers whose verdicts are known in advance:

    no_code  an answer without a program               (no code)
    broken   a program that does not parse             (compile_error)
    wrong    the fastest program, its output scaled    (incorrect; in `read`: `raises`, the
             fastest program naming an undefined value  runtime_error)
    hack     the fastest program caching its output    (flagged: a dynamic defence)
    slow     the reference's own work: 32 repeats      (correct, ~1x)
    mid      8 repeats (not in `read`)                  (correct, ~4x)
    fast     4 repeats: the fastest program one can    (correct, ~8x)  <- the right answer
             write without copying
    copy     the version every prompt shows as the     (correct, ~32x measured and stored; a
             best so far (1 repeat), verbatim           copy earns nothing: paid as 1.0x)

Single-turn (`single`) and multi-turn (`multi`, two turns): two tasks, tanh(x @ W) at two
shapes, so every menu answer is a program for both. `read` (two turns) asks whether turn 2
follows turn 1's verdict: a third task, sigmoid(x @ W), and `sigmoid` (its 4-repeat program) in
place of `mid`. Every prompt ends alike at turn 1, so the policy cannot tell the sigmoid task apart
there and its best first answer is `fast` (right on two tasks of three). Turn 1's verdict is what
tells: `fast` is judged correct on a tanh task and incorrect on the sigmoid task, and the turn-2
prompt ends with what that verdict asks for ("Turn 1 is correct: make it faster ..." or "Turn 1
failed (incorrect): fix what its verdict says first.", a line the policy's tokenizer holds as one
token). So the right second answer after `fast` is `fast` on a tanh task (an episode's own
earlier answer is judged and paid again) and `sigmoid` on the sigmoid task: the same program
shown, two verdicts, two right answers. A policy that answers turn 2 alike whatever turn 1's
verdict said cannot be right on both. The verdict names its fix: in `read` "failed (incorrect)"
follows a tanh program on the sigmoid task and nothing else, so its fix is always `sigmoid`. The
sigmoid task's model takes a second init argument (its gain, 2.0), every program of `read` takes
one (tanh programs default it to 1.0), and `sigmoid` requires it: on a tanh task `sigmoid` cannot
be built (a runtime error), and the menu's `wrong` raises instead of being judged incorrect.
(Before both, the same verdict also followed `sigmoid` or `wrong` on a tanh task, where its fix is
`fast`: two tasks of three, so early in a run that context paid `fast`, and it could collapse onto
`fast` before the sigmoid task's case grew; benchmarks/README.md.)

The policy is a tiny Qwen2 (built here from a config, width 32, 2 layers, attention over the whole
prompt or the last `--window` tokens per layer; its BPE tokenizer trained here on the prompts,
every menu answer one token) that answers by choosing one of the eight menu tokens (TRL's
generation, every other token suppressed). It is trained by `kernelrl train grpo` itself, the
real path: the real evaluator (sandboxed workers, the `open` policy: the menu's programs are
PyTorch rewrites, which `strict` refuses for holding no custom kernel; the hack is refused by a
dynamic defence, as under every policy), the reward's windows and clip, GRPO-RoC (single-turn),
per-turn credit (multi-turn), the curriculum, the prompt stream and the code database (seeded
with the shown best, judged by the evaluator before the run). Checkpoints are kept, and the
probability the policy gives each menu answer is read from each of them on prompts the run
actually built: each task's turn-1 prompt, and turn-2 prompts labelled by the answer turn 1 gave
("task@turn2-after-fast").

It must learn, within the steps given, from chance (1/8) to >= 0.8 for the right answer on every
judged prompt: the tanh tasks' turn 1 (`fast`), and every task's turn 2 after `fast` (`fast` on
the tanh tasks, `sigmoid` on the sigmoid task). Neither the hack nor the copy may become the
preferred answer on any prompt: the most likely one at two checkpoints in a row, or at the last.
(The copy is paid as the reference's own work, like `slow`; early on, both rise above the
failures, and either may lead at one checkpoint by chance. Paid in full, as before copies were
caught, it leads and stays.) Turn-2 prompts after other answers are printed, not judged: in
`read`, a tanh task's and the sigmoid task's differ only far back, in the task itself.

What `single` and `multi` cannot show: their policy gives every prompt the same distribution
(the curves agree to two decimals), so `multi` shows that refinement episodes, their discounted
returns and the per-turn credit teach the fastest answer through TRL's real rollout path, not
that turn 2 reads turn 1. `read` is the check that it does, at its own settings (`SETTINGS`: a
lower learning rate, 8 episodes a group, 90 steps, a window of one token); see benchmarks/README.md
for its curves on 1 and 2 processes and for the settings under which it failed (the policy
collapsing onto `fast` in every context). With a window of one token the policy cannot tell apart
two prompts whose last lines agree: after a runtime-error turn 1 it gives tanh and sigmoid tasks
one answer, which the unjudged prompts printed at the end show.

Turn position: per-turn credit centres returns per turn index (`--credit turn`, the default), so
equal outcomes get equal credit whatever the turn and a group of equal outcomes gives nothing
(tested in tests/train/test_multiturn.py); `--credit group` hands TRL the raw discounted returns,
where a failed turn 1 always returns less than a failed turn 2 (r1 + 0.4 r2 < r2).

`ctx` and `ctx-multi` (benchmarks/learning_ctx.py, where their menus, the paid checks and the
mutants live): three tasks whose fast answers are *incorrect* on each other, the real prompt with
the task named on its last line (the only token the policy reads), copies and near-copies of each
task's shown best in the menu, one group of each step split between the two processes; they pass
when P(own fast) >= 0.8 and P(another task's fast) <= 0.1 on every task, and what every answer
was paid, read from the run's database, holds its order (hack < no code <= failures < correct;
copies at most the no-speedup reward; slow below fast in every batch; identical programs alike;
no answer above its raw reward; in `ctx-multi`, no turn credited whose episode has a later turn
without a reward). `--mutants` runs them against sabotaged copies of the package and passes only
when each sabotaged run fails.

    python benchmarks/learning_check.py                      # single- and multi-turn, 1 process
    python benchmarks/learning_check.py --variants ctx --processes 2    # the task must be read; what was paid
    python benchmarks/learning_check.py --mutants --processes 2         # each sabotage must fail the check
    python benchmarks/learning_check.py --processes 1,2 --steps 40
    python benchmarks/learning_check.py --variants read     # turn 2 must follow turn 1's verdict
    python benchmarks/learning_check.py --variants multi --credit group   # the turn-position bias
    python benchmarks/learning_check.py --variants read --lr 0.02 --episodes 4   # where `read` fails
    python benchmarks/learning_check.py --kernelrl-root /path/to/other/checkout  # train with other code

The last line gives each variant's final P(right answer) per judged prompt; the exit status is 0
when every variant passed. Results (per step) are written to `<out>/<variant>-p<N>/curve.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import learning_ctx  # noqa: E402 - the ctx variants and the mutation gate, beside this file

# The reference repeats its work 32 times. The shown best (the op once, written without a loop,
# ~32x) must stay the best measured version whatever the machine's noise (a 2x gap was inverted on
# a loaded machine, and a policy's faster answer then became the version shown, and its copy); fast
# (~8x) sits below the reward's 10x cap, so the copy paid in full would beat it (as before copies
# were caught). Written without a loop, the shown best is more token edits from the loops than the
# copy rule allows, so `fast` is a program of its own, not a slower copy of it.
REPEATS = {"slow": 32, "mid": 8, "fast": 4}
THRESHOLD = 0.8
OTHER_LIMIT = 0.1  # `ctx`: the most P(another task's fast answer) may be on a task's prompt


@dataclass(frozen=True, kw_only=True)
class Settings:
    """A variant's defaults (each a flag): GRPO steps, learning rate, the policy's attention window
    in tokens per layer (None: the whole prompt) and episodes per group (a group is one task's
    prompt; two groups per step)."""

    steps: int
    lr: float
    window: int | None
    episodes: int


# `read` needs what the others do not: a context that is a third of the data must keep its own
# answer while two thirds push `fast` through every parameter the contexts share. At 0.005 with 8
# episodes a group it does, on 1 and 2 processes (benchmarks/README.md). Its window is the
# instruction line: the policy reads what turn 1's verdict asks for and nothing else.
# `ctx`: three contexts (one task line each) of equal share; the policy reads the last token only.
SETTINGS = {"single": Settings(steps=40, lr=0.02, window=None, episodes=16),
            "multi": Settings(steps=40, lr=0.02, window=None, episodes=4),
            "read": Settings(steps=90, lr=0.005, window=1, episodes=8),
            "ctx": Settings(steps=60, lr=0.01, window=1, episodes=8),
            "ctx-multi": Settings(steps=60, lr=0.01, window=1, episodes=8)}

# One operator (tanh(x @ W)) at two shapes, so that every menu answer is a program for both (the
# policy chooses among 8 answers, chance 1/8) and each task keeps its own window, curriculum
# weight, prompts and shown best. The `read` variant adds a third task, sigmoid(x @ W), whose
# prompt ends like the others': at turn 1 the policy cannot tell it apart (its likeliest right
# answer is `fast`, right on two tasks of three), and turn 1's verdict is what says which task it
# was: `fast` is "Correct" on a tanh task and "Incorrect" on the sigmoid one, whose fix is the
# menu's `sigmoid` answer (in place of `mid`; `read` only, as is the sigmoid task).
TANH_TASKS = {"repeat_tanh_square": (256, 256, "tanh"), "repeat_tanh_wide": (512, 128, "tanh")}  # batch, n, op
SIGMOID_TASK = "repeat_sigmoid_square"
# The sigmoid task's model takes a second init argument, its gain; every program of `read` takes
# one (tanh programs default it to 1.0), and the menu's `sigmoid` requires it.
SIGMOID_GAIN = 2.0
TASKS = {"single": TANH_TASKS, "multi": TANH_TASKS, "read": {**TANH_TASKS, SIGMOID_TASK: (256, 256, "sigmoid")},
         "ctx": learning_ctx.CTX_TASKS, "ctx-multi": learning_ctx.CTX_TASKS}
TURNS = {"single": 1, "ctx": 1}  # every other variant: two-turn episodes
VARIANTS = tuple(TASKS)


def program(repeats: int, *, op: str = "tanh", cls: str = "ModelNew", scale: str = "", cache: bool = False,
            gain: str | None = None) -> str:
    """`gain`: None, or the program takes a gain (multiplies its result by it) as a second init
    argument, "optional" (1.0 when not given) or "required" (see `TASKS`)."""
    lookup = ("        if x.shape in self.cache:\n            return self.cache[x.shape]\n" if cache else "")
    store = "        self.cache[x.shape] = y\n" if cache else ""
    args = {None: "n", "optional": "n, gain=1.0", "required": "n, gain"}[gain]
    return (f'import torch\nimport torch.nn as nn\n\n\nclass {cls}(nn.Module):\n'
            f'    """{op}(x @ W), the same product computed {repeats} time(s) (only the last kept)."""\n\n'
            f"    def __init__(self, {args}):\n        super().__init__()\n"
            + ("        self.cache = {}\n" if cache else "")
            + ("        self.gain = gain\n" if gain else "")
            + f"        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)\n\n"
            f"    def forward(self, x):\n{lookup}        y = x\n        for _ in range({repeats}):\n"
            f"            y = torch.{op}(x @ self.weight)\n"
            + ("        y = y * self.gain\n" if gain else "")
            + f"{store}        return y{scale}\n")


def gain_of(variant: str, op: str) -> str | None:
    """In `read` every program takes a gain: tanh programs may be given one, sigmoid's must be."""
    return None if variant != "read" else ("required" if op == "sigmoid" else "optional")


def task_source(variant: str, name: str) -> str:
    batch, n, op = TASKS[variant][name]
    init = f"{n}, {SIGMOID_GAIN}" if gain_of(variant, op) == "required" else f"{n}"
    return (program(REPEATS["slow"], op=op, cls="Model", gain=gain_of(variant, op))
            + f"\n\ndef get_inputs():\n    return [torch.randn({batch}, {n})]\n\n\n"
            f"def get_init_inputs():\n    return [{init}]\n")


def menu(variant: str) -> dict[str, str]:
    """The answers, the same for every task of the variant (eight; `ctx`: learning_ctx's)."""
    if variant.startswith("ctx"):
        return learning_ctx.ctx_menu(program, variant)
    tanh = gain_of(variant, "tanh")
    second = (("sigmoid", program(REPEATS["fast"], op="sigmoid", gain=gain_of(variant, "sigmoid"))) if variant == "read"
              else ("mid", program(REPEATS["mid"])))
    # In `read` the one incorrect verdict an answer can earn is a tanh program's on the sigmoid task,
    # so a "failed (incorrect)" turn 1 names one fix (`sigmoid`): `sigmoid` on a tanh task cannot be
    # built (it needs the gain only the sigmoid task gives), and the failing answer that other
    # variants judge incorrect (`wrong`, whose fix would be `fast` with the same verdict) raises.
    third = ("raises", program(REPEATS["fast"], scale=" * undefined_scale", gain=tanh)) if variant == "read" else (
        "wrong", program(REPEATS["fast"], scale=" * 1.5"))
    return {"no_code": "", "broken": "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x:\n"
            "        return x\n", third[0]: third[1],
            "hack": program(REPEATS["fast"], cache=True, gain=tanh), "slow": program(REPEATS["slow"], gain=tanh),
            second[0]: second[1], "fast": program(REPEATS["fast"], gain=tanh),
            "copy": learning_ctx.once("tanh", gain=tanh)}


def shown_best(variant: str, name: str) -> str:
    """The task's best version so far, shown in every prompt (the `copy` answer on a tanh task)."""
    op = TASKS[variant][name][2]
    return learning_ctx.once(op, gain=gain_of(variant, op))


@dataclass
class Point:
    step: int
    p: dict[str, dict[str, float]]  # prompt label (see `LABELS`) -> kind -> probability
    sampled: dict[str, float] = field(default_factory=dict)  # kind -> share of this step's answers


@dataclass
class Outcome:
    variant: str
    processes: int
    credit: str
    steps: int
    seconds: float
    curve: list[Point]
    final: dict[str, float]  # prompt label -> P(fast) at the last checkpoint
    hack_or_copy_won: list[str]  # "step N: label -> kind" whenever the hack or the copy was the most likely
    passed: bool
    reasons: list[str]
    others: dict[str, float] = field(default_factory=dict)  # `ctx`: label -> P(another task's fast answer)
    paid: str = ""  # `ctx`: mean paid per kind of answer, on its own task


# The prompts the curves are read on: a task's turn-1 prompt (labelled by the task), and turn-2
# prompts labelled by the answer turn 1 gave ("task@turn2-after-KIND"). After `fast`, on a tanh
# task it was judged correct and the right answer is `fast` again (an episode's own earlier answer
# is judged and paid again, not a copy); on the sigmoid task it was judged incorrect and the right
# answer is `sigmoid`. Those turn-2 prompts show the same program and differ in its verdict (and
# the instruction that follows from it, the prompt's last line): a policy that does not read the
# verdict cannot be right on both. After another failed answer the prompts of a tanh task and of
# the sigmoid task differ only far back, in the task, so they are shown and not judged.
AFTER = "@turn2-after-"
AFTER_FAST = AFTER + "fast"


def task_of(label: str) -> str:
    return label.split("@")[0]


def right_answer(label: str) -> str:
    """The fastest correct answer that is not a copy of the shown best."""
    if label.startswith("ctx_"):
        return f"fast_{learning_ctx.own_op(label)}"
    return "sigmoid" if task_of(label) == SIGMOID_TASK else "fast"


def judged(label: str) -> bool:
    """Whether the labelled prompt holds what its right answer needs in reach of the policy (see
    `TASKS` and the labels above): a tanh task's turn 1, and every turn 2 after `fast`; in `ctx`,
    every task's turn 1 and its turn 2 after its own fast answer (both end with the task line)."""
    if label.startswith("ctx_"):
        return "@" not in label or label.endswith(AFTER + right_answer(label))
    if "@" not in label:
        return task_of(label) != SIGMOID_TASK
    return label.endswith(AFTER_FAST)


def instruction_lines() -> list[str]:
    """Every last line a turn-2 prompt can end with (`kernelrl.episodes.episode.next_step`, one per
    verdict), which the policy's tokenizer holds whole: a turn-2 prompt's last token then says what
    turn 1's verdict asks for."""
    from kernelrl.episodes.episode import Turn, next_step
    from kernelrl.result import EvalResult, Status

    results = [None, *(EvalResult(task="t", status=s) for s in Status)]
    return [next_step(Turn(number=1, answer="", code=None if r is None else "x", result=r, verdict="")) + "\n"
            for r in results]


def eval_table() -> dict[str, Any]:
    # `open`: the menu's programs are PyTorch rewrites, which `strict` refuses for holding no custom
    # kernel; the hack is refused by a dynamic defence, which rejects under every policy.
    return {"device": "cpu", "size": "full", "policy": "open", "timeout_s": 120, "concurrency": 2,
            "timing": {"min_rounds": 5, "max_rounds": 20, "max_timing_s": 2.0, "warmup_calls": 2,
                       "min_spot_checks": 2}}


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(v)


def toml_text(table: dict[str, Any], prefix: str = "") -> str:
    plain = [f"{k} = {toml_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    out = ([f"[{prefix}]"] if prefix and plain else []) + plain
    for k, v in table.items():
        if isinstance(v, dict):
            out.append(toml_text(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(out) + "\n"


def prepare(folder: Path, *, variant: str, processes: int, credit: str, settings: Settings
            ) -> tuple[Path, dict[str, int]]:
    """Task files, the seeded database, the tiny model and the run config; the config's path and
    each menu token's id per task."""
    import random

    from transformers import AutoTokenizer

    from kernelrl.candidate import Candidate, source_hash
    from kernelrl.config import build
    from kernelrl.episodes.prompt import BUILTIN_TEMPLATES, build_prompt
    from kernelrl.judge.eval_config import EvalConfig
    from kernelrl.run_parts import build_run
    from kernelrl.store.records import NewCandidate, RunMeta
    from kernelrl.tasks.suites import load_tasks
    from kernelrl.train.tiny import TinyModelConfig, build_tiny_model, program_tokens

    tasks_dir = folder / "tasks"
    tasks_dir.mkdir(parents=True, exist_ok=True)
    for name in TASKS[variant]:
        (tasks_dir / f"{name}.py").write_text(task_source(variant, name))
    tasks = load_tasks([str(tasks_dir)])
    answers = menu(variant)
    # `ctx`: the real prompt with the task line last (the policy's window is that one token)
    templates = learning_ctx.write_templates(folder / "templates", BUILTIN_TEMPLATES) if variant.startswith("ctx") else None
    eval_config = build(EvalConfig, eval_table())
    db_path = folder / "code.db"
    # The run's builder registers the tasks at the judge's size and closes its evaluator.
    with build_run(tasks=tasks, eval_config=eval_config, db_path=db_path) as run:
        db = run.db
        assert db is not None  # a path was given
        # The best version so far, as an earlier run left it: judged now, stored with its verdict.
        results = run.judge.evaluate_batch([(t, Candidate(source=shown_best(variant, t.name), origin="seed"))
                                            for t in tasks])
        prompts = []
        for t, result in zip(tasks, results):
            print(f"  seeded {t.name}: the shown best judged {result.status.value}"
                  + (f" at {result.speedup:.2f}x" if result.speedup else ""), flush=True)
            if result.status.value != "correct":
                raise SystemExit(f"learning check: the shown best of {t.name} was not judged correct "
                                 f"({result.status.value}: {result.message}); the evaluator is not working here")
            code = shown_best(variant, t.name)
            rec = db.add_candidate(NewCandidate(task=t.name, hash=source_hash(code), source=code, parents=(),
                                                chain=0, step=0, proposer="seed", prompt="", answer=code,
                                                prompt_tokens=0, completion_tokens=0, run_id=None, meta=RunMeta()))
            db.store_result(rec.id, result)
            best = db.top_candidates(t.name, 1)
            prompts.append(build_prompt(t, db=db, chain_best=best[0] if best else None, policy="open",
                                        device="cpu", rng=random.Random(0), k=0, size="full", template_dir=templates))
    phrases = instruction_lines() + [learning_ctx.task_line(t.name) for t in tasks if templates is not None]
    base = folder / "base"
    # One token per menu answer, shared by both tasks (named after the first: the text is cosmetic).
    build_tiny_model(base, tasks[:1], TinyModelConfig(hidden_size=32, layers=2, heads=2, bpe_vocab=512,
                                                      program_variants=1, window=settings.window, seed=0),
                     corpus=prompts, programs={tasks[0].name: answers}, phrases=phrases)
    tok = AutoTokenizer.from_pretrained(base)
    texts = program_tokens(tasks[:1], 1, {tasks[0].name: answers})
    tokens: dict[str, int] = {}
    for kind, text in zip(answers, texts):
        token_id = tok.convert_tokens_to_ids(text)  # one token (a str) in: one id out
        if not isinstance(token_id, int):
            raise TypeError(f"learning check: token {text!r} gave {token_id!r}, not one id")
        tokens[kind] = token_id
    suppressed = [i for i in range(len(tok)) if i not in set(tokens.values())]
    turns = TURNS.get(variant, 2)
    rows = settings.episodes * turns  # one row per turn of each episode of a group
    # rows per generation batch over all processes: two groups (`ctx`: three, so that on two
    # processes the second group is split between them: a group spans both ranks)
    per_batch = (3 if variant.startswith("ctx") else 2) * rows
    grpo: dict[str, Any] = {
        "k_shown": 0,  # the prompt shows the best version only: the copy's original
        "roc": {"enabled": turns == 1, "keep": 0.5, "min_per_side": 2},
        "curriculum": {"by_level": False},
        "trl": {"max_steps": settings.steps, "num_generations": rows,
                "per_device_train_batch_size": per_batch // processes,
                "max_completion_length": 1, "temperature": 1.0, "learning_rate": settings.lr, "beta": 0.0,
                "loss_type": "dapo", "scale_rewards": "group", "mask_truncated_completions": False,
                "lr_scheduler_type": "constant", "logging_steps": 1, "save_steps": max(1, settings.steps // 10),
                "save_strategy": "steps", "report_to": "none", "use_cpu": True, "bf16": False, "seed": 0,
                "generation_kwargs": {"suppress_tokens": suppressed}},
    }
    if turns > 1:
        grpo["episode"] = {"turns": turns, "gamma": 0.4}
    if credit != "turn":
        grpo["credit"] = credit
    config = {"tasks": [str(tasks_dir)], "output_dir": str(folder / "run"), "db_path": str(db_path), "seed": 0,
              **({"template_dir": str(templates)} if templates is not None else {}),
              "model": {"path": str(base), "dtype": "float32"}, "eval": eval_table(),
              "reward": {"mapping": "log", "baseline": "eager", "smoothing": {"window": 32, "min_samples": 8}},
              "grpo": grpo}
    path = folder / "run.toml"
    path.write_text(toml_text(config))
    return path, tokens


def train(config: Path, *, processes: int, root: Path, log: Path) -> int:
    if processes == 1:
        cmd = [sys.executable, "-m", "kernelrl", "train", "grpo", "--config", str(config)]
    else:
        # accelerate's --cpu launcher starts one process; --multi_gpu starts N through torchrun,
        # and with no CUDA they meet on the CPU over gloo.
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "kernelrl", "train",
               "grpo", "--config", str(config)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": str(root)}
    with log.open("w") as out:
        return subprocess.run(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def kind_of(answer: str) -> str | None:
    m = re.search(r"Plan \d+: (\w+) version for (\S+)\.", answer)
    return m.group(1) if m else None


def analyse(folder: Path, tokens: dict[str, int], *, variant: str) -> list[Point]:
    """P(each menu answer) at every checkpoint, on prompts the run built; sampled shares per step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kernelrl.store import Database

    with Database(folder / "code.db", readonly=True) as db:
        rows = [c for c in db.candidates() if c.proposer != "seed"]
    by_id = {c.id: c for c in rows}
    labels: dict[str, str] = {}  # label -> prompt
    for c in sorted(rows, key=lambda c: c.id):
        turn = c.meta.turn or 1
        if turn == 1:
            labels.setdefault(c.task, c.prompt)
        elif c.parents and (parent := by_id.get(c.parents[0])) is not None:
            labels.setdefault(c.task + AFTER + (kind_of(parent.answer) or "?"), c.prompt)
    tok = AutoTokenizer.from_pretrained(folder / "base")
    checkpoints = sorted((int(p.name.split("-")[1]), p) for p in (folder / "run" / "grpo").glob("checkpoint-*"))
    points = []
    sampled: dict[int, dict[str, float]] = {}
    for c in rows:
        k = kind_of(c.answer) or "?"
        sampled.setdefault(c.step, {}).setdefault(k, 0)
        sampled[c.step][k] += 1
    for step, counts in sampled.items():
        total = sum(counts.values())
        sampled[step] = {k: v / total for k, v in counts.items()}
    for step, path in [(0, folder / "base"), *checkpoints]:
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        p: dict[str, dict[str, float]] = {}
        for label, prompt in labels.items():
            ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(ids).logits[0, -1]
            probs = torch.softmax(logits[torch.tensor(list(tokens.values()))], dim=0).tolist()
            p[label] = dict(zip(tokens, probs))
        points.append(Point(step=step, p=p, sampled=sampled.get(max(0, step - 1), {})))
    return points


def preferred_hack_or_copy(points: list[Point]) -> list[str]:
    """Each time the hack or a copy of a shown program was the most likely answer at two
    checkpoints in a row, or at the last one, per prompt."""
    out = []
    labels = sorted(points[0].p) if points else []
    for label in labels:
        tops = [max(pt.p[label], key=pt.p[label].__getitem__) if label in pt.p else None for pt in points]
        for i, top in enumerate(tops):
            if top is not None and top.startswith(("hack", "copy", "near_")) and (
                    i == len(tops) - 1 or tops[i + 1] == top):
                out.append(f"step {points[i].step}: {label} -> {top}")
    return out


def other_fast(label: str, q: dict[str, float]) -> float:
    """`ctx`: P(the fast answer of another task) on a task's prompt."""
    return sum(p for kind, p in q.items() if kind.startswith("fast_") and kind != right_answer(label))


def judge(points: list[Point], *, variant: str) -> tuple[dict[str, float], list[str], list[str]]:
    final = {label: q[right_answer(label)] for label, q in points[-1].p.items() if judged(label)} if points else {}
    won = preferred_hack_or_copy(points)
    reasons = []
    if not final:
        reasons.append("no checkpoint to read")
    for label, q in final.items():
        if judged(label) and q < THRESHOLD:
            reasons.append(f"{label}: P({right_answer(label)}) {q:.2f} < {THRESHOLD}")
    if variant.startswith("ctx") and points:
        for label, probs in points[-1].p.items():
            if judged(label) and other_fast(label, probs) > OTHER_LIMIT:
                reasons.append(f"{label}: P(another task's fast answer) {other_fast(label, probs):.2f} > {OTHER_LIMIT}")
        if not any("@" not in label for label in final) or len({task_of(x) for x in final}) < len(TASKS[variant]):
            reasons.append("not every task's prompt was built")
    if won:
        reasons.append(f"the hack or the copy was the most likely answer {len(won)} time(s)")
    if variant == "read":
        def tanh_after_fast(label: str) -> bool:
            return label.endswith(AFTER_FAST) and task_of(label) != SIGMOID_TASK

        def sigmoid_after_fast(label: str) -> bool:
            return label == SIGMOID_TASK + AFTER_FAST

        needed = {"a tanh task's turn 2 after fast (judged correct)": tanh_after_fast,
                  "the sigmoid task's turn 2 after fast (judged incorrect)": sigmoid_after_fast}
        for what, match in needed.items():
            if not any(match(label) for label in final):
                reasons.append(f"no prompt for {what} was built")
    return final, won, reasons


def prompt_gap(o: Outcome) -> float:
    """The largest difference between two prompts' P(fast) at any checkpoint: 0 for a policy
    blind to its prompt."""
    return max((max(q["fast"] for q in pt.p.values()) - min(q["fast"] for q in pt.p.values())
                for pt in o.curve if pt.p), default=0.0)


def no_speedup_reward() -> float:
    """What the check's reward config pays a correct program at 1.0x (what a copy may be paid at most)."""
    from kernelrl.result import EvalResult, Status
    from kernelrl.reward import RewardConfig, RewardModel

    r = RewardModel(RewardConfig()).raw(  # the run's [reward] table: the log mapping against eager
        EvalResult(task="t", status=Status.CORRECT, speedup=1.0))
    assert r is not None
    return r.raw


def run_variant(out: Path, *, variant: str, processes: int, credit: str, settings: Settings, root: Path,
                name: str | None = None, crash_fails: bool = False) -> Outcome:
    """One run of the check; `crash_fails`: a training run that fails is the check failing (a
    mutant), not an error of the check."""
    folder = out / (name or f"{variant}-p{processes}" + ("" if credit == "turn" else f"-{credit}"))
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    started = time.monotonic()
    window = "the whole prompt" if settings.window is None else f"a window of {settings.window} token(s)"
    print(f"{variant}-turn, {processes} process(es), credit {credit}, lr {settings.lr:g}, {window}, "
          f"{settings.episodes} episodes a group: preparing in {folder}", flush=True)
    config, tokens = prepare(folder, variant=variant, processes=processes, credit=credit, settings=settings)
    print(f"  training {settings.steps} steps (log: {folder / 'train.log'})", flush=True)
    code = train(config, processes=processes, root=root, log=folder / "train.log")
    if code != 0:
        tail = (folder / "train.log").read_text()[-3000:]
        if not crash_fails:
            raise SystemExit(f"learning check: training failed (exit {code}); the end of its log:\n{tail}")
        last = [line for line in tail.splitlines() if line.strip()][-1:] or ["?"]
        outcome = Outcome(variant=variant, processes=processes, credit=credit, steps=settings.steps,
                          seconds=time.monotonic() - started, curve=[], final={}, hack_or_copy_won=[], passed=False,
                          reasons=[f"training failed (exit {code}): {last[0][:300]}"])
        print(f"  {variant} on {processes} process(es): FAIL: {outcome.reasons[0]}", flush=True)
        return outcome
    points = analyse(folder, tokens, variant=variant)
    final, won, reasons = judge(points, variant=variant)
    others: dict[str, float] = {}
    paid = ""
    if variant.startswith("ctx"):
        rows = learning_ctx.read_rows(folder / "code.db", kind_of)
        reasons += learning_ctx.paid_checks(rows, no_speedup=no_speedup_reward(), multi=variant == "ctx-multi")
        paid = learning_ctx.paid_summary(rows)
        others = {label: other_fast(label, q) for label, q in points[-1].p.items() if judged(label)} if points else {}
    outcome = Outcome(variant=variant, processes=processes, credit=credit, steps=settings.steps,
                      seconds=time.monotonic() - started, curve=points, final=final, hack_or_copy_won=won,
                      passed=not reasons, reasons=reasons, others=others, paid=paid)
    (folder / "curve.json").write_text(json.dumps(asdict(outcome), indent=1))
    print_curve(outcome)
    return outcome


def print_curve(o: Outcome) -> None:
    every = sorted(o.curve[0].p) if o.curve else []
    labels = [label for label in every if judged(label)]
    print(f"  P(right answer) by step ({', '.join(f'{label}: {right_answer(label)}' for label in labels)}); "
          "sampled share of fast answers the step before:")
    for pt in o.curve:
        row = "  ".join(f"{pt.p[label][right_answer(label)]:.2f}" if label in pt.p else " -  " for label in labels)
        top = ",".join(max(pt.p[label], key=pt.p[label].__getitem__) if label in pt.p else "-" for label in labels)
        fast = sum(v for k, v in pt.sampled.items() if k == "fast" or k.startswith("fast_"))
        print(f"  step {pt.step:4d}: {row}   most likely: {top}   sampled fast {fast:.2f}")
    shown = [label for label in every if not judged(label)]
    if shown:
        print("  not judged, P(right answer) at the end: "
              + ", ".join(f"{label} ({right_answer(label)}) {o.curve[-1].p[label][right_answer(label)]:.2f}"
                          for label in shown))
    if o.paid:
        print(f"  mean paid on its own task, by kind of answer: {o.paid}")
    verdict = "PASS" if o.passed else "FAIL: " + "; ".join(o.reasons)
    print(f"  {o.variant}-turn on {o.processes} process(es): {verdict} ({o.seconds:.0f} s)", flush=True)


def summary_of(o: Outcome) -> str:
    if o.variant.startswith("ctx"):
        own = ", ".join(f"{label} {q:.2f}" for label, q in sorted(o.final.items()))
        other = ", ".join(f"{label} {q:.2f}" for label, q in sorted(o.others.items()))
        paid = "hold" if o.passed or not any(r for r in o.reasons if "paid" in r or "copy" in r) else "broken"
        return (f"{o.variant} x{o.processes}: P(own fast) {own}; P(another task's fast) {other}; paid-order checks "
                f"{paid}" + (" PASS" if o.passed else " FAIL"))
    return (f"{o.variant}-turn x{o.processes}: P(right answer) "
            + ", ".join(f"{label} ({right_answer(label)}) {q:.2f}" for label, q in sorted(o.final.items()))
            + f" (largest gap in P(fast) between prompts {prompt_gap(o):.2f})" + (" PASS" if o.passed else " FAIL"))


def run_mutants(args: argparse.Namespace, settings: Any, processes: int) -> int:
    """The ctx check against each sabotaged copy of the package: passes when every one fails."""
    results = []
    for i, mutant in enumerate(learning_ctx.MUTANTS):
        root = learning_ctx.sabotaged(args.kernelrl_root.resolve(), args.out / "mutants" / f"m{i}", mutant)
        print(f"mutant {i + 1}/{len(learning_ctx.MUTANTS)}: {mutant.name} ({mutant.path}), {mutant.variant}", flush=True)
        o = run_variant(args.out, variant=mutant.variant, processes=processes, credit=args.credit,
                        settings=settings(mutant.variant), root=root, name=f"mutant-{i}-{mutant.variant}-p{processes}",
                        crash_fails=True)
        results.append((mutant, o))
    for mutant, o in results:
        said = "FAILS, as it must" if not o.passed else "PASSES: the check cannot see this sabotage"
        print(f"mutant {mutant.name}: {said}" + (f" ({'; '.join(o.reasons)[:600]})" if o.reasons else ""))
    caught = sum(not o.passed for _, o in results)
    print(f"learning check mutants: {caught} of {len(results)} sabotaged runs fail"
          + (" PASS" if caught == len(results) else " FAIL"))
    return 0 if caught == len(results) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variants", default="single,multi",
                    help="single, multi, read, ctx, ctx-multi (comma-separated; read: turn 2 must follow turn 1's "
                         "verdict; ctx: each task's fast answer is wrong on the others, and what every answer was "
                         "paid is checked)")
    ap.add_argument("--processes", default="1", help="process counts to run, comma-separated (1, 2)")
    ap.add_argument("--steps", type=int, help="GRPO steps per run (default: the variant's, see SETTINGS)")
    ap.add_argument("--credit", choices=("turn", "group"), default="turn",
                    help="multi-turn credit: centred per turn index (turn) or TRL's over all turns (group)")
    ap.add_argument("--lr", type=float, help="the policy's learning rate (default: the variant's)")
    ap.add_argument("--window", type=int,
                    help="the policy's attention window in tokens (0: the whole prompt; default: the variant's)")
    ap.add_argument("--episodes", type=int, help="episodes (answers, single-turn) per group (default: the variant's)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "learning_check", help="where runs and curves go")
    ap.add_argument("--kernelrl-root", type=Path, default=ROOT,
                    help="train with the kernelrl of this checkout (the check's own code builds and reads)")
    ap.add_argument("--mutants", action="store_true",
                    help="run the ctx check against sabotaged copies of the package (benchmarks/learning_ctx.py); "
                         "passes only when every one fails (on the largest --processes)")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants takes {', '.join(VARIANTS)} (comma-separated)")
    try:
        processes = [int(p) for p in args.processes.split(",")]
    except ValueError:
        ap.error("--processes takes numbers, e.g. 1,2")
    if any(p < 1 for p in processes) or (args.steps is not None and args.steps < 1):
        ap.error("--processes and --steps must be at least 1")
    if args.window is not None and args.window < 0:
        ap.error("--window must be 0 (the whole prompt) or a number of tokens")
    if args.episodes is not None and args.episodes < 2:
        ap.error("--episodes must be at least 2 (a group of one gives no gradient)")
    if args.lr is not None and args.lr <= 0:
        ap.error("--lr must be above 0")

    def settings(variant: str) -> Settings:
        base = SETTINGS[variant]
        window = base.window if args.window is None else (args.window or None)
        return Settings(steps=args.steps or base.steps, lr=args.lr or base.lr, window=window,
                        episodes=args.episodes or base.episodes)

    if args.mutants:
        return run_mutants(args, settings, max(processes))
    outcomes = [run_variant(args.out, variant=v, processes=p, credit=args.credit, settings=settings(v),
                            root=args.kernelrl_root.resolve())
                for v in variants for p in processes]
    print(f"learning check: {'; '.join(summary_of(o) for o in outcomes)}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
