"""One step of a sandbox's file system as plain data. The grader's policy builds these
(`autograder.sandbox.policy`) and renders them to bubblewrap's options; the zygote receives the
ones each student's sandbox makes for itself as plain dicts and applies them with mount(2)
(`autograder.runtime.zygote`). One description, so the two kinds of sandbox cannot drift."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# ro-bind, dev-bind: `source` (a host path) at `dest`; symlink: `dest` points to `source`;
# tmpfs: an empty, size-capped file system; dir: an empty folder; proc, dev, devpts: fresh ones.
KINDS = ("ro-bind", "dev-bind", "symlink", "tmpfs", "dir", "proc", "dev", "devpts")


@dataclass(frozen=True)
class Mount:
    """One mount (or folder, or link) of the sandbox, at `dest` inside it."""

    kind: str
    dest: str
    source: str = ""        # ro-bind, dev-bind: the host path; symlink: its target
    perms: str = ""         # octal mode of what is made ("1777"); "": the default
    size: int = 0           # tmpfs: its size in bytes; 0: not capped
    optional: bool = False  # made only where `dest` exists (the zygote's /dev/shm, /dev/pts)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown mount kind {self.kind!r}")
        if not self.dest.startswith("/"):
            raise ValueError(f"a mount's destination must be absolute: {self.dest!r}")

    def to_plain(self) -> dict:
        return asdict(self)

    @classmethod
    def from_plain(cls, plain: dict) -> "Mount":
        """The Mount a plain dict describes; ValueError for unknown keys or wrong types."""
        names = {f.name: f for f in fields(cls)}
        if not isinstance(plain, dict) or set(plain) - set(names):
            raise ValueError(f"not a mount: {plain!r}")
        for key, value in plain.items():
            wanted = {"size": int, "optional": bool}.get(key, str)
            if type(value) is not wanted:
                raise ValueError(f"mount field {key!r} must be a {wanted.__name__}: {value!r}")
        return cls(**plain)
