"""Through the real evaluator: a server with one CPU lane judges the tiny task's candidates."""

from __future__ import annotations

from serve_helpers import TINY_CORRECT, TINY_WRONG, TOKEN, fast_client

from kernelrl.result import EvalResult, Status


def test_verdicts_through_the_server(real_server, tiny_task) -> None:
    client = fast_client(real_server.url, token=TOKEN, wait_s=10.0)
    right, wrong, again = client.evaluate_batch([(tiny_task, TINY_CORRECT), (tiny_task, TINY_WRONG),
                                                 (tiny_task, TINY_CORRECT)])
    assert right.status is Status.CORRECT and right.speedup is not None and right.speedup > 0
    assert right.task == tiny_task.name and right.cand_time is not None
    assert wrong.status is Status.INCORRECT and wrong.speedup is None
    assert again.to_dict() == right.to_dict()  # one program, one verdict
    # The wire format is EvalResult.to_dict(): it round-trips.
    assert EvalResult.from_dict(right.to_dict()).to_dict() == right.to_dict()
    text = client.metrics()
    assert 'kernelrl_serve_evaluations_total{status="correct"}' in text


def test_task_profiles_through_the_server(real_server, tiny_task) -> None:
    from kernelrl.tasks.task import Task, TaskError

    client = fast_client(real_server.url, token=TOKEN, wait_s=10.0)
    profile = client.profile(tiny_task)
    assert profile is not None and profile.inputs and profile.inputs[0].startswith("float32[")
    assert profile.constants and profile.min_bytes > 0
    broken = Task(name="broken", source=tiny_task.source.replace("def get_inputs():",
                                                                 "raise RuntimeError('broken task')\n\ndef get_inputs():"))
    import pytest

    with pytest.raises(TaskError, match="broken task"):
        client.profile(broken)
