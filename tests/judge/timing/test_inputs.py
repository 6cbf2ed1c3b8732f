"""Sizing an evaluation before anything is built: what a worker and the judge hold, and when a task
is too large for this machine (the input plans themselves are tested through the evaluator)."""

from __future__ import annotations

import pytest

from kernelrl.judge.timing.inputs import MemoryNeed, available_memory, memory_need, too_large

pytestmark = pytest.mark.xdist_group("cpu_judge")  # see conftest.py

GIB = 1 << 30
NOISE = 32 << 20  # a pool input's noise at most: POOL_NOISE_ELEMENTS values of the widest dtype


def test_a_worker_holds_about_one_set_whatever_the_number_of_sets():
    one = memory_need(input_bytes=GIB, output_bytes=GIB, param_bytes=0, n_sets=5, pool_size=1)
    many = memory_need(input_bytes=GIB, output_bytes=GIB, param_bytes=0, n_sets=50, pool_size=1)
    # a pool set and its noise; then a call: its inputs, its output and the output's copy in the arena
    assert one.worker == many.worker == GIB + NOISE + 3 * GIB
    assert many.judge - one.judge == 45 * 2 * GIB  # the judge keeps every set's inputs and outputs


def test_a_judge_keeping_its_sets_in_files_needs_disk_for_them_and_its_heap_for_one():
    few = memory_need(input_bytes=GIB, output_bytes=GIB, param_bytes=0, n_sets=5, pool_size=1, in_files=True)
    many = memory_need(input_bytes=GIB, output_bytes=GIB, param_bytes=0, n_sets=50, pool_size=1, in_files=True)
    assert few.judge == many.judge == 4 * GIB  # the set arriving, and a spot check's two outputs
    assert many.disk - few.disk == 45 * 2 * GIB
    assert few.worker == memory_need(input_bytes=GIB, output_bytes=GIB, param_bytes=0, n_sets=5, pool_size=1).worker
    short = too_large(few, available=None, worker_cap=None, disk_free=4 * GIB)
    assert short is not None and "of disk" in short and "4.0 GiB is free" in short
    assert too_large(few, available=None, worker_cap=None, disk_free=None) is None


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


def test_a_set_that_outgrows_the_caches_is_timed_from_a_pool_of_one():
    from kernelrl.judge.timing.inputs import POOL_SET_BYTES, timing_pool_size

    assert timing_pool_size(3, POOL_SET_BYTES - 1) == 3
    assert timing_pool_size(3, POOL_SET_BYTES) == 1
    big = memory_need(input_bytes=GIB, output_bytes=GIB, param_bytes=0, n_sets=5,
                      pool_size=timing_pool_size(3, GIB))
    assert big.worker == GIB + NOISE + 3 * GIB  # with the configured pool of 3 it would be 2 GiB more and two noises
    mib = 1 << 20
    small = memory_need(input_bytes=mib, output_bytes=mib, param_bytes=0, n_sets=5, pool_size=3, n_inputs=2)
    assert small.worker == 3 * (mib + mib) + 3 * mib  # a small input's noise is its own size


def test_a_candidate_worker_is_given_room_for_one_set_not_all_of_them(tiny_task, quick_config, monkeypatch):
    """Correctness sends one set per message, so a candidate's arena (the memory it may pin) is
    sized to one set, and a task whose set outgrows the caches sends a timing pool of one set."""
    from kernelrl.judge.evaluator import evaluate
    from kernelrl.judge.isolation.sandbox import Worker
    from kernelrl.judge.reference import ReferenceSession
    from kernelrl.judge.timing import inputs
    from kernelrl.result import Status

    arenas: list[int] = []
    pools: list[int] = []
    size_arena, timing_pool = Worker.size_arena, ReferenceSession.timing_pool

    def record_arena(self, capacity):
        arenas.append(capacity)
        return size_arena(self, capacity)

    def record_pool(self, n):
        pools.append(n)
        return timing_pool(self, n)

    monkeypatch.setattr(Worker, "size_arena", record_arena)
    monkeypatch.setattr(ReferenceSession, "timing_pool", record_pool)
    monkeypatch.setattr(inputs, "POOL_SET_BYTES", 1 << 20)  # this task's 4 MiB set counts as large
    config = quick_config.__class__(**{**quick_config.__dict__, "constants": {"batch_size": 4096}})
    res = evaluate(tiny_task, tiny_task.source.replace("class Model(", "class ModelNew("), config)
    assert res.status is Status.CORRECT, res.message
    one_set = 4096 * 256 * 4  # the input; the output is as large
    assert arenas and max(arenas) < 3 * one_set  # two outputs of set 0 in one message; not five sets
    assert pools and set(pools) == {1}
