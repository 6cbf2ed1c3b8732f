"""Sizing an evaluation before anything is built: what a worker and the judge hold, and when a task
is too large for this machine (the input plans themselves are tested through the evaluator)."""

from __future__ import annotations

from kernelrl.judge.inputs import MemoryNeed, available_memory, memory_need, too_large

GIB = 1 << 30


def test_a_worker_holds_about_one_set_whatever_the_number_of_sets():
    one = memory_need(input_bytes=GIB, output_bytes=GIB, param_bytes=0, n_sets=5, pool_size=1)
    many = memory_need(input_bytes=GIB, output_bytes=GIB, param_bytes=0, n_sets=50, pool_size=1)
    assert one.worker == many.worker == 6 * GIB  # a set, its clone, two outputs, a pool input and its noise
    assert many.judge - one.judge == 45 * 2 * GIB  # the judge keeps every set's inputs and outputs


def test_too_large_names_the_limit_it_passes():
    need = MemoryNeed(worker=10 * GIB, judge=20 * GIB)
    assert too_large(need, available=None, worker_cap=None) is None
    assert too_large(need, available=64 * GIB, worker_cap=16 * GIB) is None
    capped = too_large(need, available=None, worker_cap=8 * GIB)
    assert capped is not None and "10.0 GiB" in capped and "8.0 GiB cap" in capped
    short = too_large(need, available=32 * GIB, worker_cap=None)
    assert short is not None and "40.0 GiB" in short and "32.0 GiB is available" in short


def test_available_memory_reads_this_machine():
    got = available_memory()
    assert got is None or got > 0


def test_a_task_too_large_is_a_task_error_before_any_set_or_build(tiny_task, quick_config):
    import dataclasses
    import time

    from kernelrl.judge.evaluator import EvalConfig, evaluate
    from kernelrl.result import Status

    # 2**22 rows of 256 floats: 4 GiB per input, sized on the meta device; a 2 GiB cap per worker.
    config = EvalConfig(**{**quick_config.__dict__, "constants": {"batch_size": 1 << 22},
                           "sandbox": dataclasses.replace(quick_config.sandbox, memory_limit_gib=2.0)})
    source = tiny_task.source.replace("class Model(", "class ModelNew(")
    t0 = time.monotonic()
    res = evaluate(tiny_task, source, config)
    assert res.status is Status.TASK_ERROR and "too large" in res.message and "2.0 GiB cap" in res.message
    assert time.monotonic() - t0 < 60  # no 4 GiB set was made
