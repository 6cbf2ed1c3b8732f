"""The learning check's `ctx` variants and its mutation gate (used by benchmarks/learning_check.py).

`ctx`: three tasks, tanh(x @ W), sigmoid(x @ W) and relu(x @ W), whose fastest answers differ: a
fast program of one op is *incorrect* (it runs, and computes another function) on the others. The
menu, the same for every task (15 answers, chance 1/15):

    no_code, broken                  an answer without a program; a program that does not parse
    hack                             the fast tanh program reading the judge's environment: refused
                                     statically on every task (flagged)
    fast_<op> x3                     4 repeats of the op: ~8x on its own task, incorrect elsewhere
    slow_<op> x3                     32 repeats, the reference's own work: ~1x (within noise)
    copy_<op> x3                     the task's shown best (the op once, no loop: ~32x), verbatim
    near_<op> x3                     that version with edits that change nothing it computes
                                     (renamed, reordered, `torch.matmul`, a temporary, `pass`, an
                                     unused import, `.tanh()` for `torch.tanh`)

Every prompt is the real `build_prompt`'s, from a template folder whose `prompt.txt` is the
built-in one with one last line naming the task ("Answer for task ctx_tanh."), a line the policy's
tokenizer holds as one token; the policy attends to its last token only (`--window 1`), so the
line is all it reads, and it can be right on every task only by reading it. The shown best stays
the best version (32x against fast's 8x), so the prompt the policy reads does not change, and its
copies, verbatim or near, are paid at most as no speedup (the copy rule, by behaviour).

`ctx-multi`: the same tasks and menu in two-turn episodes, plus `triton_tanh` (tanh by a Triton
kernel after torch's matmul): on a CPU Triton runs under its interpreter and cannot be timed, so
on the tanh task it has no reward (None); elsewhere it is incorrect. A turn 1 whose turn 2 was
that answer has no return, and must train on nothing. Turn 2's prompt ends with the task line
too (`turn_history.txt`).

What every answer was paid is read back from the run's database (`paid_checks`): hack < no code
<= every failure < every correct (raw rewards and paid values); copies and near-copies paid at
most the no-speedup reward, and marked copies; within every reward batch (a step's rows of one task;
of one turn in `ctx-multi`), every slow answer paid below every fast one, and identical programs
paid identically (their raw rewards over the whole run); no
answer paid above its raw reward (the clip never lifts); and in `ctx-multi`, no turn credited
whose episode has a later turn without a reward.

`mutants()`: sabotaged copies of the package, each a one-place source edit that must apply
exactly: the copy rule off, the two-sided clip restored, the ranks' rewards gathered in the wrong
order (each rank's block paid another rank's rewards), and a missing turn-2 reward counted as 0
(`ctx-multi`). `--mutants` runs the check against each and passes only when every one fails.
"""

from __future__ import annotations

import shutil
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OPS = ("tanh", "sigmoid", "relu")
CTX_TASKS = {f"ctx_{op}": (256, 256, op) for op in OPS}
TASK_LINE = "Answer for task {name}."


def task_line(name: str) -> str:
    return TASK_LINE.format(name=name) + "\n"


def once(op: str, *, gain: str | None = None) -> str:
    """The op applied once, written without a loop: each task's shown best (~32x)."""
    args = {None: "n", "optional": "n, gain=1.0", "required": "n, gain"}[gain]
    return (f'import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    """{op}(x @ W), once."""\n\n'
            f"    def __init__(self, {args}):\n        super().__init__()\n"
            + ("        self.gain = gain\n" if gain else "")
            + "        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)\n\n"
            f"    def forward(self, x):\n        return torch.{op}(x @ self.weight)"
            + (" * self.gain" if gain else "") + "\n")


def near_copy(op: str) -> str:
    """`once(op)` with edits that change nothing it computes."""
    return ("import torch.nn as tnn\nimport torch\nimport math\n\n\nclass ModelNew(tnn.Module):\n"
            "    def forward(self, inp):\n        if False:\n            inp = inp * 2\n"
            f"        out = torch.matmul(inp, self.w).{op}()\n        return out\n\n"
            "    def __init__(self, size):\n        super(ModelNew, self).__init__()\n        pass\n"
            "        self.w = tnn.Parameter(torch.randn(size, size) / size ** 0.5)\n")


