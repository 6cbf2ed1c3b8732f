"""The Ray backend on a local Ray started by the test: one evaluator actor per lane, used by the
server (`backend = "ray"`) and by a trainer-side driver (`RayLanes`) alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from serve_helpers import TINY_CORRECT, TINY_WRONG, fast_client

from kernelrl.result import Status

ray = pytest.importorskip("ray")


@pytest.fixture
def local_ray() -> Iterator[None]:
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

    # A trainer joining the same pool gets the same actor (same process, warm evaluator): the
    # verdict on the same program comes from its cache, identical.
    lanes = RayLanes([quick_config], pool_name="test-pool")
    (again,) = lanes.evaluate_batch([(tiny_task, TINY_CORRECT)])
    assert again.to_dict() == right.to_dict()
    server_actor = server.backend.describe()
    assert lanes.describe() == server_actor and server_actor[0]["pid"] != __import__("os").getpid()
    # Joining the pool with other evaluator settings is refused, not silently served.
    with pytest.raises(ValueError, match="already exists with other evaluator settings \\(timeout_s\\)"):
        RayLanes([dataclasses.replace(quick_config, timeout_s=7.0)], pool_name="test-pool")
