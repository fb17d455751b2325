"""The three sandbox modes and the choice between them: bubblewrap where it can create namespaces,
the container mode (a uid per student, no namespaces) as root without them, else the fallback
(resource limits only, with a warning)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from enum import Enum

from .. import settings as _settings
from .limits import Limits, NOBODY
from .bwrap import bwrap_command
from .policy import sandbox_policy
from .visibility import PACKAGE_DIR, RUNTIME_DEST, hidden_paths, readable_secrets


class SandboxMode(str, Enum):
    """How a student's code was isolated; carried from the session to the reports. A str, so
    it compares equal to (and prints as) its value."""

    BUBBLEWRAP = "bubblewrap"
    CONTAINER = "container"
    FALLBACK = "fallback"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)




_PROBE_LOCK = threading.Lock()
_PROBE: dict = {}


def probe_bubblewrap() -> tuple[bool, str, int]:
    """Whether bubblewrap can run the child here: (ok, why not, variant). Cached per process."""
    with _PROBE_LOCK:
        if "result" in _PROBE:
            return _PROBE["result"]
        if sys.platform != "linux":
            result = (False, f"bubblewrap needs Linux (this is {sys.platform})", 0)
        elif not shutil.which("bwrap"):
            result = (False, "bubblewrap (bwrap) is not installed", 0)
        else:
            result = (False, "", 0)
            policy = sandbox_policy(SandboxMode.BUBBLEWRAP, Limits(), hidden_paths())
            want_uid = NOBODY if os.geteuid() == 0 else os.getuid()
            # The grader's folder may exist there as an empty mount point (hidden inside a
            # bound folder): what matters is that none of its files can be read.
            code = ("import os, sys; sys.path[:0] = [%r]; import autograder; p = %r; "
                    "print(os.getuid(), os.path.isdir(p) and bool(os.listdir(p)))"
                    % (RUNTIME_DEST, str(PACKAGE_DIR)))
            reasons = []
            for variant in (0, 1):
                argv = [sys.executable, "-B", "-c", code]
                if policy.drops_itself:
                    argv = [sys.executable, "-B", "-c",
                            f"import os; os.setgroups([]); os.setgid({NOBODY}); "
                            f"os.setuid({NOBODY}); " + code]
                cmd = bwrap_command(policy, argv, variant)
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                                       stdin=subprocess.DEVNULL, env=policy.environment("probe"))
                except (OSError, subprocess.TimeoutExpired) as e:
                    reasons.append(str(e))
                    continue
                if r.returncode == 0 and r.stdout.split() == [str(want_uid), "False"]:
                    result = (True, "", variant)
                    break
                reasons.append((r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1])
            if not result[0]:
                result = (False, f"bubblewrap ({shutil.which('bwrap')}) is installed but cannot "
                                 "start a sandbox here: " + "; ".join(reasons), 0)
        _PROBE["result"] = result
        return result


class SandboxUnavailable(RuntimeError):
    """Bubblewrap is installed (or was asked for) but cannot start a sandbox here. The command
    line turns this into exit status 3: grading never goes on unsandboxed because of it."""


FIX = ("Fix: let bubblewrap create namespaces (unprivileged user namespaces enabled: "
       "sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
       "kernel.apparmor_restrict_unprivileged_userns=0; in Docker run the grader as root or "
       "with --security-opt seccomp=unconfined --cap-add SYS_ADMIN), or grade trusted "
       "submissions without a sandbox with --sandbox none.")

FALLBACK_WARNING = ("the notebook ran as a plain child process with resource limits and "
                    "timeouts, but without namespaces: it could read the grader's files "
                    "(the solutions too) and reach the network. Grade untrusted submissions on "
                    "Linux with bubblewrap installed.")


@dataclass(frozen=True)
class SandboxChoice:
    """The sandbox, decided once at an entry point (the command line, nbgrader, Gradescope) and
    handed down as this object to the grader, the batch workers and every session: nothing
    below the entry point probes or reads $AUTOGRADER_SANDBOX again."""

    mode: SandboxMode
    note: str = ""  # the sentence for the report when it is not bubblewrap


def resolve_sandbox(requested: "str | SandboxChoice | None" = None, hide=()) -> SandboxChoice:
    """`requested` as a SandboxChoice: one already made is kept; else `choose_mode` decides
    ("auto" or None: $AUTOGRADER_SANDBOX, else the best that works here)."""
    if isinstance(requested, SandboxChoice):
        return requested
    return SandboxChoice(*choose_mode(None if requested == "auto" else requested, hide))


def choose_mode(requested: str | None = None, hide=()) -> tuple[SandboxMode, str]:
    """(mode, note): the sandbox to use, and a sentence for the report when it is not bubblewrap.

    requested: "auto" (default; also $AUTOGRADER_SANDBOX), "bubblewrap", "container" or
    "none"/"fallback". auto takes bubblewrap where it can start a sandbox; else, where it is
    installed but cannot start and the grader is root on Linux (a Docker, Gradescope or
    Kubernetes container without the capabilities namespaces need), the container mode,
    provided the secret paths (`hide` and `hidden_paths`) are unreadable to a student's uid;
    else the fallback, only where bubblewrap is not installed. Anything else raises SandboxUnavailable rather than grading unsandboxed:
    bubblewrap installed but unable to start for a grader that is not root, a container whose
    secrets a student could read, a mode asked for that cannot work here.
    """
    requested = (requested or _settings.current().sandbox or "auto").lower()
    if requested in ("none", "fallback", "off"):
        return SandboxMode.FALLBACK, ("Sandbox: none (--sandbox none or AUTOGRADER_SANDBOX=none): "
                            + FALLBACK_WARNING)
    if requested not in ("auto", "bubblewrap", "bwrap", "container"):
        raise ValueError(f"unknown sandbox mode {requested!r} (auto, bubblewrap, container or none)")
    why = ""
    if requested != "container":
        ok, why, _ = probe_bubblewrap()
        if ok:
            return SandboxMode.BUBBLEWRAP, ""
    installed = sys.platform == "linux" and shutil.which("bwrap")
    root = sys.platform == "linux" and os.geteuid() == 0
    if root and (requested == "container" or (requested == "auto" and installed)):
        readable = readable_secrets(hidden_paths(hide))
        if not readable:
            return SandboxMode.CONTAINER, f"Sandbox: container ({why or 'asked for'}): " + CONTAINER_NOTE
        raise SandboxUnavailable(
            f"{why + '; ' if why else ''}the container mode (a uid of the student's own) cannot be used: "
            f"a student's uid could read {', '.join(readable[:4])}. Fix: make them unreadable to other "
            f"users (chmod -R go-rwx {' '.join(readable[:4])}; the Gradescope run_autograder does this), "
            "or let bubblewrap create namespaces.")
    if requested == "container":
        raise SandboxUnavailable("--sandbox container needs a grader that runs as root on Linux.")
    if requested in ("bubblewrap", "bwrap") or installed:
        raise SandboxUnavailable(f"{why}. {FIX}" if installed else
                                 f"--sandbox bubblewrap was asked for, but {why}. Install "
                                 "bubblewrap (Debian/Ubuntu: apt-get install bubblewrap).")
    return SandboxMode.FALLBACK, f"Sandbox: fallback ({why}): " + FALLBACK_WARNING


CONTAINER_NOTE = ("no namespaces here, so each student's code runs as a uid of its own with resource "
                  "limits and timeouts; the grader's files are hidden by their owner and mode, every "
                  "process of that uid is killed when the student ends, but the network is not cut off.")
