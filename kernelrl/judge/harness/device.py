"""Devices: the kinds kernelrl judges on, and what is known about their limits.

Guarantees: `Device` is the one list of device kinds (`cpu`, `cuda`); `device_peaks(device)`
returns datasheet figures for known GPUs and leaves every figure it cannot know as None (never
an estimate); `DevicePeaks.table()` prints them for a prompt.

`visible_device(index)` is the entry of the judge's own `CUDA_VISIBLE_DEVICES` (an index, a
`GPU-` UUID or a `MIG-` UUID) that a lane's GPU number names, so a worker is shown exactly that
device under a scheduler's subset; `device_minor(entry)` is the `/dev/nvidiaN` minor of that GPU
when the driver's /proc files say it for certain (a UUID, or an index under
`CUDA_DEVICE_ORDER=PCI_BUS_ID`), with its UUID (what the worker is then shown), else None (then
every NVIDIA node is bound and the entry passed on, as before).

`cuda_arch_list(index)` is what a candidate's CUDA build targets: the judge's own
`TORCH_CUDA_ARCH_LIST` when it sets one, else exactly the GPU judged on, with its
architecture-specific features (`9.0a` on an H100 or H200: sm_90a's wgmma and TMA instructions,
which a build for the bare `9.0` cannot use); `arch_env` puts it in a worker's environment, and the
build key holds it (`kernelrl.judge.isolation.builds.toolchain_fingerprint`), so a build for one target is
never loaded for another.

Does not measure anything: measured peaks (the roofline's) are the judge's.
"""

from __future__ import annotations

import enum
import functools
import os
from dataclasses import dataclass
from pathlib import Path


class Device(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


def visible_device(index: int, visible: str | None = None) -> str:
    """What to put in a worker's CUDA_VISIBLE_DEVICES for the judge's GPU number `index`."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not entries:
        return str(index)
    if not 0 <= index < len(entries):
        raise ValueError(f"GPU {index} is not among the {len(entries)} visible to the judge ({visible})")
    return entries[index]


# Compute capabilities with an architecture-specific feature set ("a"): sm_90a (H100, H200: wgmma,
# TMA), sm_100a/sm_101a/sm_103a (Blackwell: tcgen05), sm_120a/sm_121a.
ARCH_SPECIFIC = frozenset({(9, 0), (10, 0), (10, 1), (10, 3), (12, 0), (12, 1)})


def arch_list_for(capability: tuple[int, int]) -> str:
    """TORCH_CUDA_ARCH_LIST for exactly one GPU: `9.0a` for an H100 or H200, `8.0` for an A100."""
    major, minor = capability
    return f"{major}.{minor}{'a' if (major, minor) in ARCH_SPECIFIC else ''}"


@functools.cache
def _capability(index: int) -> tuple[int, int] | None:
    import torch

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def cuda_arch_list(index: int = 0, *, given: str | None = None) -> str | None:
    """What CUDA builds target (the module docstring): `given` or the judge's TORCH_CUDA_ARCH_LIST
    when set, else GPU `index`'s own (`arch_list_for`); None where the judge sees no such GPU."""
    given = os.environ.get("TORCH_CUDA_ARCH_LIST", "") if given is None else given
    if given.strip():
        return given.strip()
    capability = _capability(index)
    return arch_list_for(capability) if capability is not None else None


def arch_env(device: Device, index: int = 0) -> dict[str, str]:
    """A worker's TORCH_CUDA_ARCH_LIST on a GPU (`cuda_arch_list`); nothing on a CPU."""
    arch = cuda_arch_list(index) if device == Device.CUDA else None
    return {"TORCH_CUDA_ARCH_LIST": arch} if arch else {}


def device_minor(entry: str, *, order: str | None = None,
                 proc: Path = Path("/proc/driver/nvidia/gpus")) -> tuple[int, str] | None:
    """The /dev/nvidiaN minor and the UUID of the GPU a CUDA_VISIBLE_DEVICES entry names, when certain."""
    gpus: list[tuple[str, str, int]] = []  # (bus id, uuid, minor)
    try:
        for folder in sorted(proc.iterdir()):
            info = dict(line.split(":", 1) for line in (folder / "information").read_text().splitlines() if ":" in line)
            gpus.append((folder.name.lower(), info.get("GPU UUID", "").strip(), int(info["Device Minor"])))
    except (OSError, KeyError, ValueError):
        return None
    if entry.startswith("GPU-"):
        found = [(minor, uuid) for _, uuid, minor in gpus if uuid == entry]
        return found[0] if len(found) == 1 else None
    order = order if order is not None else os.environ.get("CUDA_DEVICE_ORDER", "")
    if entry.isdigit() and order == "PCI_BUS_ID" and int(entry) < len(gpus):
        _, uuid, minor = sorted(gpus)[int(entry)]
        return (minor, uuid) if uuid.startswith("GPU-") else None
    return None  # a MIG instance, or CUDA's default order (fastest first): not certain




@dataclass(frozen=True, kw_only=True)
class DevicePeaks:
    """What is known about a device's limits. None means unknown; nothing here is estimated."""

    name: str
    kind: Device
    fp32_tflops: float | None = None
    bf16_tflops: float | None = None  # dense tensor-core figure, no sparsity
    mem_bandwidth_gbs: float | None = None
    memory_gib: float | None = None
    cores: int | None = None  # logical CPUs usable by this process (CPU only)
    vector_isa: str | None = None  # CPU only: the instruction set torch dispatches to
    source: str = ""  # where the figures come from

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Device(self.kind))

    def table(self) -> str:
        def fmt(value: float | int | str | None, unit: str = "") -> str:
            if value is None:
                return "unknown"
            if isinstance(value, float):
                value = f"{value:g}"
            return f"{value}{unit}"

        rows = [("device", self.name)]
        if self.kind == "cpu":
            rows += [("logical cores usable", fmt(self.cores)), ("vector ISA", fmt(self.vector_isa))]
        rows += [
            ("peak fp32", fmt(self.fp32_tflops, " TFLOP/s")),
            ("peak bf16 (tensor, dense)", fmt(self.bf16_tflops, " TFLOP/s")),
            ("peak memory bandwidth", fmt(self.mem_bandwidth_gbs, " GB/s")),
        ]
        if self.memory_gib is not None:
            rows.append(("memory", f"{self.memory_gib:.0f} GiB"))
        if self.source:
            rows.append(("figures from", self.source))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"| {k.ljust(width)} | {v} |" for k, v in rows)


