"""The worker's device-wide synchronisation, without a GPU: which C functions it calls, and how.

The GPU side (work on side streams timed in full) is in test_worker_cuda.py.
"""

from __future__ import annotations

from kernelrl.judge.harness import bench as worker


def test_every_visible_gpu_is_synchronised_and_the_current_one_restored(monkeypatch):
    calls = []
    current = {"device": 1}  # the program left GPU 1 current

    def exchange(index):
        previous, current["device"] = current["device"], index
        calls.append(("set", index))
        return previous

    monkeypatch.setattr(worker, "_cuda_exchange_device", exchange)
    monkeypatch.setattr(worker, "_cuda_synchronize", lambda: calls.append(("sync", current["device"])))
    worker.sync_every_gpu(3)
    assert [c for c in calls if c[0] == "sync"] == [("sync", 0), ("sync", 1), ("sync", 2)]
    assert current["device"] == 1


def test_one_gpu_is_one_synchronisation(monkeypatch):
    calls = []
    monkeypatch.setattr(worker, "_cuda_synchronize", lambda: calls.append("sync"))
    worker.sync_every_gpu(1)
    assert calls == ["sync"]


def test_the_synchronisation_is_bound_before_any_program_runs():
    import torch

    # torch.cuda.synchronize looks torch._C._cuda_synchronize up at each call; the worker holds
    # the function itself (None in a CPU build of torch), so rebinding the attribute changes nothing.
    assert worker._cuda_synchronize is getattr(torch._C, "_cuda_synchronize", None)
    assert not hasattr(worker, "_cuda_sync")
