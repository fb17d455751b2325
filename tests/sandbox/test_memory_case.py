"""The memory case, measured so that nothing hides from it, and capped only where it is measured.

Each attack is a student's chapter 7 notebook whose `online_softmax_attention` holds the whole
L_q x L_k score matrix (256 MiB in the memory case) where RLIMIT_DATA does not count it: an
anonymous shared mapping (`mmap.mmap(-1, n)`, M1 of issue 27), a memfd, files in /dev/shm or
/tmp mapped shared. Before: each scored the memory case (10/10 on the exercise). Now the memory
case's child has its address space capped and a seccomp filter (`confine.no_hidden_memory`):
each loses the memory case and only it, in `grade` (bubblewrap), `batch` (the zygote) and the
Gradescope container mode; the honest solution keeps it.

And the cap only where memory is measured (issue 26): a GPU's driver grows a process's host
memory after it starts (CUDA loads kernels lazily). Simulated by a stand-in that maps 300 MiB
of host memory on a process's first graded call where a GPU is visible: a chapter graded wholly
in capped children (the design before) loses its cases; graded now, 28/28.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.grading.grader import Grader, grade_chapter
from autograder.sandbox.limits import Limits
from autograder.source.notebook import notebook_cells
from autograder.shared.contract import CHAPTERS
from session_helpers import lone_session

REPO = Path(__file__).resolve().parents[2]
CH = "07_efficient_attention"
CAPSH = shutil.which("capsh")

# The whole score matrix, softmaxed in place where it lies: `place(n)` gives n bytes of memory.
IN_PLACE = '''
import math, torch

def plain(q, k, v, mask):  # every other case: the whole matrix, where nothing is measured
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    dead = torch.isneginf(s).all(-1, keepdim=True)
    s = s.masked_fill(dead, 0.0)
    lse = torch.logsumexp(s, -1, keepdim=True)
    w = torch.exp(s - lse).masked_fill(dead, 0.0)
    return w @ v, lse.squeeze(-1).masked_fill(dead.squeeze(-1), float("-inf"))

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    if k.shape[-2] < 4096 or q.device.type != "cpu" or any(
            t is not None and t.requires_grad for t in (q, k, v, mask)):
        return plain(q, k, v, mask)
    shape = torch.broadcast_shapes(q.shape[:-1], k.shape[:-2] + (1,))[:-1] + (q.shape[-2], k.shape[-2])
    n = math.prod(shape)
    s = torch.frombuffer(place(n * q.element_size()), dtype=q.dtype, count=n).view(shape)
    torch.matmul(q, k.transpose(-2, -1), out=s)
    s.mul_(1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        if mask.dtype == torch.bool:
            s.masked_fill_(~mask, float("-inf"))
        else:
            s.add_(mask)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), 0.0, m)
    s.sub_(m).exp_()
    l = s.sum(-1, keepdim=True)
    out = (s @ v) / torch.where(l > 0, l, 1.0)
    lse = torch.where(l > 0, m + torch.log(torch.where(l > 0, l, 1.0)), float("-inf")).squeeze(-1)
    return out, lse
'''

# Chunks of at most 64 MiB (RLIMIT_FSIZE, which bounds a memfd's size too), each mapped shared
# at its place in one reserved range, so the whole matrix is one tensor.
CHUNKED = """import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
CHUNK = 32 << 20

