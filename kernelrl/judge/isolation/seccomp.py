"""The seccomp filter of a fully contained worker: no new namespaces, mounts, keys, BPF, perf or ptrace.

Bubblewrap loads a compiled classic-BPF program from a descriptor (`--seccomp FD`) just before it
execs the worker; the filter then holds for the worker and every process it starts, and cannot
be removed (seccomp filters only ever add). This module assembles that program itself (no
libseccomp binding is needed: the project runs on pip-installed CPython), as Flatpak's filter
does, for x86_64 and aarch64:

- refused with EPERM: unshare, setns, mount and the new mount API (open_tree, move_mount,
  fsopen, fsconfig, fsmount, fspick, mount_setattr), umount2, pivot_root, chroot, keyctl,
  add_key, request_key, bpf, perf_event_open, ptrace, process_vm_readv/writev, userfaultfd,
  kexec_load/kexec_file_load, init/finit/delete_module, open_by_handle_at, name_to_handle_at,
  swapon/swapoff, reboot, acct, quotactl, syslog;
- clone with any CLONE_NEW* flag: EPERM (threads and fork, which set none, pass);
- clone3: ENOSYS, so the C library falls back to clone, whose flags the filter can read (clone3
  passes them in memory, out of a filter's reach);
- a system call of another ABI (i386 through int 0x80, x32): the process is killed.

Guarantees: `program()` is None on any other architecture, and the caller then does not claim
full containment (`kernelrl.judge.isolation.containment.probe`). Does not guarantee protection from kernel
bugs in the calls it allows.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# BPF instruction classes and fields (linux/filter.h, linux/bpf_common.h)
_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0_LO = 0, 4, 16
_X32_BIT = 0x40000000

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

_REFUSED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "keyctl", "add_key", "request_key",
            "bpf", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "userfaultfd",
            "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
            "open_by_handle_at", "name_to_handle_at", "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog",
            "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr")

# (audit arch, system call numbers): x86_64 from arch/x86/entry/syscalls/syscall_64.tbl, aarch64
# from include/uapi/asm-generic/unistd.h; the new mount API has the same numbers everywhere.
_NEW_MOUNT = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
              "mount_setattr": 442, "clone3": 435}
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "userfaultfd": 323, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "swapon": 167, "swapoff": 168, "reboot": 169,
        "acct": 163, "quotactl": 179, "syslog": 103, "clone": 56, **_NEW_MOUNT}),
    "aarch64": (0xC00000B7, {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "userfaultfd": 282, "kexec_load": 104,
        "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "swapon": 224, "swapoff": 225, "reboot": 142,
        "acct": 89, "quotactl": 60, "syslog": 116, "clone": 220, **_NEW_MOUNT}),
}


def _assemble(arch: str) -> bytes:
    audit, nrs = _ARCHES[arch]
    # (code, jump-if-true label, jump-if-false label, k); labels resolve to relative offsets
    prog: list[tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, _ARCH),
        (_JEQ, None, "kill", audit),
        (_LD_W_ABS, None, None, _NR),
    ]
    if arch == "x86_64":
        prog.append((_JGE, "kill", None, _X32_BIT))
    prog += [(_JEQ, "deny", None, nrs[name]) for name in _REFUSED]
    prog += [(_JEQ, "enosys", None, nrs["clone3"]),
             (_JEQ, None, "allow", nrs["clone"]),
             (_LD_W_ABS, None, None, _ARG0_LO),
             (_JSET, "deny", "allow", CLONE_NEW_FLAGS)]
    tail = {"allow": _RET_ALLOW, "deny": _RET_ERRNO | errno.EPERM, "enosys": _RET_ERRNO | errno.ENOSYS,
            "kill": _RET_KILL_PROCESS}
    where = {label: len(prog) + i for i, label in enumerate(tail)}
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        out += struct.pack("=HBBI", code, where[jt] - i - 1 if jt else 0, where[jf] - i - 1 if jf else 0, k)
    for value in tail.values():
        out += struct.pack("=HBBI", _RET, 0, 0, value)
    return bytes(out)


def program() -> bytes | None:
    """The filter for this machine's architecture, as bubblewrap reads it; None where there is none."""
    arch = platform.machine()
    return _assemble(arch) if arch in _ARCHES else None


def program_fd() -> int | None:
    """A fresh descriptor holding the filter at offset 0, for one bubblewrap (which reads it to the end)."""
    code = program()
    if code is None:
        return None
    fd = os.memfd_create("kernelrl-seccomp", os.MFD_CLOEXEC)
    os.write(fd, code)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
