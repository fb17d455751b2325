"""Confinements a student's process applies to itself before any student code runs, and keeps
(the kernel holds them; they cannot be undone from inside).

`no_user_namespaces()`: a seccomp filter that refuses new user namespaces (`unshare` and
`clone` with CLONE_NEWUSER fail with EPERM; `clone3`, whose flags a classic filter cannot read,
fails with ENOSYS, on which glibc falls back to `clone`). A user namespace would give the
student's code a fresh set of capabilities over new namespaces of its own: the kernel's
largest attack surface, and a way around limits that are counted per user. bubblewrap's
`--disable-userns` does the same where bwrap itself makes a user namespace; this covers the
sandboxes that drop to an unprivileged uid instead (root's bubblewrap, the zygote, the
container mode).

`no_hidden_memory()`: a second filter, for the child that runs a memory case only (see
`autograder.session.memory_case`). That child's address space is capped (RLIMIT_AS, which counts every
mapping, shared and file-backed ones included); this filter refuses what could hold memory
outside any mapping of its own or compute beside it: anonymous shared mappings and
`memfd_create` (shmem pages that outlive a mapping), System V `shmget`, `socket` (another
process of the student's reached over a socket would compute the score matrix for it), and
new processes (`fork`, `vfork`, `clone` without CLONE_THREAD): each would have a cap of its
own, and eight of them held the whole score matrix between them (a reviewer's notebook, stop
42, scored the memory case). Threads share the capped address space, and stay allowed. And
`execve`/`execveat`: a new program in the same process keeps the cap's absolute value but
starts with a near-empty address space, and had room for the whole matrix (a reviewer's
notebook, stop 45, scored the memory case by exec'ing numpy code, then a stand-in child).

`seal_mappings()`: for the same child, right after its caps are set: every mapping it holds is
sealed (mseal, Linux 6.10+), so its code cannot unmap what the cap counted as taken.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct

CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
# audit arch, unshare, clone, clone3 (clone's flags are its first argument on both)
ARCHES = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}

# audit arch, mmap, memfd_create, shmget, socket, fork, vfork, execve, execveat, clone (aarch64
# has no fork, vfork)
NONE = 0xFFFFFFFF  # (no system call has this number)
HIDDEN_MEMORY_CALLS = {"x86_64": (0xC000003E, 9, 319, 29, 41, 57, 58, 59, 322, 56),
                       "aarch64": (0xC00000B7, 222, 279, 194, 198, NONE, NONE, 221, 281, 220)}
MAP_SHARED, MAP_ANONYMOUS = 0x01, 0x20  # (MAP_SHARED_VALIDATE, 0x03, has the MAP_SHARED bit)
CLONE_THREAD = 0x00010000

# classic BPF opcodes
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _program() -> bytes | None:
    arch = ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit, unshare, clone, clone3 = arch
    allow, eperm, enosys = (SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ERRNO | ENOSYS)
    return b"".join([
        _insn(LD_W_ABS, 0, 0, 4),              # 0: arch
        _insn(JEQ_K, 0, 9, audit),             # 1: a foreign arch (i386 via int 0x80): -> 11
        _insn(LD_W_ABS, 0, 0, 0),              # 2: syscall number
        _insn(JGE_K, 7, 0, 0x40000000),        # 3: x32 numbering: -> 11
        _insn(JEQ_K, 5, 0, clone3),            # 4: -> 10
        _insn(JEQ_K, 1, 0, unshare),           # 5: -> 7
        _insn(JEQ_K, 0, 2, clone),             # 6: -> 7, else -> 9
        _insn(LD_W_ABS, 0, 0, 16),             # 7: low 32 bits of the first argument (flags)
        _insn(JSET_K, 2, 0, CLONE_NEWUSER),    # 8: CLONE_NEWUSER -> 11
        _insn(RET_K, 0, 0, allow),             # 9
        _insn(RET_K, 0, 0, enosys),            # 10
        _insn(RET_K, 0, 0, eperm),             # 11
    ])


def _hidden_memory_program() -> bytes | None:
    arch = HIDDEN_MEMORY_CALLS.get(platform.machine())
    if arch is None:
        return None
    audit, mmap, memfd, shmget, socket, fork, vfork, execve, execveat, clone = arch
    allow, eperm = SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    return b"".join([  # (clone3, whose flags no classic filter reads, is ENOSYS: no_user_namespaces)
        _insn(LD_W_ABS, 0, 0, 4),              # 0: arch
        _insn(JEQ_K, 0, 17, audit),            # 1: a foreign arch: -> 19
        _insn(LD_W_ABS, 0, 0, 0),              # 2: syscall number
        _insn(JGE_K, 15, 0, 0x40000000),       # 3: x32 numbering: -> 19
        _insn(JEQ_K, 10, 0, mmap),             # 4: -> 15
        _insn(JEQ_K, 13, 0, memfd),            # 5: -> 19
        _insn(JEQ_K, 12, 0, shmget),           # 6: -> 19
        _insn(JEQ_K, 11, 0, socket),           # 7: -> 19
        _insn(JEQ_K, 10, 0, fork),             # 8: -> 19
        _insn(JEQ_K, 9, 0, vfork),             # 9: -> 19
        _insn(JEQ_K, 8, 0, execve),            # 10: -> 19
        _insn(JEQ_K, 7, 0, execveat),          # 11: -> 19
        _insn(JEQ_K, 0, 5, clone),             # 12: -> 13, else -> 18
        _insn(LD_W_ABS, 0, 0, 16),             # 13: low 32 bits of the first argument (flags)
        _insn(JSET_K, 3, 4, CLONE_THREAD),     # 14: a thread -> 18, else -> 19
        _insn(LD_W_ABS, 0, 0, 40),             # 15: low 32 bits of mmap's fourth argument (flags)
        _insn(JSET_K, 0, 1, MAP_SHARED),       # 16: not shared -> 18
        _insn(JSET_K, 1, 0, MAP_ANONYMOUS),    # 17: shared and anonymous -> 19
        _insn(RET_K, 0, 0, allow),             # 18
        _insn(RET_K, 0, 0, eperm),             # 19
    ])


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def no_user_namespaces() -> bool:
    """Install the filter on this process (and every process it starts); whether it took.
    Sets no_new_privs (which the kernel requires for an unprivileged filter)."""
    return _install(_program())


def no_hidden_memory() -> bool:
    """Install the memory case's filter (see the module docstring); whether it took."""
    return _install(_hidden_memory_program())


def _install(program: bytes | None) -> bool:
    if program is None or not hasattr(os, "fork"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        return False
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) == 0


MSEAL = 462  # mseal(2), Linux 6.10+ (one number on every architecture)


def seal_mappings() -> bool:
    """Seal every mapping this process holds now (mseal: no munmap, mremap or mprotect of them
    until it exits); whether the kernel can. For the memory case's child, right after its caps
    were set from what it holds: unmapping a library's unused code or a buffer it left (numpy's
    BLAS) would give back address space and data the cap counted, and the score matrix could
    grow into it. Mappings made later (the student's) stay free; what the child held is never
    unmapped legitimately. [vsyscall] is not a mapping of the process and cannot be sealed."""
    if platform.machine() not in ARCHES:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.syscall.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    try:
        with open("/proc/self/maps") as f:
            ranges = [line.split(None, 6) for line in f]
    except OSError:
        return False
    sealed = True
    for fields in ranges:
        if fields[-1].strip() == "[vsyscall]":
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if libc.syscall(MSEAL, start, end - start, 0) != 0:
            sealed = False
    return sealed