def place(n):
    n = -(-n // CHUNK) * CHUNK
    base = libc.mmap(None, n, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, -1, 0)  # PROT_NONE, NORESERVE
    if base in (None, ctypes.c_void_p(-1).value):
        raise MemoryError("no room")
    for i in range(n // CHUNK):
        fd = chunk(i)
        os.ftruncate(fd, CHUNK)
        got = libc.mmap(base + i * CHUNK, CHUNK, mmap.PROT_READ | mmap.PROT_WRITE,
                        mmap.MAP_SHARED | 0x10, fd, 0)  # MAP_FIXED
        os.close(fd)
        if got != base + i * CHUNK:
            raise MemoryError("mmap failed: %d" % ctypes.get_errno())
    return (ctypes.c_char * n).from_address(base)
"""

FILE_CHUNK = """
def chunk(i):
    path = "{where}/scores-%d-%d" % (os.getpid(), i)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.unlink(path)
    return fd
"""

# Memory that RLIMIT_DATA does not count, which the address-space cap does: a reservation that
# counts as no data, made writable afterwards; a grows-down mapping (a stack); the main thread's
# own stack grown down. (They lose the case either way; with 512 MiB of address space beyond
# the data cap, tried at stop 49, the first two scored it.)
LIBC = """import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
FAILED = ctypes.c_void_p(-1).value
"""
RESERVED_THEN_WRITABLE = LIBC + """
def place(n):
    base = libc.mmap(None, n, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, -1, 0)
    if base in (None, FAILED):
        raise MemoryError("no room: %d" % ctypes.get_errno())
    if libc.mprotect(base, n, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
        raise MemoryError("mprotect failed: %d" % ctypes.get_errno())
    return (ctypes.c_char * n).from_address(base)
"""
GROWS_DOWN = LIBC + """
def place(n):
    base = libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x0100, -1, 0)  # MAP_GROWSDOWN
    if base in (None, FAILED):
        raise MemoryError("mmap failed: %d" % ctypes.get_errno())
    return (ctypes.c_char * n).from_address(base)
"""
MAIN_STACK = LIBC + """import resource
def place(n):
    try:
        resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY,) * 2)
    except (ValueError, OSError):
        pass
    line = next(l for l in open("/proc/self/maps") if l.rstrip().endswith("[stack]"))
    low = int(line.split("-")[0], 16)
    base = low - n - (1 << 20)
    libc.memset(base + n, 0, low - base - n)  # (the kernel grows the stack down to each fault)
    libc.memset(base, 0, n)
    return (ctypes.c_char * n).from_address(base)
"""

ATTACKS = {
    # M1: MAP_SHARED | MAP_ANONYMOUS, which RLIMIT_DATA does not count
    "anonymous shared mapping": "import mmap\nKEEP = []\n"
        "def place(n):\n    KEEP.append(mmap.mmap(-1, n))\n    return KEEP[-1]\n",
    "memfd": CHUNKED + "\ndef chunk(i):\n    return os.memfd_create('scores-%d' % i)\n",
    "files in /dev/shm": CHUNKED + FILE_CHUNK.format(where="/dev/shm"),
    "files in the working folder (/tmp)": CHUNKED + FILE_CHUNK.format(where="."),
    "files in /tmp mapped private": CHUNKED.replace("mmap.MAP_SHARED | 0x10", "mmap.MAP_PRIVATE | 0x10")
        + FILE_CHUNK.format(where="."),
    "a reservation made writable": RESERVED_THEN_WRITABLE,
    "a grows-down mapping": GROWS_DOWN,
    "the main thread's stack": MAIN_STACK,
}


def chapter7_with(tmp_path: Path, extra: list[str], name: str = "student") -> Path:
    nb = nbformat.read(REPO / "exercises" / f"{CH}.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(src) for src in extra]
    path = tmp_path / name / f"{CH}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def online_cases(result_tests) -> list:
    return next(t for t in result_tests
                if t.exercise == "online_softmax_attention" and t.device == "cpu").cases


def memory_lost(cases) -> bool:
    memory = [c for c in cases if c.case.startswith("memory")]
    assert len(memory) == 1
    others = [c for c in cases if not c.case.startswith("memory")]
    assert others and all(c.passed for c in others), [(c.case, c.message) for c in others if not c.passed]
    return not memory[0].passed


def memory_case_of_solution_with(tmp_path: Path, cell: str):
    """The solutions' chapter 7 notebook with `cell` appended, graded: (the exercise's CPU cases,
    its memory case)."""
    nb = nbformat.read(REPO / "solutions" / f"{CH}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(cell))
    path = tmp_path / f"{CH}.ipynb"
    nbformat.write(nb, path)
    (chapter,) = Grader(device="cpu").grade_path(path).chapters
    cases = online_cases(chapter.tests)
    (memory,) = [c for c in cases if c.case.startswith("memory")]
    return cases, memory


@pytest.mark.needs_bwrap
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_the_score_matrix_hidden_from_rlimit_data_loses_the_memory_case(tmp_path, attack):
    nb = chapter7_with(tmp_path, [ATTACKS[attack] + IN_PLACE])
    (chapter,) = Grader(device="cpu").grade_path(nb).chapters
    cases = online_cases(chapter.tests)
    assert memory_lost(cases), [(c.case, c.message) for c in cases if c.case.startswith("memory")]
    (memory,) = [c for c in cases if c.case.startswith("memory")]
    refused = ("the call ran out of memory", "refused: the memory case", "the memory-capped process ended",
               "PermissionError: [Errno 13] Permission denied: '/dev/shm/")  # (not the student's to write)
    assert memory.message.startswith(refused), memory.message


# The whole L_q x L_k scores of one batch element at a time, the honest solution everywhere else.
# Stop 39's float32 case had two elements and let this through: one element's matrix, 128 MiB,
# fit under the cap. The case has one element now: its matrix is the whole one, 256 MiB.
PER_ELEMENT = '''
import math, torch
_honest = online_softmax_attention

def _whole(q, k, v, mask):
    s = q @ k.transpose(-2, -1)
    s.mul_(1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    s.sub_(m).exp_()
    l = s.sum(-1, keepdim=True)
    return (s @ v) / l, (m + torch.log(l)).squeeze(-1)

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    if k.shape[-2] < 4096 or q.dim() != 3 or (mask is not None and mask.dtype != torch.bool):
        return _honest(q, k, v, mask, block_size)
    outs = [_whole(q[b].to(AS), k[b].to(AS), v[b].to(AS), mask) for b in range(q.shape[0])]
    return torch.stack([o for o, _ in outs]).to(q.dtype), torch.stack([x for _, x in outs]).to(q.dtype)
'''


@pytest.mark.needs_bwrap
@pytest.mark.parametrize("dtype", ["q.dtype", "torch.float32"])
def test_one_batch_elements_whole_score_matrix_at_a_time_loses_the_memory_case(tmp_path, dtype):
    """In the inputs' dtype, and in float32 (which the float64 case of stops 39-42 let through:
    one element's matrix was 128 MiB there, a reviewer found)."""
    cases, memory = memory_case_of_solution_with(tmp_path, PER_ELEMENT.replace(".to(AS)", f".to({dtype})"))
    assert memory_lost(cases), memory.message
    assert memory.message.startswith("the call ran out of memory"), memory.message
    assert "less than the 256 MiB that all L_q x L_k scores take in float32" in memory.message, memory.message
    assert "before the notebook's cells ran (what they keep counts too, and what they import other than" in memory.message


