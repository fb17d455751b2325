"""autograder/references/store.py: reference outcomes kept on disk between grading runs give
the same grades as outcomes computed afresh, and anything wrong with the file only costs time."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from autograder.references import store as reference_store
from autograder.shared.contract import CHAPTERS
from autograder.grading.grader import Grader
from autograder.references.cache import ReferenceCache
from autograder.references.store import ReferenceStore, persisted
from autograder.sandbox.policy import hidden_paths

from grading_helpers import REPO, namespace_of

CHAPTER = "02_scaled_dot_product_attention"
UNSCALED = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ v, w
'''


def _grades(references, ns) -> list:
    """Every case's verdict of chapter 2 for namespace `ns`, graded with `references`."""
    tests = Grader(device="cpu", seed=7, references=references).grade_namespace(CHAPTERS[CHAPTER], ns)
    return [(t.exercise, t.device, t.score, c.case, c.passed, c.aspect, c.message, c.hint)
            for t in tests for c in t.cases]


def test_stored_outcomes_grade_exactly_like_computed_ones(tmp_path):
    fresh = ReferenceCache()
    computed = _grades(fresh, namespace_of(CHAPTER, UNSCALED))
    # (grading computes only what it runs: not the device check of a path failing on the CPU)
    fresh.warm([CHAPTER], ["cpu", "fake-cuda"], 7, False)
    store = ReferenceStore(7, False, tmp_path)
    assert store.save(fresh.export(7, False))

    loaded = ReferenceCache()
    data = ReferenceStore(7, False, tmp_path).load()
    assert loaded.merge(data) == fresh.count() > 0
    assert loaded.complete([CHAPTER], ["cpu", "fake-cuda"], 7, False)
    assert _grades(loaded, namespace_of(CHAPTER, UNSCALED)) == computed
    assert loaded.count() == fresh.count(), "nothing was computed again"
    assert any(not passed for *_, passed, _a, _m, _h in computed), "the submission is wrong"
    assert _grades(loaded, namespace_of(CHAPTER)) == _grades(fresh, namespace_of(CHAPTER))


