"""The environment and clocks of a GPU check (`gpu_check.sh`'s first step), printed as `# key: value`.

The machine header (`machine.py`), what the judge needs from the image (importable modules,
ninja, nvcc, bubblewrap and whether it can run here), the device environment variables the
judge passes on, and, where `nvidia-smi` exists, every GPU's UUID, clocks (current, maximum and
application), power, temperature, persistence and compute mode, MIG mode and throttle reasons,
before any work: figures measured later travel with the state of the machine they ran on.
Nothing is guessed: what cannot be read says so.

`gpu_env.py --extract-deb DEB DIR` unpacks a Debian package's files into DIR where dpkg-deb is
missing (an `ar` archive holding `data.tar.*`): how `gpu_check.sh` gets bubblewrap from the .deb
beside it on a machine without a registry. Absolute paths and `..` in the archive are refused.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import machine

QUERY = ("index,name,uuid,pci.bus_id,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,clocks.applications.graphics,"
         "power.draw,power.limit,temperature.gpu,utilization.gpu,memory.used,memory.total,persistence_mode,"
         "compute_mode,mig.mode.current,clocks_event_reasons.active")


def _run(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"could not run: {e}"
    return (done.stdout + done.stderr).strip()


def _meminfo() -> str:
    """MemTotal and MemAvailable in GiB, from /proc/meminfo."""
    try:
        with open("/proc/meminfo") as f:
            kib = {k.rstrip(":"): int(v) for k, v, *_ in (line.split() for line in f) if k in ("MemTotal:", "MemAvailable:")}
    except (OSError, ValueError):
        return "unreadable"
    return ", ".join(f"{k} {v / (1 << 20):.1f} GiB" for k, v in kib.items())


def _cgroups() -> str:
    """Whether the judge gives each worker a cgroup here (and so may fork CPU workers from a
    zygote: `SandboxConfig.fork_workers`), with this process's cgroup and the cgroup2 mounts."""
    from kernelrl.judge.isolation import cgroup

    try:
        with open("/proc/self/cgroup") as f:
            own = "; ".join(line.strip() for line in f)
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split()[4] for line in f if " - cgroup2 " in line]
    except OSError as e:
        return f"unreadable: {e}"
    return (f"per-worker cgroups {'yes' if cgroup.available() else 'no'}; this process in {own!r}; "
            f"cgroup2 mounted at {', '.join(mounts) or 'nowhere'}")


def extract_deb(deb: Path, dest: Path) -> None:
    """The files of a .deb (its data.tar member) under `dest`; members leaving `dest` are refused."""
    import io
    import tarfile

    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb}: not an ar archive")
    at = 8
    while at + 60 <= len(data):
        name = data[at:at + 16].decode().strip().rstrip("/")
        size = int(data[at + 48:at + 58].decode().strip())
        body = data[at + 60:at + 60 + size]
        at += 60 + size + (size % 2)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                tar.extractall(dest, filter="data")
            return
    raise ValueError(f"{deb}: no data.tar member")


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--extract-deb":
        extract_deb(Path(sys.argv[2]), Path(sys.argv[3]))
        return 0
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    print(machine.header(device))
    print(f"# executable: {sys.executable}")
    for mod in ("torch", "triton", "numpy", "rich", "einops", "pytest", "ninja", "kernelrl"):
        spec = importlib.util.find_spec(mod)
        print(f"# module {mod}: {spec.origin if spec else 'missing'}")
    for tool in ("ninja", "nvcc", "bwrap", "nvidia-smi", "setpriv", "unshare"):
        print(f"# tool {tool}: {shutil.which(tool) or 'missing'}")
    bwrap = shutil.which("bwrap")
    if bwrap:
        print(f"# bwrap version: {_run([bwrap, '--version'])}")
        works = _run([bwrap, "--ro-bind", "/", "/", "--unshare-net", "--die-with-parent", "true"])
        print(f"# bwrap runs here: {'yes' if works == '' else works.splitlines()[-1][:200]}")
    print(f"# uid: {os.getuid()}")
    home = Path.home().resolve()
    checkout = Path(__file__).resolve().parent.parent
    print(f"# checkout: {checkout}" + ("  (inside the judge's home folder: workers under bubblewrap cannot see it)"
                                       if home in checkout.parents and os.getuid() == 0 else ""))
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY",
                "KERNELRL_CACHE", "OMP_NUM_THREADS"):
        print(f"# env {var}: {os.environ.get(var, '(unset)')}")
    print(f"# cores: {os.cpu_count()}; affinity: {len(os.sched_getaffinity(0))}")
    print(f"# kernel: {os.uname().release}")
    print(f"# memory: {_meminfo()}")
    print(f"# cgroups: {_cgroups()}")
    if shutil.which("nvidia-smi"):
        print("# nvidia-smi -L:")
        print(_run(["nvidia-smi", "-L"]))
        print("# nvidia-smi --query-gpu:")
        print(_run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv"]))
        print("# nvidia-smi -q -d CLOCK,PERFORMANCE:")
        print(_run(["nvidia-smi", "-q", "-d", "CLOCK,PERFORMANCE"]))
    else:
        print("# nvidia-smi: missing (no clocks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
