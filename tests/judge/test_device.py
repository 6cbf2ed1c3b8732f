"""Device kinds and their datasheet peaks."""

from __future__ import annotations

from kernelrl.judge.device import Device, gpu_peaks


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