def test_only_this_seed_and_never_cuda_outcomes_are_exported():
    refs = ReferenceCache()
    refs.warm([CHAPTER], ["cpu"], 7, True)
    refs.warm([CHAPTER], ["cpu"], 8, True)
    plain = refs.export(7, True)
    assert plain["outcomes"] and all(k[2] == 7 and k[3] is True for k, _ in plain["outcomes"])
    assert all(k[-2] != "cuda" for k, _ in plain["outcomes"])


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong layout", "empty"])
def test_a_damaged_file_is_ignored(tmp_path, damage):
    store = ReferenceStore(7, True, tmp_path)
    refs = ReferenceCache()
    refs.warm([CHAPTER], ["cpu"], 7, True)
    assert store.save(refs.export(7, True))
    raw = store.path.read_bytes()
    store.path.write_bytes({"garbage": b"not a frame at all", "truncated": raw[: len(raw) // 2],
                            "empty": b"",
                            "wrong layout": __import__("autograder.shared.wire").shared.wire.encode({"cases": 3})}[damage])
    assert ReferenceStore(7, True, tmp_path).load() is None
    # and grading with it still works (the outcomes are computed again)
    with persisted(ReferenceCache(), 7, True):
        pass


def test_the_file_changes_with_the_solutions(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", str(tmp_path / "cache"))
    before = ReferenceStore(7, False).path
    solutions = tmp_path / "solutions"
    shutil.copytree(REPO / "solutions", solutions)
    nb = solutions / f"{CHAPTER}.ipynb"
    data = json.loads(nb.read_text())
    data["cells"].append({"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [],
                          "execution_count": None})
    nb.write_text(json.dumps(data))
    monkeypatch.setenv("AUTOGRADER_SOLUTIONS", str(solutions))
    assert ReferenceStore(7, False).path != before
    assert ReferenceStore(8, False).path != ReferenceStore(7, False).path
    assert ReferenceStore(7, True).path != ReferenceStore(7, False).path


def test_saving_a_new_version_removes_the_old_one(tmp_path):
    old = tmp_path / "references-s7-full-000000000000000000000000.agw"
    old.write_bytes(b"stale")
    other_seed = tmp_path / "references-s8-full-000000000000000000000000.agw"
    other_seed.write_bytes(b"kept")
    refs = ReferenceCache()
    refs.warm([CHAPTER], ["cpu"], 7, False)
    assert ReferenceStore(7, False, tmp_path).save(refs.export(7, False))
    assert not old.exists() and other_seed.exists()


def test_off_and_unwritable(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", "off")
    assert reference_store.cache_dir() is None
    assert ReferenceStore(7, False).load() is None and not ReferenceStore(7, False).save({})
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder should be")
    assert not ReferenceStore(7, False, blocked / "cache").save({"cases": [], "outcomes": []})


def test_the_cache_folder_is_hidden_from_students(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", str(tmp_path / "refs"))
    assert str(tmp_path / "refs") in hidden_paths()


def test_the_command_line_stores_and_reuses_outcomes(tmp_path):
    """Two `grade` runs of one notebook: the first writes the file, the second reads it and
    prints the same report."""
    env = {**os.environ, "AUTOGRADER_CACHE_DIR": str(tmp_path)}
    nb = REPO / "solutions" / "05_masks.ipynb"
    cmd = [sys.executable, "-m", "autograder", "grade", str(nb), "--device", "cpu"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    files = list(tmp_path.glob("references-*.agw"))
    assert first.returncode == 0 and len(files) == 1, first.stderr
    stamp = files[0].stat().st_mtime_ns
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0
    strip = lambda out: [l for l in out.splitlines() if "graded in" not in l]  # noqa: E731
    assert strip(second.stdout) == strip(first.stdout)
    assert "13 / 13" in first.stdout
    assert files[0].stat().st_mtime_ns == stamp, "nothing new to store"


def _with_cuda_outcomes(refs: ReferenceCache) -> int:
    """Stand-ins for CUDA outcomes (no GPU here): the CPU's, under CUDA's keys."""
    cuda = {(*k[:-2], "cuda", k[-1]): o for k, o in refs._outcomes.items() if k[-2] == "cpu"}
    refs._outcomes.update(cuda)
    return len(cuda)


def test_cuda_outcomes_are_kept_per_gpu_and_out_of_the_cpu_file(tmp_path, monkeypatch):
    """On a GPU, `grade --device cuda` computed every CUDA reference outcome again on each run
    (H100, stop 37: the warm run 1.84x the CPU's): they are now kept too, in a file of that
    GPU's (another GPU, or another torch, reads none of them and removes none)."""
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(reference_store, "cuda_tag", lambda: "gpuA")
    refs = ReferenceCache()
    with persisted(refs, 7, True, cuda=True):
        refs.warm([CHAPTER], ["cpu"], 7, True)
        n = _with_cuda_outcomes(refs)
    assert n > 0
    cpu_file, = tmp_path.glob("references-s7-*.agw")
    gpu_file, = tmp_path.glob("references-cuda-gpuA-s7-*.agw")
    from autograder.shared import wire
    assert all(k[-2] != "cuda" for k, _ in wire.load(cpu_file)["outcomes"])
    assert [k[-2] for k, _ in wire.load(gpu_file)["outcomes"]] == ["cuda"] * n

    stamp = gpu_file.stat().st_mtime_ns
    again = ReferenceCache()
    with persisted(again, 7, True, cuda=True):
        assert again.held(cuda=True) == n and again.held(cuda=False) == refs.held(cuda=False)
    assert gpu_file.stat().st_mtime_ns == stamp, "nothing new to store"

    monkeypatch.setattr(reference_store, "cuda_tag", lambda: "gpuB")
    other = ReferenceCache()
    with persisted(other, 7, True, cuda=True):
        assert other.held(cuda=True) == 0 and other.held(cuda=False) > 0
        _with_cuda_outcomes(other)
    assert gpu_file.exists() and len(list(tmp_path.glob("references-cuda-gpuB-s7-*.agw"))) == 1

    # A GPU's file of an older torch (another digest, under the old torch's tag) is removed
    # when this digest's CUDA outcomes are written; other seeds' files are not touched.
    stale = tmp_path / "references-cuda-gpuOld-s7-quick-0123456789ab.agw"
    other_seed = tmp_path / "references-cuda-gpuOld-s8-quick-0123456789ab.agw"
    for f in (stale, other_seed):
        f.write_bytes(gpu_file.read_bytes())
    monkeypatch.setattr(reference_store, "cuda_tag", lambda: "gpuC")
    newer = ReferenceCache()
    with persisted(newer, 7, True, cuda=True):
        _with_cuda_outcomes(newer)
    assert not stale.exists() and other_seed.exists() and gpu_file.exists()

    asked = []
    monkeypatch.setattr(reference_store, "cuda_tag", lambda: asked.append(1) or "gpuA")
    cpu_only = ReferenceCache()
    with persisted(cpu_only, 7, True):
        assert cpu_only.held(cuda=True) == 0
    assert not asked, "a grader without CUDA rows does not start CUDA to name the GPU"


def test_a_save_stopped_half_way_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Ctrl-C (or a SIGTERM, which the command turns into one) while the cache is written: the
    stop goes on, and no `.tmp-*` file (about 10 MB for the full cache) is left in the folder."""
    from autograder.shared import wire

    def stopped(plain):
        raise KeyboardInterrupt
    monkeypatch.setattr(wire, "encode", stopped)
    with pytest.raises(KeyboardInterrupt):
        ReferenceStore(1, True, folder=tmp_path).save({"cases": [], "outcomes": []})
    assert list(tmp_path.iterdir()) == []
