"""The train / validation / test split: recorded for the built-in suite, reproducible from the
names, stable when a checkout grows, and training refuses test tasks."""

from __future__ import annotations

from collections import Counter

import pytest

from kernelrl.tasks.splits import (
    RECORDED,
    Split,
    SplitError,
    by_name,
    for_training,
    select,
    split_of,
    split_of_name,
    stratified,
)
from kernelrl.tasks.suites import load_suite, load_tasks
from kernelrl.tasks.task import Task, load_task_dir

KB_TASK = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * {k}\n" \
          "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n"


def test_the_builtin_split_is_recorded_and_follows_its_rule():
    names = {t.name for t in load_suite("builtin")}
    assert set(RECORDED) == names  # a new built-in task is recorded on purpose, not drawn silently
    assert stratified(RECORDED) == RECORDED
    by_folder = Counter((name.split("/")[0], s) for name, s in RECORDED.items())
    for folder in ("level1", "level2", "level3", "operators"):
        assert by_folder[(folder, Split.TEST)] >= 1 and by_folder[(folder, Split.TRAIN)] >= 3
    assert split_of(load_tasks(["level1/gelu"])[0]) is Split.TRAIN
    assert split_of(load_tasks(["level1/softmax"])[0]) is Split.TEST


def test_a_builtin_file_loaded_by_path_keeps_its_split_and_own_tasks_have_none(tiny_task):
    by_path = load_tasks(["kernelrl/tasks/builtin/level1/softmax.py"])[0]
    assert by_path.suite != "builtin" and split_of(by_path) is Split.TEST
    assert split_of(tiny_task) is Split.UNSPLIT


def kernelbench_checkout(root, problems: int):
    for i in range(1, problems + 1):
        folder = root / "KernelBench" / f"level{1 + i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}_Scale{i}.py").write_text(KB_TASK.format(k=i))
    return root


def test_kernelbench_splits_by_name_and_a_grown_checkout_moves_no_task(tmp_path):
    small = load_task_dir(kernelbench_checkout(tmp_path / "a", 40))
    big = load_task_dir(kernelbench_checkout(tmp_path / "b", 80))
    assert {t.suite for t in small} == {"KernelBench"} and small[0].name.startswith("level")
    first = {t.name: split_of(t) for t in small}
    assert all(split_of(t) is first[t.name] for t in big if t.name in first)
    counts = Counter(split_of(t) for t in big)
    assert counts[Split.TEST] > 0 and counts[Split.VALIDATION] > 0 and counts[Split.TRAIN] > counts[Split.TEST]
    assert all(split_of_name(t.name) is split_of(t) for t in big)  # an SFT row's task name alone


def test_training_refuses_test_tasks(tiny_task):
    tasks = load_tasks(["builtin"]) + [tiny_task]
    kept, left = for_training(tasks)
    assert {split_of(t) for t in kept} == {Split.TRAIN, Split.UNSPLIT} and tiny_task in kept
    assert sorted(left[Split.TEST]) == sorted(n for n, s in RECORDED.items() if s is Split.TEST)
    with pytest.raises(SplitError, match="training refuses test tasks"):
        for_training(tasks, ["train", "test"])
    with pytest.raises(SplitError, match="no task left to train on.*level1/softmax"):
        for_training(load_tasks(["level1/softmax"]))
    assert {t.name for t in select(tasks, ["test"])[0]} == {
        *(n for n, s in RECORDED.items() if s is Split.TEST), tiny_task.name}


def test_the_rule_is_a_function_of_the_name():
    assert by_name("level1/99_Anything") is by_name("level1/99_Anything")
    assert split_of(Task(name="level1/3_Foo", source="")) is by_name("kernelbench:level1/3_Foo")
