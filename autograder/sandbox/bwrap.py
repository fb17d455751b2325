"""A `SandboxPolicy` rendered to bubblewrap's command line, and that command line started without
showing its arguments to the sandbox. Nothing is decided here: every path, size and uid comes
from the policy; only the spelling of options an older bwrap lacks (`variant`) is chosen."""
from __future__ import annotations

import os
import shutil
import subprocess

from ..shared.mounts import Mount
from .policy import SandboxPolicy


def bwrap_command(policy: SandboxPolicy, python_argv: list[str], variant: int = 0) -> list[str]:
    """The bwrap command line that runs `python_argv` in the sandbox `policy` describes.

    variant 0 is the full set of options; variant 1 leaves out the ones an older bwrap lacks.
    """
    if policy.mode != "bubblewrap":
        raise ValueError(f"a {policy.mode} sandbox has no bubblewrap command line")
    args = [shutil.which("bwrap") or "bwrap"] + _namespace_options(policy.as_root, variant)
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    for mount in policy.mounts:
        args += mount_options(mount, variant)
    args += ["--chdir", "/tmp"]
    args += _privilege_options(policy)
    return args + python_argv


def _namespace_options(root: bool, variant: int) -> list[str]:
    """The namespaces to unshare."""
    if root:  # a user namespace would map the sandbox's uid to root outside; drop with setpriv
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    args = ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try"]
    if variant == 0:
        args += ["--disable-userns"]
    return args


def mount_options(mount: Mount, variant: int = 0) -> list[str]:
    """One mount as bwrap's options (--perms and --size before the option they modify)."""
    kind, dest = mount.kind, mount.dest
    if kind == "tmpfs" and variant == 1:  # no --perms or --size in an older bwrap
        return ["--tmpfs", dest] + (["--chmod", mount.perms, dest] if mount.perms else [])
    args = ["--perms", mount.perms] if mount.perms else []
    if mount.size:
        args += ["--size", str(mount.size)]
    if kind in ("ro-bind", "dev-bind", "symlink"):
        return args + [f"--{kind}", mount.source, dest]
    if kind == "devpts":  # (bwrap's --dev makes one; only the zygote mounts it itself)
        raise ValueError("bubblewrap has no --devpts option: use a dev mount")
    return args + [f"--{kind}", dest]


def _privilege_options(policy: SandboxPolicy) -> list[str]:
    """How the sandboxed process gives up root (where the grader runs as root), ending with `--`.

    The zygote (`keep_root`) stays root with its capabilities: it never runs student code and
    drops to the student's uid in every process it forks (`autograder.runtime.zygote`)."""
    if policy.as_root and policy.keep_root:
        return ["--cap-add", "ALL", "--"]
    if policy.setpriv:
        uid = policy.uid
        return ["--", policy.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return ["--"]  # unprivileged, or the child drops privileges itself (its config's "drop")


def popen_bwrap(argv: list[str], pass_fds=(), **kwargs) -> subprocess.Popen:
    """Start a bwrap command line with its arguments read from a file descriptor (`--args`),
    not from its command line: bwrap is the sandbox's first process (PID 1 with --unshare-pid),
    and every process inside can read /proc/1/cmdline, which would list the hidden paths (the
    solutions, the results, the reference cache) as --tmpfs targets."""
    fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC) if hasattr(os, "memfd_create") else None
    if fd is None:  # (not Linux: no bwrap either)
        return subprocess.Popen(argv, pass_fds=pass_fds, **kwargs)
    end = argv.index("--")  # (the command itself must stay on the command line: bwrap's rule)
    try:
        os.write(fd, b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in argv[1:end]))
        os.lseek(fd, 0, os.SEEK_SET)
        return subprocess.Popen([argv[0], "--args", str(fd), *argv[end:]], pass_fds=(*pass_fds, fd), **kwargs)
    finally:
        os.close(fd)
