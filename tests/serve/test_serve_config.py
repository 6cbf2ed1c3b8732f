"""Lanes from --devices and the server's config checks (no server runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.config import ConfigError, build
from kernelrl.judge.evaluator import EvalConfig
from kernelrl.judge.harness.device import Device
from kernelrl.serve.backend import BackendKind
from kernelrl.serve.config import ServeConfig
from kernelrl.serve.lanes import LaneSpec, parse_devices, split_evenly
from kernelrl.web.guard import is_loopback


def test_parse_devices() -> None:
    assert parse_devices("cpu") == (LaneSpec(device=Device.CPU),)
    assert parse_devices("cuda") == (LaneSpec(device=Device.CUDA),)
    assert parse_devices("cuda:0, cuda:1") == (LaneSpec(device=Device.CUDA, index=0),
                                               LaneSpec(device=Device.CUDA, index=1))
    assert parse_devices(["cuda:3", "cuda:1"]) == (LaneSpec(device=Device.CUDA, index=3),
                                                   LaneSpec(device=Device.CUDA, index=1))
    assert [str(lane) for lane in parse_devices("cuda:0,cuda:2")] == ["cuda:0", "cuda:2"]


@pytest.mark.parametrize(("spec", "reason"), [
    ("", "at least one device"),
    ("gpu", "not cpu, cuda or cuda:N"),
    ("cuda:-1", "not cpu, cuda or cuda:N"),
    ("cpu:0", "the CPU is one lane"),
    ("cpu,cuda:0", "one kind"),
    ("cuda:0,cuda:0", "named twice"),
    ("cpu,cpu", "named twice"),
    ("cuda,cuda:1", "name each one"),
])
def test_parse_devices_refuses(spec: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_devices(spec)


def test_split_evenly() -> None:
    assert split_evenly(5, 2) == [range(2), range(2, 5)]
    assert split_evenly(1, 3) == [range(1)]
    assert [len(r) for r in split_evenly(10, 4)] == [2, 3, 2, 3]
    assert sum(len(r) for r in split_evenly(513, 8)) == 513


def test_loopback_only_without_token(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.2") and not is_loopback("example.org")
    for host in ("0.0.0.0", "192.168.1.4", "::", "my-host"):
        with pytest.raises(ValueError, match="without a token"):
            ServeConfig(host=host)
    token = tmp_path / "t"
    assert ServeConfig(host="0.0.0.0", token_file=token).token_file == token
    assert ServeConfig(host="127.0.0.1").token_file is None


def test_devices_set_the_evaluator_device() -> None:
    c = ServeConfig(devices=("cuda:0", "cuda:1"))
    assert c.eval.device is Device.CUDA
    assert [(e.device, e.device_index) for e in c.lane_configs()] == [(Device.CUDA, 0), (Device.CUDA, 1)]
    # On Ray, Ray picks each actor's GPU: the lanes do not name one.
    ray = ServeConfig(devices=("cuda:0", "cuda:1"), backend=BackendKind.RAY)
    assert [e.device_index for e in ray.lane_configs()] == [None, None]
    with pytest.raises(ValueError, match="eval.device is cuda"):
        ServeConfig(devices=("cpu",), eval=EvalConfig(device="cuda"))
    with pytest.raises(ValueError, match="device_index"):
        ServeConfig(devices=("cuda:0",), eval=EvalConfig(device="cuda", device_index=1))


@pytest.mark.parametrize(("settings", "reason"), [
    ({"max_items_per_job": 10, "max_pending_items": 5}, "max_items_per_job must be <= max_pending_items"),
    ({"max_body_bytes": 0}, "max_body_bytes must be >= 1"),
    ({"port": 70000}, "port"),
    ({"job_concurrency": -1}, "job_concurrency"),
    ({"log_level": "loud"}, "log_level"),
])
def test_limits_are_checked(settings: dict, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        ServeConfig(**settings)


def test_built_from_a_run_config_table() -> None:
    c = build(ServeConfig, {"devices": "cuda:0,cuda:1", "port": 9000, "eval": {"timeout_s": 30.0, "size": "full"}})
    assert c.devices == ("cuda:0", "cuda:1") and c.eval.timeout_s == 30.0 and c.eval.device is Device.CUDA
    with pytest.raises(ConfigError, match="queue_limit"):
        build(ServeConfig, {"queue_limit": 3})
