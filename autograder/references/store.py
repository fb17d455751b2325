"""Reference outcomes kept on disk between grading runs (the instructor's cache; never seen by
students' code, and shipped only inside the Gradescope autograder zip).

Computing the reference outcomes (every case on the CPU and the meta device) is most of what a
`grade` run costs beyond the student's own code, and it gives the same answer every time for
the same grader, solutions, torch and seed. So the command line keeps them in one file per
(seed, quick) in the cache folder, named by a digest of everything they depend on: the
autograder's source, the solution notebooks and torch's version. Any change to those makes a
new file; the old ones are removed when the new one is written.

CUDA outcomes are kept apart, in a file per GPU (`cuda_tag`: the device, torch, CUDA and cuDNN
that computed them; another GPU or library rounds half precision its own way), so that a warm
`--device cuda` run does not compute them all again before the student's code runs.

The file is a `wire` frame (JSON and raw tensor bytes: loading it cannot execute code). Anything
wrong with it (missing, unreadable, corrupt, from another version) only means the outcomes are
computed again. Where (`settings.Settings.cache`): $AUTOGRADER_CACHE_DIR, else
$XDG_CACHE_HOME/attention-autograder, else ~/.cache/attention-autograder;
AUTOGRADER_CACHE_DIR=off turns it off. The folder is hidden from
students' code (see `sandbox.hidden_paths`): it holds the hidden inputs.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from .. import settings as _settings

FORMAT = 1  # bump when the stored layout changes


def cache_dir() -> Path | None:
    """The cache folder, or None when the cache is off (`settings.Settings.cache`)."""
    return _settings.current().cache


def digest() -> str:
    """A digest of what reference outcomes depend on: the grader's code, the solutions, torch."""
    import torch

    from .solutions import PACKAGE_DIR, solutions_dir

    h = hashlib.sha256(f"format {FORMAT} torch {torch.__version__}".encode())
    files = [(f.relative_to(PACKAGE_DIR).as_posix(), f) for f in sorted(PACKAGE_DIR.rglob("*.py"))]
    files += [(f"solutions/{f.name}", f) for f in sorted(solutions_dir().glob("*.ipynb"))]
    for name, f in files:
        h.update(name.encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:24]


def cuda_tag() -> str | None:
    """Which GPU, and which torch, CUDA and cuDNN compute on it (a digest), or None without one.
    (Asking starts CUDA in this process: the grader's own, which runs the CUDA references.)"""
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(0)
        ident = (f"{p.name} sm{p.major}{p.minor} {p.total_memory} torch {torch.__version__} "
                 f"cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()}")
    except Exception:  # a GPU that cannot be asked: its outcomes are not kept
        return None
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


class ReferenceStore:
    """The file of one (seed, quick) for the current digest; with `gpu` (a `cuda_tag`), the
    file of that GPU's CUDA outcomes."""

    def __init__(self, seed: int, quick: bool, folder: Path | None = None, gpu: str | None = None):
        self.folder = folder if folder is not None else cache_dir()
        self.gpu = gpu
        kind = f"references-cuda-{gpu}" if gpu else "references"
        self.family = f"s{seed}-{'quick' if quick else 'full'}-"
        self.prefix = f"{kind}-{self.family}"
        self.path = self.folder / f"{self.prefix}{digest()}.agw" if self.folder else None

    def load(self) -> dict | None:
        """The stored plain data (see `ReferenceCache.export`), or None."""
        from ..shared import wire

        if self.path is None or not self.path.is_file():
            return None
        try:
            data = wire.load(self.path)
        except (OSError, EOFError, ValueError):
            return None
        if not (isinstance(data, dict) and isinstance(data.get("cases"), list)
                and isinstance(data.get("outcomes"), list)):
            return None
        return data

    def save(self, plain: dict) -> bool:
        """Write atomically (a concurrent run reads the old file or the new one, never half of
        one); remove this (seed, quick)'s files of other digests. False if it cannot be written."""
        from ..shared import wire

        if self.path is None:
            return False
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(wire.encode(plain))
            os.replace(tmp, self.path)
        except BaseException as e:  # (a stop, Ctrl-C, too: no 10 MB temporary file left behind)
            try:
                os.unlink(tmp)
            except (OSError, UnboundLocalError):
                pass
            if isinstance(e, (OSError, ValueError)):
                return False
            raise
        # This GPU's older files, and every GPU's files of another grader, solutions or torch
        # (the digest: a GPU's tag names its torch too, so an upgrade would leave them behind).
        # Another GPU's files of this digest stay: a cluster's nodes may share the folder.
        olds = set(self.folder.glob(f"{self.prefix}*.agw"))
        if self.gpu:
            olds |= {f for f in self.folder.glob(f"references-cuda-*-{self.family}*.agw")
                     if not f.name.endswith(f"-{digest()}.agw")}
        for old in olds:
            if old != self.path:
                try:
                    old.unlink()
                except OSError:
                    pass
        return True


@contextlib.contextmanager
def persisted(references, seed: int, quick: bool, cuda: bool = False):
    """Load the stored outcomes into `references` (a `grading.ReferenceCache`) for the block;
    afterwards store what it holds if the block computed any. With `cuda` (a grader with CUDA
    rows), this GPU's CUDA outcomes too. Yields the store of the CPU's."""
    store = ReferenceStore(seed, quick)
    tag = cuda_tag() if cuda and store.folder is not None else None
    stores = {False: store, True: ReferenceStore(seed, quick, gpu=tag)} if tag else {False: store}
    for each in stores.values():
        data = each.load()
        if data is not None:
            references.merge(data)
    before = {is_cuda: references.held(cuda=is_cuda) for is_cuda in stores}
    try:
        yield store
    finally:
        for is_cuda, each in stores.items():
            if references.held(cuda=is_cuda) > before[is_cuda]:
                each.save(references.export(seed, quick, only_cuda=is_cuda))
