"""The Ray backend on a local Ray started by the test: one evaluator actor per lane, used by the
server (`backend = "ray"`) and by a trainer-side driver (`RayLanes`) alike."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_helpers import TINY_CORRECT, TINY_WRONG, fast_client

from kernelrl.result import Status

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray for the module (starting one takes ~6 s here); each test uses its own pool."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_server_and_trainer_share_the_ray_lanes(local_ray, start_server, quick_config, tiny_task) -> None:
    from kernelrl.serve.ray_backend import RayLanes

    server = start_server(backend="ray", eval=quick_config, ray_pool="test-pool")
    client = fast_client(server.url, wait_s=10.0)
    right, wrong = client.evaluate_batch([(tiny_task, TINY_CORRECT), (tiny_task, TINY_WRONG)])
    assert right.status is Status.CORRECT and right.speedup is not None
    assert wrong.status is Status.INCORRECT

    # A trainer joining the same pool gets the same actor (same process, warm evaluator); the
    # server's client's verdict is that client's own (the result cache is per client), so the same
    # program is judged anew for the trainer: the same verdict, its own measurement.
    lanes = RayLanes([quick_config], pool_name="test-pool")
    (again,) = lanes.evaluate_batch([(tiny_task, TINY_CORRECT)])
    assert again.status is Status.CORRECT and again.candidate_hash == right.candidate_hash
    assert again.to_dict() != right.to_dict()  # not the other client's timings
    server_actor = server.backend.describe()
    assert lanes.describe() == server_actor and server_actor[0]["pid"] != __import__("os").getpid()
    # Joining the pool with other evaluator settings is refused, not silently served.
    with pytest.raises(ValueError, match="already exists with other evaluator settings \\(timeout_s\\)"):
        RayLanes([dataclasses.replace(quick_config, timeout_s=7.0)], pool_name="test-pool")


def kill(actor) -> None:
    """Kill an actor past its restarts, and wait until it is dead (ray.kill does not wait)."""
    from ray.exceptions import ActorDiedError

    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.describe.remote(), timeout=10)
        except ActorDiedError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def test_lanes_outlive_their_driver_and_come_back_when_dead(local_ray) -> None:
    """A driver creates a lane and exits: the lane lives on (detached) and a later driver finds
    it by name; killed past its restarts, it is created again under its name at the next call."""
    from kernelrl.judge.evaluator import EvalConfig
    from kernelrl.serve.ray_backend import NAMESPACE, RayLanes

    root = Path(__file__).resolve().parents[2]
    script = f"""
import sys
sys.path.insert(0, {str(root)!r})
import ray
from kernelrl.judge.evaluator import EvalConfig
from kernelrl.serve.ray_backend import NAMESPACE, RayLanes
ray.init(address={ray.get_runtime_context().gcs_address!r}, namespace=NAMESPACE, log_to_driver=False)
print("lane pid", RayLanes([EvalConfig()], pool_name="detached").describe()[0]["pid"], flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    first_pid = int(done.stdout.split("lane pid")[-1].split()[0])

    lanes = RayLanes([EvalConfig()], pool_name="detached")  # the creating driver has exited
    assert lanes.describe()[0]["pid"] == first_pid
    kill(lanes.actors[0])
    (again,) = lanes.describe()
    assert again["pid"] != first_pid
    found = ray.get_actor("detached-lane-0", namespace=NAMESPACE)
    assert ray.get(found.describe.remote())["pid"] == again["pid"]  # the new lane holds the name
    # A driver that still holds the dead handle gets the new lane too (one call fails over).
    stale = RayLanes([EvalConfig()], pool_name="detached")
    stale.actors = [lanes.actors[0]]
    kill(lanes.actors[0])
    third = stale.describe()[0]["pid"]
    assert third not in (first_pid, again["pid"]) and lanes.describe()[0]["pid"] == third
    lanes.kill()