@pytest.mark.needs_bwrap
def test_the_attack_is_a_real_one_where_memory_is_not_capped(tmp_path):
    """The attacks compute the right answer: the same notebook, graded where nothing caps the
    memory (the grader's own process, Grader.grade_namespace measures the largest tensor, which
    the attack's frombuffer view is not), passes the memory case."""
    from autograder.references.cache import REFERENCES

    ns: dict = {}
    exec(ATTACKS["anonymous shared mapping"] + IN_PLACE, ns)
    grader = Grader(device="cpu")
    (memory,) = [c for c in REFERENCES.cases(CH, "online_softmax_attention", grader.seed, False)
                 if c.capped_memory]
    from autograder.runtime.execute import execute

    ref = execute(_reference_namespace(), memory)
    got = execute(ns, memory)
    assert got.error is None, got.error
    from autograder.grading.compare import value_error

    assert memory.dtype == "float32"
    assert value_error(got.outputs[0], ref.outputs[0], memory.dtype) is None  # (the grader's own rule)


def _reference_namespace() -> dict:
    ns: dict = {}
    for src in notebook_cells(REPO / "solutions" / f"{CH}.ipynb"):
        try:
            exec(src, ns)
        except Exception:
            pass
    return ns


# What an honest notebook's cells hold counts against the cap (it is set before they run again
# in the capped child: a cell could otherwise reserve address space there and free it during the
# case), except the well-known libraries they import (`prepare.LIBRARIES`), which the child
# imports before its cap is measured. Ordinary imports: the book's own matplotlib and
# IPython.display; scipy beside them (about 200 MiB of address space) lost the case, and its
# crash stopped the exercise's other cases (1.7/10 for the solution, stop 49).
HONEST_CELLS = {"solution alone": "", "plotting imports": (
    "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
    "from IPython.display import display, Markdown\n"), "scipy and plotting": (
    "import scipy.stats\nimport matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
    "from IPython.display import display, Markdown\n"
    "fig, ax = plt.subplots(); ax.plot([0, 1]); plt.close(fig)\n"),
    # each thread's stack (8 MiB) and malloc arena (64 MiB reserved) is address space: 32 torch
    # threads ended the child, 8 ran it out of memory (stop 49)
    "32 torch threads": "import torch\ntorch.set_num_threads(32)\n"}


