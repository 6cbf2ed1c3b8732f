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


def test_a_refinement_session_through_the_real_evaluator(real_server, tiny_task) -> None:
    client = fast_client(real_server.url, token=TOKEN, wait_s=10.0)
    with client.open_session(tiny_task, turns=2) as session:
        first = session.prompt()
        assert "float32[64, 256]" in first and "return torch.relu(x) * 2.0 + self.bias" in first  # the server's profile
        wrong = session.step(f"Drop the relu.\n\n```python\n{TINY_WRONG}```\n")
        assert wrong.status == "incorrect" and wrong.verdict is not None and wrong.verdict.startswith("Incorrect:")
        assert "seed" not in wrong.verdict.lower() and "/" not in wrong.verdict.split(":", 1)[1]
        assert wrong.prompt is not None and wrong.verdict in wrong.prompt and "Turn 2 of 2" in wrong.prompt
        right = session.step(candidate=TINY_CORRECT)
        assert right.status == "correct" and right.done and right.speedup is not None
        assert right.reward is not None and wrong.reward is not None and right.reward > wrong.reward
        state = session.state()
    assert state.closed is False and state.done and len(state.returns) == 2
    assert client.session(session.id).closed
