"""The persisting-L2 carveout emptied before every sample (`kernelrl.judge.harness.l2`), without a GPU: which
runtime calls are made, in which order, on which GPUs, and that the worker makes them before its
eviction. The GPU side (a program's carveout gone after a prepare) is in test_worker_cuda.py."""

from __future__ import annotations

from kernelrl.judge.harness import l2


def _fake(calls: list[tuple[object, ...]], *, refuse: bool = False, devices: int = 1,
          current: dict[str, int] | None = None) -> l2.PersistingL2:
    def set_limit(limit: int, size: int) -> int:
        calls.append(("limit", limit, size, (current or {}).get("device", 0)))
        return 801 if refuse else 0  # cudaErrorNotSupported

    def reset_lines() -> int:
        calls.append(("lines", (current or {}).get("device", 0)))
        return 801 if refuse else 0

    def exchange(index: int) -> int:
        assert current is not None
        previous, current["device"] = current["device"], index
        return previous

    return l2.PersistingL2(set_limit=set_limit, reset_lines=reset_lines, devices=devices,
                           exchange_device=exchange if current is not None else None)


def test_the_carveout_goes_to_zero_before_its_lines_are_made_normal():
    calls: list[tuple[object, ...]] = []
    fake = _fake(calls)
    fake.reset()
    assert calls == [("limit", l2.PERSISTING_L2_LIMIT, 0, 0), ("lines", 0)] and fake.errors == 0


def test_every_visible_gpu_is_emptied_and_the_current_one_restored():
    calls: list[tuple[object, ...]] = []
    current = {"device": 2}  # the program left GPU 2 current
    _fake(calls, devices=3, current=current).reset()
    assert [c[-1] for c in calls] == [0, 0, 1, 1, 2, 2] and current["device"] == 2


def test_a_gpu_without_the_carveout_is_counted_not_raised():
    calls: list[tuple[object, ...]] = []
    fake = _fake(calls, refuse=True)
    fake.reset()
    assert fake.errors == 2


def test_the_runtime_is_found_in_the_process_mappings():
    maps = ("7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\n"
            "7f20-7f30 r-xp 00000000 08:01 13 /site-packages/nvidia/cuda_runtime/lib/libcudart.so.13\n")
    assert l2.runtime_path(maps) == "/site-packages/nvidia/cuda_runtime/lib/libcudart.so.13"
    assert l2.runtime_path("7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\n") is None
    assert l2.PersistingL2.bind(devices=1, exchange_device=None) is None  # no CUDA runtime in a CPU build


def test_the_worker_empties_the_carveout_before_it_evicts(monkeypatch):
    from kernelrl.judge.harness import bench as worker

    order: list[str] = []
    state = worker.Bench.__new__(worker.Bench)
    state.device, state.evict_buf, state.cuda_devices = "cuda", object(), 1
    state.l2 = _fake([])
    monkeypatch.setattr(state.l2, "reset", lambda: order.append("l2"))
    monkeypatch.setattr(worker, "_add_", lambda buf, value: order.append("evict"))
    monkeypatch.setattr(worker, "sync_every_gpu", lambda devices: order.append("sync"))
    state.evict()
    assert order == ["l2", "evict", "sync"]