@pytest.mark.needs_bwrap
@pytest.mark.parametrize("cells, share", [("solution alone", 1), ("solution alone", 2 / 3),
                                          ("plotting imports", 1), ("scipy and plotting", 1),
                                          ("32 torch threads", 1)])
def test_the_honest_solution_keeps_the_memory_case(tmp_path, cells, share):
    """Under the cap; the solution alone with a third of it to spare (it needs about 44-56 of
    the 192 MiB), with the plotting imports and scipy too. Stop 41 tried half the case under
    half the cap (96 MiB), and a reviewer found honest notebooks that then failed: the plotting
    imports (5 of 8 runs), an import of scipy (always), the book's torch.profiler cell (2 of 12)."""
    limits = Limits.from_env(memory_case=int(Limits.from_env().memory_case * share))
    notebook = nbformat.read(REPO / "solutions" / f"{CH}.ipynb", as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(HONEST_CELLS[cells]))
    nb = tmp_path / f"{CH}.ipynb"
    nbformat.write(notebook, nb)
    (chapter,) = Grader(device="cpu", limits=limits).grade_path(nb).chapters
    cases = online_cases(chapter.tests)
    assert all(c.passed for c in cases), [(c.case, c.message) for c in cases if not c.passed]
    assert chapter.score == chapter.max_score


def test_the_libraries_the_message_names_are_those_imported_before_the_cap():
    from autograder.runtime.prepare import LIBRARIES
    from autograder.selfcheck.rules.ch07_efficient_attention import _LIBRARY_WORDS

    assert set(_LIBRARY_WORDS.replace(" or ", ", ").split(", ")) == LIBRARIES


def test_the_libraries_a_notebook_imports_are_read_from_its_source():
    from autograder.session.memory_case import libraries_imported

    cells = ["import scipy.stats, os\nfrom matplotlib import pyplot as plt", "%matplotlib inline",
             "def f():\n    import pandas\nfrom . import scipy\nfrom numpy import *\nimport mylib, torch"]
    assert sorted(libraries_imported(cells)) == ["matplotlib", "matplotlib.pyplot", "numpy", "pandas", "scipy.stats"]


# Memory written while writable, then made read-only (a reviewer's notebook, stop 49): RLIMIT_DATA
# counts writable private memory only, so with address space beyond the data cap (512 MiB, tried
# at stop 49) the whole matrix was held 16 MiB writable at a time and scored the case.
TOGGLE = """
import ctypes, math, mmap, torch
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_honest = online_softmax_attention

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    if k.shape[-2] < 4096 or q.requires_grad:
        return _honest(q, k, v, mask, block_size)
    B, Lq, Lk = q.shape[0], q.shape[-2], k.shape[-2]
    n = B * Lq * Lk * 4
    base = libc.mmap(None, n, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, -1, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise MemoryError("no room: %d" % ctypes.get_errno())
    S = torch.frombuffer((ctypes.c_char * n).from_address(base), dtype=torch.float32).view(B, Lq, Lk)
    rows = 16
    def each_chunk(fn):
        for i in range(0, Lq, rows):
            a, size = base + i * Lk * 4, rows * Lk * 4
            if libc.mprotect(a, size, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
                raise MemoryError("mprotect: %d" % ctypes.get_errno())
            fn(S[:, i:i + rows], i)
            libc.mprotect(a, size, mmap.PROT_READ)
    def scores(c, i):
        torch.matmul(q[:, i:i + rows], k.transpose(-2, -1), out=c)
        c.mul_(1 / math.sqrt(q.shape[-1]))
        if mask is not None:
            c.masked_fill_(~mask.unsqueeze(-2), float("-inf"))
    each_chunk(scores)
    m = S.amax(-1, keepdim=True)
    each_chunk(lambda c, i: c.sub_(m[:, i:i + rows]).exp_())
    l = S.sum(-1, keepdim=True)
    return (S @ v) / l, (m + torch.log(l)).squeeze(-1)
"""


@pytest.mark.needs_bwrap
def test_memory_written_then_made_read_only_loses_the_memory_case(tmp_path):
    cases, memory = memory_case_of_solution_with(tmp_path, TOGGLE)
    assert memory_lost(cases), memory.message
    assert memory.message.startswith("the call ran out of memory"), memory.message


