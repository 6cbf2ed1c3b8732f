"""Device locks: a measurement waits for work under way, and no new work starts while it waits."""

from __future__ import annotations

import threading
import time

from kernelrl.judge.devicelock import DeviceLock


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
