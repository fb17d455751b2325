"""The grader side of isolation: how the processes that run a student's code are launched,
limited and killed. Nothing here runs beside student code (that is `runtime/`).

Three modes (`modes.py`; AUTOGRADER_SANDBOX=auto|bubblewrap|container|none):
- bubblewrap: the child has its own PID, mount, network, IPC and UTS namespaces, and a
  filesystem that is an allow-list (`policy.py`, rendered to argv by `bwrap.py`): the system
  and Python installation read-only, the staged runtime (`shared/` and `runtime/`) at
  /run/autograder-runtime, a size-capped /tmp. Not the repository, the solutions, the reference cache, /work or /root. As root it runs as a
  uid of the student's own (`uids.py`); batch grading forks each student's sandbox from a
  zygote that has imported torch once (`warm.py`).
- container: as root where namespaces cannot be made (Docker, Gradescope): a uid of the
  student's own, the grader's secrets made unreadable to it, a warm worker of that uid that
  imports torch once and forks each chapter (`warm.py`), and everything of that uid removed
  afterwards (`uid_cleanup.py`).
- fallback: a plain child process with the same limits, for a student's laptop; the report
  says the code could read what the grader's user can.
An installed bubblewrap that cannot start raises SandboxUnavailable: never a silent fallback.

Limits (`limits.py`), applied by the child to itself before any student code runs, as hard
limits: memory (RLIMIT_DATA), CPU time, file size, open files, tasks, no core dumps; and the
confinements of `runtime/confine.py` (no new user namespaces; the memory case's cap).
"""