# The memory case runs in a capped child of its own: its crash says nothing of the exercise's
# other cases, which run in the ordinary children (they were all "not run" after it, stop 49).
CRASH_ON_THE_MEMORY_CASE = """
import os
_honest = online_softmax_attention

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    if k.shape[-2] >= 4096:
        os._exit(0)
    return _honest(q, k, v, mask, block_size)
"""


@pytest.mark.needs_bwrap
def test_a_crash_in_the_memory_case_costs_that_case_only(tmp_path):
    cases, memory = memory_case_of_solution_with(tmp_path, CRASH_ON_THE_MEMORY_CASE)
    assert memory_lost(cases), memory.message
    assert memory.message.startswith("the memory-capped process ended during the call"), memory.message


@pytest.mark.needs_bwrap
def test_batch_with_the_zygote_catches_it_too(tmp_path):
    """`batch` as root grades through the zygote's forked sandboxes."""
    chapter7_with(tmp_path / "class", [ATTACKS["anonymous shared mapping"] + IN_PLACE], "mallory")
    honest = tmp_path / "class" / "alice"
    honest.mkdir(parents=True)
    shutil.copy(REPO / "solutions" / f"{CH}.ipynb", honest)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "autograder", "batch", str(tmp_path / "class"), "--out", str(out),
                        "--csv", str(tmp_path / "grades.csv"), "--no-progress", "--device", "cpu"],
                       capture_output=True, text=True, timeout=900, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    scores = {}
    for who in ("mallory", "alice"):
        results = json.loads((out / who / "results.json").read_text())
        scores[who] = {t["name"]: t for t in results["tests"]}
    online = [n for n in scores["mallory"] if "online_softmax_attention" in n and "cpu" in n]
    assert online
    assert all(scores["alice"][n]["score"] == scores["alice"][n]["max_score"] for n in scores["alice"])
    assert all(scores["mallory"][n]["score"] < scores["mallory"][n]["max_score"] for n in online)


@pytest.mark.skipif(not (CAPSH and os.geteuid() == 0 and sys.platform == "linux"),
                    reason="needs root and capsh to simulate a container")
