"""Device memory: whose an out-of-memory error is, decided from a fake device's figures, and the
correctness run that retries once (a fake worker standing for one on a GPU)."""

from __future__ import annotations

import pytest

from kernelrl.candidate import Candidate
from kernelrl.judge import trial as T
from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.devmem import PROMISED_SHARE, Blame, DeviceMemory, blame
from kernelrl.judge.isolation.exchange import Answer
from kernelrl.result import Status

GIB = 1 << 30


def _device(*, others: float, own: float, total: float = 80.0) -> DeviceMemory:
    return DeviceMemory(free_bytes=int((total - others - own) * GIB), total_bytes=int(total * GIB), own_bytes=int(own * GIB))


def test_others_holding_more_than_the_promised_share_make_it_the_judges():
    assert blame(_device(others=60, own=1)) is Blame.JUDGE  # 20 of 80 GiB left for the program
    assert blame(_device(others=80 * (1 - PROMISED_SHARE) - 1, own=39)) is Blame.CANDIDATE  # it had its share


def test_without_device_figures_it_is_the_programs():
    # On a CPU a program can raise the error itself: it must not turn a failure into a judge error.
    assert blame(None) is Blame.CANDIDATE
    assert blame(DeviceMemory(free_bytes=0, total_bytes=0, own_bytes=0)) is Blame.CANDIDATE


def test_what_others_hold_is_what_is_neither_free_nor_the_workers():
    assert _device(others=30, own=10).others_bytes == 30 * GIB
    assert DeviceMemory(free_bytes=5, total_bytes=4, own_bytes=3).others_bytes == 0  # figures read at two moments


class _FakeWorker:
    """Answers correctness runs from a script: out-of-memory errors with a device's figures, then a run."""

    def __init__(self, answers: list[Answer]):
        self.answers = answers
        self.runs = 0

    def request(self, header: P.Header, payload: object = None, *, deadline: float | None = None) -> Answer:
        assert isinstance(header, P.Run)
        self.runs += 1
        return self.answers.pop(0)


def _oom(memory: DeviceMemory) -> Answer:
    return Answer(P.Kind.ERROR, P.Error(phase=P.Phase.RUN, message="OutOfMemoryError: CUDA out of memory",
                                        out_of_memory=True, device_free_bytes=memory.free_bytes,
                                        device_total_bytes=memory.total_bytes, device_own_bytes=memory.own_bytes))


def _ran(peak: int) -> Answer:
    return Answer(P.Kind.RAN, P.Ran(state_after={}, thread_rises=[0], child_rises=[0], changed_after_return=[False],
                                    inputs_changed=[False], peak_device_bytes=peak), {"outputs": [None]})


def _trial() -> T.Trial:
    return T.Trial(candidate=Candidate(source="class ModelNew: pass"))


def test_an_out_of_memory_run_runs_once_more_and_counts_if_it_then_fits():
    worker, trial = _FakeWorker([_oom(_device(others=70, own=1)), _ran(3 * GIB)]), _trial()
    ran = T._run(trial, worker, [], deadline=0.0)  # type: ignore[arg-type]
    assert not ran.failed and worker.runs == 2 and trial.found.peak_device_bytes == 3 * GIB


def test_twice_out_of_memory_while_others_held_the_device_is_a_judge_error():
    worker = _FakeWorker([_oom(_device(others=70, own=1)), _oom(_device(others=70, own=1))])
    with pytest.raises(T._End) as ended:
        T._run(_trial(), worker, [], deadline=0.0)  # type: ignore[arg-type]
    assert ended.value.verdict.status is Status.JUDGE_ERROR and "70.0 of its 80.0 GiB" in ended.value.verdict.message


def test_twice_out_of_memory_with_the_device_to_itself_is_the_programs_failure():
    worker = _FakeWorker([_oom(_device(others=2, own=70)), _oom(_device(others=2, own=70))])
    ran = T._run(_trial(), worker, [], deadline=0.0)  # type: ignore[arg-type]
    assert ran.failed and worker.runs == 2  # the caller ends it as the candidate's runtime_error


def test_an_error_without_device_figures_is_not_retried():
    plain = Answer(P.Kind.ERROR, P.Error(phase=P.Phase.RUN, message="OutOfMemoryError: raised by the program"))
    worker = _FakeWorker([plain])
    assert T._run(_trial(), worker, [], deadline=0.0).failed and worker.runs == 1  # type: ignore[arg-type]


def test_a_program_raising_the_error_on_a_cpu_gets_no_device_figures():
    import types

    import torch

    from kernelrl.judge.harness.worker import _failure

    error = _failure(types.SimpleNamespace(device="cpu"), torch.OutOfMemoryError("CUDA out of memory"))  # type: ignore[arg-type]
    assert not error.out_of_memory and error.device_total_bytes == 0 and "OutOfMemoryError" in error.message
