"""Device kinds and their datasheet peaks."""

from __future__ import annotations

import pytest

from kernelrl.judge.harness.device import Device, gpu_peaks


def test_gpu_peaks_from_device_names():
    h100 = gpu_peaks("NVIDIA H100 80GB HBM3")
    assert (h100.fp32_tflops, h100.bf16_tflops, h100.mem_bandwidth_gbs) == (67.0, 989.0, 3350.0)
    assert "vendor datasheet" in h100.source
    assert gpu_peaks("NVIDIA H100 PCIe").mem_bandwidth_gbs == 2000.0
    assert gpu_peaks("NVIDIA H200").mem_bandwidth_gbs == 4800.0
    assert gpu_peaks("NVIDIA A100-SXM4-80GB").mem_bandwidth_gbs == 2039.0
    assert gpu_peaks("NVIDIA A100-SXM4-40GB").mem_bandwidth_gbs == 1555.0
    assert gpu_peaks("NVIDIA L40S").fp32_tflops == 91.6
    assert gpu_peaks("NVIDIA GeForce RTX 4090").mem_bandwidth_gbs == 1008.0
    unknown = gpu_peaks("NVIDIA Mystery 9000")
    assert unknown.fp32_tflops is None
    table = unknown.table()
    assert "| peak fp32" in table and "unknown" in table


def test_device_kinds_are_the_strings_configs_use():
    assert [d.value for d in Device] == ["cpu", "cuda"]
    assert Device("cuda") is Device.CUDA and f"{Device.CPU}" == "cpu"


def test_a_lane_is_shown_the_judges_own_entry_for_its_gpu():
    from kernelrl.judge.harness.device import visible_device

    assert visible_device(0, "") == "0" and visible_device(2, "") == "2"
    assert visible_device(1, "4,6") == "6"  # a scheduler's subset: the lane's GPU 1 is the machine's 6
    assert visible_device(0, "GPU-aaaa, MIG-bbbb") == "GPU-aaaa" and visible_device(1, "GPU-aaaa,MIG-bbbb") == "MIG-bbbb"
    with pytest.raises(ValueError, match="not among"):
        visible_device(2, "4,6")


def _fake_driver(root, gpus):
    for bus, uuid, minor in gpus:
        folder = root / bus
        folder.mkdir(parents=True)
        (folder / "information").write_text(f"Model: \t NVIDIA H100\nIRQ: 1\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n")
    return root


def test_the_device_node_of_a_gpu_only_when_the_driver_says_it_for_certain(tmp_path):
    from kernelrl.judge.harness.device import device_minor

    proc = _fake_driver(tmp_path / "gpus", [("0000:c1:00.0", "GPU-cccc", 3), ("0000:1b:00.0", "GPU-bbbb", 0)])
    assert device_minor("GPU-cccc", proc=proc) == (3, "GPU-cccc")
    assert device_minor("GPU-zzzz", proc=proc) is None
    # an index means a GPU only in PCI order (CUDA's default order is fastest first)
    assert device_minor("0", order="PCI_BUS_ID", proc=proc) == (0, "GPU-bbbb")
    assert device_minor("1", order="PCI_BUS_ID", proc=proc) == (3, "GPU-cccc")
    assert device_minor("1", order="", proc=proc) is None
    assert device_minor("MIG-dddd", proc=proc) is None
    assert device_minor("0", order="PCI_BUS_ID", proc=tmp_path / "no-driver") is None


def test_only_the_lanes_gpu_node_is_bound_beside_the_shared_ones(monkeypatch):
    import os

    from kernelrl.judge.isolation import containment

    names = ["nvidia0", "nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-caps", "null"]
    monkeypatch.setattr(containment.os, "listdir", lambda p: names if p == "/dev" else os.listdir(p))
    monkeypatch.setattr(containment.os.path, "isdir", lambda p: True)
    monkeypatch.setattr(containment.os.path, "exists", lambda p: True)
    assert containment.device_nodes("cuda", 3) == ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia3",
                                                   "/dev/nvidiactl"]
    assert len(containment.device_nodes("cuda")) == 6  # not certain which: every NVIDIA node, as before
    assert containment.device_nodes("cpu", 3) == []


@pytest.mark.parametrize(("capability", "arch"), [((9, 0), "9.0a"), ((10, 0), "10.0a"), ((8, 0), "8.0"),
                                                  ((8, 9), "8.9"), ((12, 0), "12.0a")])
def test_a_gpu_is_built_for_with_its_architecture_specific_features(capability, arch):
    from kernelrl.judge.harness.device import arch_list_for

    assert arch_list_for(capability) == arch


def test_the_judges_own_arch_list_wins_and_without_a_gpu_there_is_none(monkeypatch):
    from kernelrl.judge.harness import device

    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(device, "_capability", lambda index: None)  # this machine: no GPU
    assert device.cuda_arch_list() is None and device.arch_env(device.Device.CUDA) == {}
    monkeypatch.setattr(device, "_capability", lambda index: (9, 0) if index == 0 else (8, 0))
    assert device.arch_env(device.Device.CUDA) == {"TORCH_CUDA_ARCH_LIST": "9.0a"}
    assert device.arch_env(device.Device.CUDA, 1) == {"TORCH_CUDA_ARCH_LIST": "8.0"}
    assert device.arch_env(device.Device.CPU) == {}
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # the user chose: kept as it is
    assert device.cuda_arch_list() == "9.0"


def test_the_build_key_holds_the_architecture_built_for(monkeypatch):
    from kernelrl.judge.isolation import builds

    keys = []
    for arch in ("9.0", "9.0a"):
        monkeypatch.setattr(builds, "cuda_arch_list", lambda arch=arch: arch)
        builds.toolchain_fingerprint.cache_clear()
        keys.append(builds.build_key("source", builds.Device.CUDA))
    builds.toolchain_fingerprint.cache_clear()
    assert keys[0] != keys[1]
    assert "arch 9.0a" in builds.toolchain_fingerprint.__wrapped__(builds.Device.CUDA)