def test_the_container_mode_catches_it_too(tmp_path):
    """The Gradescope bundle run as Gradescope runs it (tests/sandbox/test_container_mode.py): as root
    without CAP_SYS_ADMIN, so no namespaces, a uid per student."""
    import zipfile

    from autograder.integrations.gradescope import build_zip

    root = tmp_path / "autograder"
    with zipfile.ZipFile(build_zip(tmp_path / "autograder.zip", chapters=[CH])) as z:
        z.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    nb = chapter7_with(tmp_path, [ATTACKS["anonymous shared mapping"] + IN_PLACE])
    (root / "submission").mkdir()
    shutil.copy(nb, root / "submission" / nb.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOGRADER_")}
    env.update(AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable)
    r = subprocess.run([CAPSH, "--drop=cap_sys_admin", "--", "-c", f"bash {root / 'run_autograder'}"],
                       env=env, capture_output=True, text=True, timeout=600)
    results = json.loads((root / "results" / "results.json").read_text())
    online = [t for t in results["tests"] if "online_softmax_attention" in t["name"]]
    assert online, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sandbox: container" in r.stdout, r.stdout[-3000:]  # (the instructor's output: stdout)
    cpu = [t for t in online if "cpu" in t["name"].lower()] or online
    assert all(t["score"] < t["max_score"] for t in cpu), online
    assert "memory" in " ".join(t.get("output", "") for t in cpu), cpu


# -------------------------------------------------------------- the cap only where it is measured

CUDA_STAND_IN = '''import ctypes, mmap, os
_DRIVER = []  # a GPU driver's host memory: mapped and written on a process's first CUDA work

def _first_use():
    if not _DRIVER and os.environ.get("CUDA_VISIBLE_DEVICES", "0") != "":
        m = mmap.mmap(-1, 300 << 20, flags=mmap.MAP_PRIVATE)
        m.write(b"x" * (300 << 20))
        _DRIVER.append(m)

def _on_gpu(fn):
    def wrapped(*args, **kwargs):
        _first_use()
        return fn(*args, **kwargs)
    return wrapped

for _name in [n for n, v in list(globals().items()) if callable(v) and not n.startswith("_")
              and getattr(v, "__module__", None) == "__main__"]:
    globals()[_name] = _on_gpu(globals()[_name]) if not isinstance(globals()[_name], type) else globals()[_name]
'''


def _solution_cells_with_stand_in() -> list[str]:
    return notebook_cells(REPO / "solutions" / f"{CH}.ipynb") + [CUDA_STAND_IN]


@pytest.mark.needs_bwrap
def test_host_memory_a_gpu_driver_adds_after_the_cap_fails_only_the_old_design(tmp_path):
    cells = _solution_cells_with_stand_in()
    chapter = CHAPTERS[CH]
    grader = Grader(device="cpu")
    # before: every child of the chapter capped (StudentSession(memory_capped=True) for all cases)
    # (a capped child in which the GPU stays visible, as it was then: the first cell undoes the
    # hiding that the memory case's child does now, so this runs the old design's child)
    visible = "import os\nos.environ.pop('CUDA_VISIBLE_DEVICES', None)"
    with lone_session([visible] + cells, memory_capped=True) as session:
        session.start()
        old = grade_chapter(chapter, session.run, grader.devices, grader.seed, False, cells=cells)
    assert sum(t.score for t in old) < sum(t.max_score for t in old)
    assert any("memory" in c.message.lower() for t in old for c in t.cases if not c.passed)
    # now: only the memory case's child is capped, and no GPU is visible there
    nb = tmp_path / f"{CH}.ipynb"
    book = nbformat.read(REPO / "solutions" / f"{CH}.ipynb", as_version=4)
    book.cells.append(nbformat.v4.new_code_cell(CUDA_STAND_IN))
    nbformat.write(book, nb)
    (result,) = grader.grade_path(nb).chapters
    assert result.score == result.max_score == 28, [(t.exercise, t.device, c.case, c.message)
                                                     for t in result.tests for c in t.cases if not c.passed]


# A relay through /tmp: the capped child hands the memory case's inputs to another process of the
# same student, which has no cap and computes the whole score matrix, and returns its answer.
RELAY_CLIENT = '''
import os, time, torch
_REQ, _RES = "/tmp/relay-request.pt", "/tmp/relay-answer.pt"

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    if k.shape[-2] < 4096:
        return plain(q, k, v, mask)
    torch.save((q, k, v, mask), _REQ + ".part")
    os.rename(_REQ + ".part", _REQ)
    for _ in range(160):  # 8 s
        if os.path.exists(_RES):
            return torch.load(_RES)
        time.sleep(0.05)
    raise RuntimeError("no relay")
'''

RELAY_SERVER = '''
import os, threading, time, torch

def _relay():
    for _ in range(600):
        if os.path.exists("/tmp/relay-request.pt"):
            q, k, v, mask = torch.load("/tmp/relay-request.pt")
            torch.save(plain(q, k, v, mask), "/tmp/relay-answer.pt.part")
            os.rename("/tmp/relay-answer.pt.part", "/tmp/relay-answer.pt")
            return
        time.sleep(0.05)

threading.Thread(target=_relay, daemon=True).start()
'''


@pytest.mark.needs_bwrap
def test_no_process_of_the_student_runs_beside_the_capped_child(tmp_path):
    """`grade` runs two chapters at once: the memory case runs before any other chapter of the
    student starts, so another chapter's child (uncapped, same /tmp) cannot compute it for the
    capped one. The relay here waits 8 s in the capped child and serves for 30 s in chapter 1's."""
    plain = IN_PLACE.split("def online_softmax_attention")[0]
    student = tmp_path / "student"
    chapter7_with(tmp_path, [plain + RELAY_CLIENT])
    nb = nbformat.read(REPO / "solutions" / "01_intuition.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(plain + RELAY_SERVER),
                 nbformat.v4.new_code_cell("import time\ntime.sleep(8)")]
    nbformat.write(nb, student / "01_intuition.ipynb")
    result = Grader(device="cpu").grade_path(student, chapters=["01_intuition", CH], jobs=2)
    ch7 = next(c for c in result.chapters if c.chapter == CH)
    cases = online_cases(ch7.tests)
    assert memory_lost(cases), [(c.case, c.message) for c in cases if c.case.startswith("memory")]


# Eight processes, each under a cap of its own, holding the whole score matrix between them
# (a quarter of one batch element's each, all at once), their results sent back over pipes (a
# reviewer's notebook, stop 42: it scored the memory case before new processes were refused).
FORKED = '''
import math, os, pickle, time, torch

def _part(q, k, v, mask, b, h, w):
    Lq = q.size(-2)
    s = q[b, h * Lq // 4:(h + 1) * Lq // 4] @ k[b].transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s.masked_fill_(~mask.reshape(1, -1), float("-inf"))
    mx = s.amax(-1, keepdim=True)
    s.sub_(mx).exp_()
    l = s.sum(-1)
    time.sleep(1.0)  # (all eight hold their scores at once)
    with os.fdopen(w, "wb") as f:
        f.write(pickle.dumps(((s @ v[b]) / l.unsqueeze(-1), mx.squeeze(-1) + torch.log(l))))
    os._exit(0)

def _forked(q, k, v, mask):
    B, Lq = q.shape[0], q.size(-2)
    jobs = []
    for b in range(B):
        for h in range(4):
            r, w = os.pipe()
            if os.fork() == 0:
                os.close(r)
                _part(q, k, v, mask, b, h, w)
            os.close(w)
            jobs.append((b, h, r))
    out, lse = torch.empty((B, Lq, v.size(-1)), dtype=q.dtype), torch.empty((B, Lq), dtype=q.dtype)
    for b, h, r in jobs:
        with os.fdopen(r, "rb") as f:
            out[b, h * Lq // 4:(h + 1) * Lq // 4], lse[b, h * Lq // 4:(h + 1) * Lq // 4] = pickle.loads(f.read())
    return out, lse

_solution = online_softmax_attention

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    return _forked(q, k, v, mask) if k.size(-2) > 100000 else _solution(q, k, v, mask, block_size)
'''


@pytest.mark.needs_bwrap
def test_the_score_matrix_split_among_forked_processes_loses_the_memory_case(tmp_path):
    """Each process has a cap of its own: the memory case's child may start threads (they share
    its capped address space), no process."""
    notebook = nbformat.read(REPO / "solutions" / f"{CH}.ipynb", as_version=4)
    at = next(i for i, c in enumerate(notebook.cells) if "def online_softmax_attention" in c.source)
    notebook.cells.insert(at + 1, nbformat.v4.new_code_cell(FORKED))
    nb = tmp_path / f"{CH}.ipynb"
    nbformat.write(notebook, nb)
    (chapter,) = Grader(device="cpu").grade_path(nb).chapters
    assert memory_lost(online_cases(chapter.tests))
    (memory,) = [c for c in online_cases(chapter.tests) if c.case.startswith("memory")]
    assert "Operation not permitted" in memory.message, memory.message



# Address space and data the capped child held before the cells, given back by the student's
# code during the case: numpy's BLAS (its code and its 32 MiB buffer), which torch never calls.
# Unmapping chunks of libtorch's code that the case never runs, found offline, gave back 90 MiB
# more of address space (stop 45); RLIMIT_DATA, which counts only data, kept the whole matrix
# out then, but 32 MiB of it came back. Each unmapped byte was room for the score matrix.
UNMAP_WHAT_WAS_THERE = '''
import ctypes
_honest = online_softmax_attention

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    if k.shape[-2] < 4096:
        return _honest(q, k, v, mask, block_size)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    maps = [line.split() for line in open("/proc/self/maps").read().splitlines()]
    given_back = 0
    for fields in maps:
        start, end = (int(x, 16) for x in fields[0].split("-"))
        blas = len(fields) > 5 and "openblas" in fields[5]
        blas_buffer = len(fields) == 5 and fields[1] == "rw-p" and end - start == 32 << 20
        if (blas or blas_buffer) and libc.munmap(start, end - start) == 0:
            given_back += end - start
    raise ValueError(f"given back: {given_back} bytes")
'''


def _kernel_seals() -> bool:
    probe = "from autograder.runtime.confine import seal_mappings; print(seal_mappings())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=False)
    return out.stdout.strip() == "True"


@pytest.mark.needs_bwrap
def test_what_the_capped_child_held_before_the_cells_cannot_be_given_back(tmp_path):
    """Before: the student's code unmapped numpy's BLAS library and the buffer after it in the
    memory case's child (55 MiB given back, room the cap had counted as taken). Now every
    mapping the child holds when its caps are set is sealed (mseal, Linux 6.10+)."""
    if not _kernel_seals():
        pytest.skip("this kernel cannot seal mappings (mseal: Linux 6.10+)")
    _, memory = memory_case_of_solution_with(tmp_path, UNMAP_WHAT_WAS_THERE)
    assert "given back: 0 bytes" in memory.message, memory.message



# A reviewer's notebook (stop 45): on the memory case it saves the inputs and the request it is
# answering, exec's numpy code in its own process (a new program keeps the cap's absolute value
# but starts with a near-empty address space), builds the whole score matrix there, then
# exec's a stand-in child that answers the request and serves the rest of the chapter.
EXEC_A_FRESH_IMAGE = r"""
import os, sys, signal, pickle, numpy as _np
_honest = online_softmax_attention

_STAGE1 = r'''
import os, sys, numpy as np
d = np.load("state.npz")
q, k, v, mask = d["q"][0], d["k"][0], d["v"][0], d["mask"]
s = (q @ k.T) * np.float32(1 / np.sqrt(q.shape[-1]))   # the whole L_q x L_k score matrix
s[:, ~mask.reshape(-1)] = -np.inf
m = s.max(-1); s -= m[:, None]; np.exp(s, out=s); l = s.sum(-1)
out = (s @ v) / l[:, None]; lse = m + np.log(l)
hwm = [x for x in open("/proc/self/status") if x.startswith(("VmHWM", "VmPeak", "VmData"))]
np.savez("result.npz", out=out[None].astype(np.float32), lse=lse[None].astype(np.float32),
         note=np.array("score matrix %s %s in a fresh image: %s" % (s.shape, s.dtype, " ".join(x.split(":")[0] + "=" + x.split()[1] + "kB" for x in hwm))))
os.execv(sys.executable, [sys.executable, "-c", open("stage2.py").read()])
'''
_STAGE2 = r'''
import os, sys, pickle
import json
sys.path[:] = json.load(open("path.json"))
st = pickle.load(open("state.pkl", "rb"))
import numpy as np, torch
from autograder.runtime import child
from autograder.shared import protocol as p
from autograder.shared.wire import FrameReader, WireError
r = np.load("result.npz")
print(str(r["note"]))
chapter = child._Chapter(st["res"], st["token"])
chapter.namespace["online_softmax_attention"] = lambda *a, **kw: (torch.from_numpy(r["out"]), torch.from_numpy(r["lse"]))
chapter.run_call(st["message"])
handlers = {p.RunCells: chapter.run_cells, p.RunCall: chapter.run_call}
reader = FrameReader()
while True:
    try:
        message = p.from_plain(reader.read(st["req"]))
    except (EOFError, OSError, WireError, p.ProtocolError):
        break
    h = handlers.get(type(message))
    if h is None:
        break
    h(message)
os._exit(0)
'''

def online_softmax_attention(q, k, v, mask=None, block_size=64):
    if k.shape[-2] < 100000:
        return _honest(q, k, v, mask, block_size)
    f = sys._getframe()
    st = {}
    while f is not None:
        if f.f_code.co_name == "run_call" and "message" in f.f_locals:
            st["message"] = f.f_locals["message"]
            st["token"] = f.f_locals["self"].separator.strip(b"\0").decode()
        if f.f_code.co_name == "serve" and "req_fd" in f.f_locals:
            st["req"], st["res"] = f.f_locals["req_fd"], f.f_locals["res_fd"]
            st["sys_path"] = f.f_locals["config"]["sys_path"]
        f = f.f_back
    import json
    json.dump(st["sys_path"], open("path.json", "w"))
    pickle.dump(st, open("state.pkl", "wb"))
    _np.savez("state.npz", q=q.numpy(), k=k.numpy(), v=v.numpy(), mask=mask.numpy())
    open("stage2.py", "w").write(_STAGE2)
    for fd in (st["req"], st["res"], 1, 2):
        os.set_inheritable(fd, True)
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-c", _STAGE1])
"""


@pytest.mark.needs_bwrap
def test_a_new_program_in_the_capped_child_loses_the_memory_case(tmp_path):
    """Before: 10/10 on the exercise, the memory case passed with the whole matrix built after
    an execve. Now the memory case's filter refuses execve and execveat."""
    cases, memory = memory_case_of_solution_with(tmp_path, EXEC_A_FRESH_IMAGE)
    assert memory_lost(cases), memory.message
    assert "PermissionError" in memory.message, memory.message