@dataclass(frozen=True, kw_only=True)
class _GpuSpec:
    match: tuple[str, ...]  # all of these substrings of the lower-cased device name
    label: str
    fp32_tflops: float
    bf16_tflops: float
    mem_bandwidth_gbs: float


# Vendor datasheet figures (NVIDIA H100, H200, A100, L40S datasheets; Ada architecture
# whitepaper for the RTX 4090). Tensor figures are dense (the datasheets' sparsity figures halved).
# More specific entries come first: the first entry whose substrings all match wins.
_GPU_SPECS: tuple[_GpuSpec, ...] = (
    _GpuSpec(match=("h200", "nvl"), label="H200 NVL", fp32_tflops=60.0, bf16_tflops=835.0, mem_bandwidth_gbs=4800.0),
    _GpuSpec(match=("h200",), label="H200 SXM", fp32_tflops=67.0, bf16_tflops=989.0, mem_bandwidth_gbs=4800.0),
    _GpuSpec(match=("h100", "nvl"), label="H100 NVL", fp32_tflops=60.0, bf16_tflops=835.0, mem_bandwidth_gbs=3900.0),
    _GpuSpec(match=("h100", "pcie"), label="H100 PCIe", fp32_tflops=51.0, bf16_tflops=756.0, mem_bandwidth_gbs=2000.0),
    _GpuSpec(match=("h100",), label="H100 SXM", fp32_tflops=67.0, bf16_tflops=989.0, mem_bandwidth_gbs=3350.0),
    _GpuSpec(match=("a100", "80gb", "pcie"), label="A100 80GB PCIe", fp32_tflops=19.5, bf16_tflops=312.0,
             mem_bandwidth_gbs=1935.0),
    _GpuSpec(match=("a100", "80gb"), label="A100 80GB SXM", fp32_tflops=19.5, bf16_tflops=312.0,
             mem_bandwidth_gbs=2039.0),
    _GpuSpec(match=("a100",), label="A100 40GB", fp32_tflops=19.5, bf16_tflops=312.0, mem_bandwidth_gbs=1555.0),
    _GpuSpec(match=("l40s",), label="L40S", fp32_tflops=91.6, bf16_tflops=362.0, mem_bandwidth_gbs=864.0),
    # RTX 4090: bf16 tensor figure with fp32 accumulation, as PyTorch computes it.
    _GpuSpec(match=("4090",), label="GeForce RTX 4090", fp32_tflops=82.6, bf16_tflops=165.2, mem_bandwidth_gbs=1008.0),
)


def gpu_peaks(name: str, memory_gib: float | None = None) -> DevicePeaks:
    """Peak figures of a CUDA device by its `torch.cuda.get_device_name`; unknown GPUs get None."""
    low = name.lower()
    for spec in _GPU_SPECS:
        if all(m in low for m in spec.match):
            return DevicePeaks(name=name, kind=Device.CUDA, fp32_tflops=spec.fp32_tflops, bf16_tflops=spec.bf16_tflops,
                               mem_bandwidth_gbs=spec.mem_bandwidth_gbs, memory_gib=memory_gib,
                               source=f"vendor datasheet ({spec.label})")
    return DevicePeaks(name=name, kind=Device.CUDA, memory_gib=memory_gib,
                       source="no datasheet figures known for this GPU")


@functools.cache
def cpu_peaks() -> DevicePeaks:
    """This machine's CPU: model name, usable cores and vector ISA; peak rates are not knowable here."""
    import torch

    name = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        import platform

        name = platform.processor() or name
    cores: int | None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count()
    try:
        isa = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        isa = None
    return DevicePeaks(name=name, kind=Device.CPU, cores=cores, vector_isa=isa,
                       source="this machine (peak rates are not measured or estimated)")


def device_peaks(device: str) -> DevicePeaks:
    """Peaks of "cpu" or "cuda[:N]". A CUDA device that is not visible here is named as unknown."""
    if device == "cpu":
        return cpu_peaks()
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            return gpu_peaks(torch.cuda.get_device_name(index), memory_gib=props.total_memory / 2**30)
        return DevicePeaks(name="CUDA device (not visible where the prompt was built)", kind=Device.CUDA,
                           source="no figures: device not visible")
    raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'cuda[:N]'")


@functools.cache
def _llc_bytes() -> int:
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (idx / "size").read_text().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            best = max(best, int(size.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best or (32 << 20)


def evict_bytes(device: Device) -> int:
    if device == Device.CUDA:
        return 256 << 20  # larger than any current GPU's L2
    return int(_llc_bytes() * 1.5)
