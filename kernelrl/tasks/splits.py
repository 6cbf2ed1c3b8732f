"""Train / validation / test split of tasks: decided once, recorded, reproducible.

Which tasks are split: the built-in suite and KernelBench (a checkout loaded as a folder: its
tasks are named `levelN/<number>_<Name>`). Tasks from any other file or folder are the user's
own and have no split (`Split.UNSPLIT`): every command takes them.

- **Built-in tasks**: `RECORDED` below is the split, written once. It was made by `stratified`
  (per folder, tasks ordered by `unit(name)`, the lowest `max(1, round(0.2 n))` to test, the
  next `round(0.1 n)` to validation), so each level has test tasks; a test checks the record
  still equals that rule over the recorded names, so it cannot drift silently. A built-in task
  added later and not recorded falls back to the per-name rule below.
- **KernelBench** (and unrecorded built-ins): per name, `unit(name) < 0.2` is test, `< 0.3`
  validation, else train. It depends on the name alone, so a checkout with more or fewer
  problems never moves a task from one split to another.

`unit(name)` is SHA-256 of `SEED:name` read as a number in [0, 1): the same on every machine.

Who uses it: training (`kernelrl train`, `kernelrl collect`) keeps only the splits it is given
(train by default) and refuses test tasks outright; `kernelrl bench` evaluates the test split
unless told otherwise.

Guarantees: `split_of` is a pure function of the task's name and where it came from; a
built-in task's file loaded by its path (or an exact copy of it) has the built-in's split.

Does not load tasks (`kernelrl.tasks.suites` does) and cannot recognise an edited copy of a
test task, or a KernelBench problem copied out of its checkout under another name.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable, Sequence
from functools import cache

from kernelrl.tasks.suites import load_suite
from kernelrl.tasks.task import Task, TaskError

SEED = "kernelrl-split-1"
TEST_SHARE = 0.2
VALIDATION_SHARE = 0.1
_KERNELBENCH_NAME = re.compile(r"^level\d+/\d+_\w")


class Split(enum.StrEnum):
    TRAIN = "train"
    VALIDATION = "validation"
    TEST = "test"
    UNSPLIT = "unsplit"  # the user's own task: not part of any split


class SplitError(TaskError):
    """A command was given tasks its split does not allow (training on test tasks)."""


# The built-in suite's split, recorded when it was made (see the module docstring).
_TEST = ("level1/matmul_batched", "level1/matvec", "level1/softmax", "level2/linear_bias_gelu_scale",
         "level3/conv_block", "operators/shift_group_quant")
_VALIDATION = ("level1/sum_dim", "operators/sparse_delta_linear")
_TRAIN = ("level1/argmax_dim", "level1/conv2d", "level1/cumsum", "level1/gelu", "level1/layernorm",
          "level1/matmul_square", "level1/matmul_transposed_b", "level1/maxpool2d", "level1/rmsnorm",
          "level1/scaled_residual_add", "level2/conv2d_batchnorm_relu", "level2/layernorm_residual",
          "level2/linear_swish_rowsum", "level2/matmul_scale_softmax", "level3/attention_block", "level3/mlp_block",
          "level3/transformer_encoder_layer", "operators/block_sparse_decode", "operators/heat3d_stencil",
          "operators/kv_vq_anchor_attention", "operators/l1_norm_layer")
RECORDED: dict[str, Split] = {**{n: Split.TRAIN for n in _TRAIN}, **{n: Split.VALIDATION for n in _VALIDATION},
                              **{n: Split.TEST for n in _TEST}}


def unit(name: str) -> float:
    """The task's place in [0, 1): SHA-256 of `SEED:name`."""
    return int(hashlib.sha256(f"{SEED}:{name}".encode()).hexdigest()[:15], 16) / 16**15


def by_name(name: str) -> Split:
    x = unit(name)
    return Split.TEST if x < TEST_SHARE else Split.VALIDATION if x < TEST_SHARE + VALIDATION_SHARE else Split.TRAIN


def stratified(names: Iterable[str]) -> dict[str, Split]:
    """Per folder (`level1/...`), the lowest `unit`s to test, the next to validation."""
    folders: dict[str, list[str]] = {}
    for name in names:
        folders.setdefault(name.split("/", 1)[0], []).append(name)
    out: dict[str, Split] = {}
    for members in folders.values():
        members.sort(key=unit)
        n_test = max(1, round(TEST_SHARE * len(members)))
        n_val = round(VALIDATION_SHARE * len(members))
        for i, name in enumerate(members):
            out[name] = Split.TEST if i < n_test else Split.VALIDATION if i < n_test + n_val else Split.TRAIN
    return out


def is_split(task: Task) -> bool:
    return task.suite in ("builtin", "KernelBench") or bool(_KERNELBENCH_NAME.match(task.name))


def split_of(task: Task) -> Split:
    if task.suite == "builtin":
        return RECORDED.get(task.name) or by_name(task.name)
    if is_split(task):
        return by_name(f"kernelbench:{task.name}")
    copied = _builtin_sources().get(task.source_hash)
    return split_of(copied) if copied is not None else Split.UNSPLIT


def split_of_name(name: str) -> Split:
    """The split of a task known only by name (an SFT set's row): a recorded built-in name, a
    KernelBench name, else unsplit."""
    if name in RECORDED:
        return RECORDED[name]
    if _KERNELBENCH_NAME.match(name):
        return by_name(f"kernelbench:{name}")
    return Split.UNSPLIT


@cache
def _builtin_sources() -> dict[str, Task]:
    """A built-in task's file loaded by its path is still that task."""
    return {t.source_hash: t for t in load_suite("builtin")}


def select(tasks: Sequence[Task], splits: Iterable[Split | str]) -> tuple[list[Task], dict[Split, list[str]]]:
    """The tasks of `splits` (and every unsplit one), and the names left out by their split."""
    wanted = {Split(s) for s in splits}
    kept: list[Task] = []
    left: dict[Split, list[str]] = {}
    for t in tasks:
        s = split_of(t)
        if s is Split.UNSPLIT or s in wanted:
            kept.append(t)
        else:
            left.setdefault(s, []).append(t.name)
    return kept, left


def for_training(tasks: Sequence[Task], splits: Iterable[Split | str] = (Split.TRAIN,)
                 ) -> tuple[list[Task], dict[Split, list[str]]]:
    """`select` for training: asking for the test split is a `SplitError`, and so is nothing left."""
    splits = [Split(s) for s in splits]
    if Split.TEST in splits:
        raise SplitError("training refuses test tasks: the test split is for `kernelrl bench` only")
    kept, left = select(tasks, splits)
    if not kept:
        gone = "; ".join(f"{s.value}: {', '.join(names)}" for s, names in left.items())
        raise SplitError(f"no task left to train on: every task given is outside the {'/'.join(splits)} split "
                         f"({gone}); training refuses test tasks")
    return kept, left