TRITON_TANH = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    e = tl.exp(2.0 * tl.load(x_ptr + offs, mask=mask))
    tl.store(out_ptr + offs, (e - 1.0) / (e + 1.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        y = (x @ self.weight).contiguous()
        out = torch.empty_like(y)
        _tanh_kernel[(triton.cdiv(y.numel(), 1024),)](y, out, y.numel(), BLOCK=1024)
        return out
'''


def ctx_menu(program: Any, variant: str) -> dict[str, str]:
    """The answers of `ctx` (and `ctx-multi`, with `triton_tanh`); `program(repeats, op=...)` writes a loop."""
    peek = "        self.key = os.environ.get('KERNELRL_SEED', '')\n"  # looking for the judge's seeds
    hack = program(4).replace("import torch\n", "import os\n\nimport torch\n", 1).replace(
        "        super().__init__()\n", "        super().__init__()\n" + peek, 1)
    out: dict[str, str] = {"no_code": "", "broken": "import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                                                    "    def forward(self, x:\n        return x\n", "hack": hack}
    for op in OPS:
        out[f"fast_{op}"] = program(4, op=op)
        out[f"slow_{op}"] = program(32, op=op)
        out[f"copy_{op}"] = once(op)
        out[f"near_{op}"] = near_copy(op)
    if variant == "ctx-multi":
        out["triton_tanh"] = TRITON_TANH
    return out


def own_op(task: str) -> str:
    return task.split("@")[0].removeprefix("ctx_")


def write_templates(folder: Path, builtin: Path) -> Path:
    """The template folder: the built-in prompt with the task line last; the turn-2 history too."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompt.txt").write_text((builtin / "prompt.txt").read_text().rstrip("\n")
                                       + "\n\n" + TASK_LINE.format(name="$task_name") + "\n")
    (folder / "turn_history.txt").write_text((builtin / "turn_history.txt").read_text().rstrip("\n")
                                             + "\n" + TASK_LINE.format(name="$task_name") + "\n")
    return folder


# -- what every answer was paid, read from the database ----------------------------------------------


@dataclass(frozen=True)
class Row:
    step: int
    task: str
    kind: str
    status: str
    hash: str
    raw: float | None
    value: float | None
    copy: bool
    episode: int | None
    turn: int | None
    credit: float | None


FAILURES = {"compile_error", "runtime_error", "incorrect", "timeout"}


def paid_checks(rows: list[Row], *, no_speedup: float, multi: bool) -> list[str]:
    """What is wrong with what the run paid (empty: nothing); see the module docstring."""
    reasons: list[str] = []

    def paid(r: Row) -> float | None:
        return r.value if r.value is not None else r.raw

    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        v = paid(r)
        if v is None:
            continue
        cls = ("hack" if r.status == "flagged" else "no_code" if r.status == "no_code"
               else "failure" if r.status in FAILURES else "correct" if r.status == "correct" else None)
        if cls:
            groups[cls].append(v)
    order = ["hack", "no_code", "failure", "correct"]
    for lo, hi, strict in (("hack", "no_code", True), ("no_code", "failure", False), ("failure", "correct", True)):
        if groups[lo] and groups[hi] and (max(groups[lo]) >= min(groups[hi]) if strict
                                          else max(groups[lo]) > min(groups[hi])):
            reasons.append(f"paid order broken: a {lo} answer paid {max(groups[lo]):+.3f}, a {hi} one "
                           f"{min(groups[hi]):+.3f} (must be {' < '.join(order)})")
    for r in rows:
        if r.status == "correct" and r.kind.startswith(("copy_", "near_")):
            v = paid(r)
            if v is not None and v > no_speedup + 1e-9:
                reasons.append(f"step {r.step}: {r.kind} on {r.task} paid {v:+.3f}, above the no-speedup reward "
                               f"{no_speedup:+.3f}")
                break
            if not r.copy:
                reasons.append(f"step {r.step}: {r.kind} on {r.task} (correct) was not recorded as a copy")
                break
    lifted = [r for r in rows if r.raw is not None and r.value is not None and r.value > r.raw + 1e-9]
    if lifted:
        r = lifted[0]
        reasons.append(f"{len(lifted)} answer(s) paid above their raw reward (step {r.step}: {r.kind} raw "
                       f"{r.raw:+.3f} paid {r.value:+.3f}): the clip lifted them")
    # one reward batch: a step's rows of one task (in multi-turn, of one turn: each turn is its own batch,
    # clipped to the window as the step's earlier turns left it)
    by_step: dict[tuple[int, int, str], list[Row]] = defaultdict(list)
    for r in rows:
        by_step[(r.step, r.turn or 1, r.task)].append(r)
    for (step, _, task), batch in sorted(by_step.items()):
        op = own_op(task)
        slow = [v for r in batch if r.kind == f"slow_{op}" and r.status == "correct" and (v := paid(r)) is not None]
        fast = [v for r in batch if r.kind == f"fast_{op}" and r.status == "correct" and (v := paid(r)) is not None]
        if slow and fast and max(slow) >= min(fast):
            reasons.append(f"step {step} on {task}: a slow answer paid {max(slow):+.3f}, a fast one {min(fast):+.3f}")
            break
    for (step, _, task), batch in sorted(by_step.items()):
        same: dict[str, set[float]] = defaultdict(set)
        for r in batch:
            if r.value is not None:
                same[r.hash].add(round(r.value, 9))
        split = [h for h, vs in same.items() if len(vs) > 1]
        if split:
            kinds = sorted({r.kind for r in batch if r.hash in split})
            reasons.append(f"step {step} on {task}: identical programs ({', '.join(kinds)}) paid differently")
            break
    raws: dict[tuple[str, str], set[float]] = defaultdict(set)
    for r in rows:
        if r.raw is not None:
            raws[(r.task, r.hash)].add(round(r.raw, 9))
    if any(len(vs) > 1 for vs in raws.values()):
        reasons.append("identical programs were given different raw rewards over the run")
    if multi:
        episodes: dict[int, list[Row]] = defaultdict(list)
        for r in rows:
            if r.episode is not None:
                episodes[r.episode].append(r)
        for n, turns in sorted(episodes.items()):
            turns.sort(key=lambda r: r.turn or 0)
            missing = [r.turn or 0 for r in turns if r.raw is None and r.status != "no_code"]
            if missing and any(r.credit is not None for r in turns if (r.turn or 0) < max(missing)):
                reasons.append(f"episode {n}: turn {max(missing)} has no reward, yet an earlier turn was credited")
                break
    return reasons


def read_rows(db_path: Path, kind_of: Any) -> list[Row]:
    from kernelrl.store import Database

    with Database(db_path, readonly=True) as db:
        cands = [c for c in db.candidates() if c.proposer != "seed"]
    return [Row(step=c.step, task=c.task, kind=kind_of(c.answer) or "?",
                status=c.result.status.value if c.result else "none", hash=c.hash, raw=c.meta.raw,
                value=c.meta.reward, copy=bool(c.meta.copy), episode=c.meta.episode, turn=c.meta.turn,
                credit=c.meta.credit) for c in cands]


def paid_summary(rows: list[Row]) -> str:
    """Mean paid per kind on its own task, for the report."""
    by: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        v = r.value if r.value is not None else r.raw
        op = r.kind.rsplit("_", 1)[-1]
        if v is not None and (op == own_op(r.task) or op not in OPS):
            by[r.kind.rsplit("_", 1)[0] if op in OPS else r.kind].append(v)
    return ", ".join(f"{k} {statistics.fmean(v):+.2f}" for k, v in sorted(by.items()))


# -- the mutation gate ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    name: str
    variant: str
    path: str  # in the package
    old: str
    new: str


MUTANTS = (
    Mutant("copy rule off", "ctx", "kernelrl/train/copies.py",
           "        if code is None or result is None or result.status is not Status.CORRECT or result.speedup is None:\n"
           "            return None\n",
           "        return None\n"),
    Mutant("two-sided clip restored", "ctx", "kernelrl/reward.py",
           "value = reward.raw if band is None else min(reward.raw, band[1])",
           "value = reward.raw if band is None else min(max(reward.raw, band[0]), band[1])"),
    Mutant("ranks' rewards gathered in the wrong order", "ctx", "kernelrl/train/reward_fn.py",
           "            every = self.ranks.gather(mine)\n",
           "            every = self.ranks.gather(mine)\n"
           "            half = len(every) // 2\n"
           "            every = [__import__('dataclasses').replace(s, reward=t.reward, excluded=t.excluded)\n"
           "                     for s, t in zip(every, every[half:] + every[:half])]\n"),
    Mutant("a missing turn-2 reward counted as 0", "ctx-multi", "kernelrl/episodes/episode.py",
           "        if r is None:\n            break\n",
           "        if r is None:\n            later = 0.0\n            continue\n"),
)


def sabotaged(root: Path, into: Path, mutant: Mutant) -> Path:
    """A copy of the package with `mutant`'s edit applied (it must apply exactly once)."""
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(root / "kernelrl", into / "kernelrl", ignore=shutil.ignore_patterns("__pycache__"))
    target = into / mutant.path
    text = target.read_text()
    if text.count(mutant.old) != 1:
        raise SystemExit(f"learning check: mutant {mutant.name!r} does not apply to {mutant.path} "
                         f"(found {text.count(mutant.old)} times): the code moved; update the mutant")
    target.write_text(text.replace(mutant.old, mutant.new))
    return into
