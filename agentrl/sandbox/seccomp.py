"""The process backend's seccomp filter: a classic-BPF program that refuses a few syscalls.

Bubblewrap installs no syscall filter of its own; ``bwrap --seccomp FD`` loads the raw
``struct sock_filter`` array read from FD (built here with :mod:`struct`, no libseccomp needed)
into the sandbox just before it execs the executor, so everything the model's code runs inherits it.

Why each refusal:

* **keys** (``keyctl``, ``add_key``, ``request_key``): the kernel keyrings are not namespaced. A
  sandbox started from a service or login session shares the host's session keyring: it could
  read the trainer's tokens from it, add keys to it, and two sandboxes could pass notes through it.
  Docker's default seccomp profile refuses ``keyctl`` for the same reason; refusing all three
  means no sandbox sees, creates or shares any keyring.
* **io_uring** (``io_uring_setup``/``_enter``/``_register``): a large kernel attack surface that
  bypasses per-syscall filtering; the threat model (``docs/sandbox.md``) excludes kernel exploits,
  and io_uring is refused rather than reasoned about.
* **bpf, perf_event_open, userfaultfd, kexec_load, open_by_handle_at**: kernel attack surface no
  sandboxed program needs (most already need capabilities the sandbox lacks; refusing them here
  holds even if a capability check has a bug).
* **x32 syscalls** on x86_64 (numbers with bit 30 set) are refused, since they are a second syscall
  table the list above does not name; a process that switches to another architecture's syscall
  convention (``int 0x80`` on x86_64) is killed, for the same reason.

A refused syscall fails with ``EPERM``, so programs see an ordinary error, not a crash.
"""

from __future__ import annotations

import os
import struct

__all__ = ["REFUSED", "filter_program"]

REFUSED = (
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "open_by_handle_at",
)
"""Syscalls that fail with EPERM inside a sandbox."""

# AUDIT_ARCH_* and the syscall numbers of REFUSED, per `uname -m`.
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "kexec_load": 246,
            "open_by_handle_at": 304,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "kexec_load": 104,
            "open_by_handle_at": 265,
        },
    ),
}
_ARCHES["arm64"] = _ARCHES["aarch64"]

X32_SYSCALL_BIT = 0x40000000

# linux/filter.h, linux/seccomp.h
_BPF_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_BPF_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_BPF_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_EPERM = 1
_OFF_NR, _OFF_ARCH = 0, 4  # struct seccomp_data {int nr; __u32 arch; ...}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter as the raw ``sock_filter`` array ``bwrap --seccomp`` reads, for ``machine``.

    ``machine`` defaults to this host's ``uname -m``. Returns None for an architecture whose
    syscall numbers this module does not know (only x86_64 and aarch64 are): the caller must then
    report the key and io_uring syscalls as *not* refused rather than load a wrong filter.
    """
    arch = _ARCHES.get(machine or os.uname().machine)
    if arch is None:
        return None
    audit_arch, numbers = arch
    checks: list[tuple[int, int]] = []  # (jump opcode, k): each jumps to the EPERM return on a match
    if audit_arch == _ARCHES["x86_64"][0]:
        checks.append((_BPF_JGE_K, X32_SYSCALL_BIT))
    checks += [(_BPF_JEQ_K, numbers[name]) for name in REFUSED]
    prog = [
        _insn(_BPF_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_BPF_JEQ_K, 1, 0, audit_arch),
        _insn(_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_BPF_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    for i, (op, k) in enumerate(checks):
        # Past the remaining checks and the ALLOW return lands on the EPERM return.
        prog.append(_insn(op, len(checks) - i, 0, k))
    prog.append(_insn(_BPF_RET_K, 0, 0, _RET_ALLOW))
    prog.append(_insn(_BPF_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    return b"".join(prog)
