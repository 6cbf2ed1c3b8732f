"""Device locks: a measurement waits for work under way, and no new work starts while it waits."""

from __future__ import annotations

import threading
import time

from kernelrl.judge.timing.devicelock import DeviceLock


def test_a_waiting_measurement_goes_before_new_work(tmp_path):
    lock = DeviceLock(tmp_path, "cpu")
    events: list[str] = []
    working = threading.Event()
    release = threading.Event()

    def early_work():
        with lock.work(uses_device=True):
            working.set()
            release.wait(10)
            events.append("early work ends")

    def measurement():
        with lock.timing():
            events.append("timing")

    def late_work():
        with lock.work(uses_device=True):
            events.append("late work")

    first = threading.Thread(target=early_work)
    first.start()
    assert working.wait(10)
    timed = threading.Thread(target=measurement)
    timed.start()
    time.sleep(0.2)  # the measurement is now waiting for the early work
    late = threading.Thread(target=late_work)
    late.start()
    time.sleep(0.2)
    assert events == []  # neither the measurement nor the late work has started
    release.set()
    for t in (first, timed, late):
        t.join(10)
    assert events == ["early work ends", "timing", "late work"]


def test_work_off_the_device_is_not_held_back_on_a_gpu(tmp_path):
    lock = DeviceLock(tmp_path, "cuda", 0)
    with lock.timing(), lock.work(uses_device=False):  # a build on the CPU overlaps a GPU measurement
        pass


def test_gpu_locks_are_named_after_the_device_the_process_sees():
    from kernelrl.judge.timing.devicelock import lock_name

    assert lock_name("cpu", None, "0,1") == "cpu"
    assert lock_name("cuda", None, "") == "cuda-0" and lock_name("cuda", 3, "") == "cuda-3"
    assert lock_name("cuda", None, "5,2") == "cuda-5" and lock_name("cuda", 1, "5,2") == "cuda-2"
    assert lock_name("cuda", 0, "GPU-8f1c2d3e-aaaa") == "cuda-GPU-8f1c2d3e-aaaa"
    assert lock_name("cuda", 0, "MIG-GPU-8f1c/1/0") == "cuda-MIG-GPU-8f1c_1_0"  # no path separators
    assert lock_name("cuda", 0, "../../x") == "cuda-.._.._x"


def test_two_lanes_seeing_different_gpus_as_device_0_time_at_once(tmp_path, monkeypatch):
    """Ray gives each lane's actor one GPU as its device 0: two lanes, two locks; two lanes shown the
    same GPU share one."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    lane_a = DeviceLock(tmp_path, "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    lane_b = DeviceLock(tmp_path, "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    lane_c = DeviceLock(tmp_path, "cuda", 1)
    assert (lane_a.name, lane_b.name, lane_c.name) == ("cuda-3", "cuda-7", "cuda-3")
    entered = threading.Event()
    with lane_a.timing():
        def other():
            with lane_b.timing():
                entered.set()
        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(5)  # another GPU measures while this one does
        t.join()
        blocked = threading.Event()

        def same_gpu():
            with lane_c.timing():
                blocked.set()
        t = threading.Thread(target=same_gpu)
        t.start()
        assert not blocked.wait(0.5)  # the same physical GPU, seen as another index: it waits
    assert blocked.wait(5)
    t.join()


def test_a_build_runs_while_another_group_is_timed_on_a_gpu_but_not_on_a_cpu(tmp_path):
    """Two fake devices, the group code's locks: on a GPU a candidate's build and load (`build()`)
    start during another group's measurement and only its correctness runs wait; on a CPU the build
    waits too."""
    for device, build_waits in (("cuda", False), ("cpu", True)):
        lock = DeviceLock(tmp_path / device, device)
        events: list[str] = []
        timing = threading.Event()
        release = threading.Event()

        def measurement(lock=lock, events=events, timing=timing, release=release):
            with lock.timing():
                timing.set()
                release.wait(10)
                events.append("measurement ends")

        def trial(lock=lock, events=events):
            with lock.build():
                events.append("build")
                with lock.device_work():
                    events.append("correctness")

        m = threading.Thread(target=measurement)
        m.start()
        assert timing.wait(5)
        c = threading.Thread(target=trial)
        c.start()
        time.sleep(0.3)
        assert events == ([] if build_waits else ["build"]), device
        release.set()
        m.join()
        c.join()
        assert events == ["measurement ends", "build", "correctness"] if build_waits else \
            ["build", "measurement ends", "correctness"], device


def test_a_candidates_construction_and_parameter_copy_hold_the_devices_lock(monkeypatch, quick_config, tiny_task):
    """On a GPU `build()` holds nothing (builds overlap another group's measurement) and only
    `device_work()` holds the device: the model's construction (parameters moved to the device) and
    the reference's parameters copied in must be inside it, the import and build outside it. Checked
    on a CPU by recording, for each message a candidate's worker is sent, whether `device_work()`
    was held."""
    import contextlib

    from kernelrl.candidate import Candidate
    from kernelrl.judge.evaluator import evaluate
    from kernelrl.judge.harness.protocol import Kind
    from kernelrl.judge.isolation import sandbox
    from kernelrl.judge.timing import devicelock
    from kernelrl.result import Status

    held = threading.local()
    sent: list[tuple[str, bool]] = []
    real_device_work, real_request, real_command = (devicelock.DeviceLock.device_work, sandbox.Worker.request,
                                                    sandbox.Worker.command)

    @contextlib.contextmanager
    def device_work(self):
        with real_device_work(self):
            held.on = True
            try:
                yield
            finally:
                held.on = False

    def request(self, header, payload=None, *, deadline=None):
        sent.append((str(header.KIND), getattr(held, "on", False)))
        return real_request(self, header, payload, deadline=deadline)

    def command(self, kind, payload=None, *, deadline=None):
        sent.append((str(kind), getattr(held, "on", False)))
        return real_command(self, kind, payload, deadline=deadline)

    monkeypatch.setattr(devicelock.DeviceLock, "device_work", device_work)
    monkeypatch.setattr(sandbox.Worker, "request", request)
    monkeypatch.setattr(sandbox.Worker, "command", command)
    source = tiny_task.source.replace("class Model(", "class ModelNew(")
    res = evaluate(tiny_task, Candidate(source=source), quick_config)
    assert res.status is Status.CORRECT, res.message
    loads = [inside for kind, inside in sent if kind == Kind.LOAD_PROGRAM]
    constructs = [inside for kind, inside in sent if kind == Kind.CONSTRUCT]
    copies = [inside for kind, inside in sent if kind == Kind.LOAD_STATE]
    # the candidate and the reference's A/A copy are each loaded as programs
    assert loads and not any(loads)
    assert len(constructs) == len(loads) and all(constructs)
    assert copies and all(copies)
