"""The ledger of a grading process's temporary folders (`sandbox.scratch`): what a killed batch
worker listed is removed when the batch ends, and nothing else is, whatever a ledger says."""
import os
import tempfile

from autograder.sandbox import scratch


def test_listed_folders_are_removed_and_nothing_else(tmp_path, monkeypatch):
    top = tmp_path / "tmp"
    top.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(top))
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(scratch, "_LEDGER", str(spool / "ledger-123"))
    made = scratch.mkdtemp("autograder-session-")
    (top / "autograder-session-x" / "deep").mkdir(parents=True)  # made, not listed
    (tmp_path / "autograder-elsewhere").mkdir()  # listed (a ledger is text), outside the folder
    (top / "mine").mkdir()  # listed, not the grader's name
    os.symlink(tmp_path / "autograder-elsewhere", top / "autograder-link")
    with open(spool / "ledger-123", "a") as f:
        f.write(f"{tmp_path / 'autograder-elsewhere'}\n{top / 'mine'}\n{top / 'autograder-link'}\n")
    (spool / "s0.json").write_text("{}")
    scratch.remove_listed(str(spool))
    assert not os.path.exists(made)
    assert sorted(os.listdir(top)) == ["autograder-link", "autograder-session-x", "mine"]
    assert (tmp_path / "autograder-elsewhere").is_dir()


def test_without_a_ledger_nothing_is_listed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_LEDGER", None)
    path = scratch.mkdtemp("autograder-runtime-")
    assert os.path.isdir(path) and os.listdir(tmp_path) == [os.path.basename(path)]


def _spool(top, owner: str | None, listed: list[str], nested: bool = False):
    """A batch command's spool in `top` owned as `owner` says, its ledger (or, `nested`, a
    run's ledger in a folder of it) listing `listed` (folders of `top` made here)."""
    spool = tempfile.mkdtemp(prefix=scratch.SPOOL_PREFIX, dir=top)
    if owner is not None:
        with open(os.path.join(spool, scratch.OWNER), "w") as f:
            f.write(owner)
    ledger_dir = tempfile.mkdtemp(prefix="run-", dir=spool) if nested else spool
    for name in listed:
        os.makedirs(os.path.join(top, name, "inside"))
    with open(os.path.join(ledger_dir, "ledger-7"), "w") as f:
        f.write("".join(os.path.join(top, name) + "\n" for name in listed))
    return spool


def _gone_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_spools_of_killed_batch_commands_are_swept_and_no_other(tmp_path, monkeypatch):
    """A batch command killed by SIGKILL (a cluster job out of time) left its spool and what it
    and its workers listed; the next batch's `claim_spool` removes them. Left: a live command's
    spool, one of another PID namespace (a container sharing /tmp), one with no owner (an older
    grader's, or one being made), another user's, and anything its ledgers name outside the rules."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_LEDGER", None)
    monkeypatch.setattr(scratch, "_CLAIMED", None)
    released = []
    monkeypatch.setattr(scratch.atexit, "register", lambda fn, *a: released.append((fn, a)))
    me = scratch._identity(os.getpid())
    pid, start, namespace = me.split()
    gone = _gone_pid()
    dead = f"{gone} 1 {namespace}"
    killed = _spool(tmp_path, dead, ["autograder-zygote-a", "pymp-a"])  # (its forkserver's socket folder)
    killed_run = _spool(tmp_path, dead, ["autograder-sandbox-b", "autograder-session-c"], nested=True)
    restarted = _spool(tmp_path, f"{pid} {int(start) + 1} {namespace}", ["autograder-runtime-d"])  # (pid reused)
    alive = _spool(tmp_path, me, ["autograder-zygote-e"])
    other_namespace = _spool(tmp_path, f"{gone} 1 {int(namespace) + 1}", ["autograder-zygote-f"])
    no_owner = _spool(tmp_path, None, ["autograder-zygote-g"])
    os.symlink(tmp_path / "nowhere", tmp_path / (scratch.SPOOL_PREFIX + "link"))
    claimed = scratch.claim_spool()
    left = sorted(os.listdir(tmp_path))
    for swept in (killed, killed_run, restarted, "autograder-zygote-a", "pymp-a", "autograder-sandbox-b",
                  "autograder-session-c", "autograder-runtime-d"):
        assert os.path.basename(swept) not in left
    for kept in (alive, other_namespace, no_owner, claimed, "autograder-zygote-e", "autograder-zygote-f",
                 "autograder-zygote-g", scratch.SPOOL_PREFIX + "link"):
        assert os.path.basename(kept) in left
    # this command's own spool: it names this process, lists its folders, and goes at its exit
    assert open(os.path.join(claimed, scratch.OWNER)).read() == me
    mine = scratch.mkdtemp("autograder-zygote-")
    run = tempfile.mkdtemp(prefix="run-", dir=claimed)
    with open(os.path.join(run, "ledger-9"), "w") as f:
        f.write(os.path.join(tmp_path, "autograder-sandbox-h") + "\n")
    os.mkdir(tmp_path / "autograder-sandbox-h")
    ((fn, args),) = released
    fn(*args)
    assert not os.path.exists(mine) and not os.path.exists(claimed)
    assert not (tmp_path / "autograder-sandbox-h").exists()


def test_another_users_spool_is_not_swept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    namespace = scratch._identity(os.getpid()).split()[2]
    spool = _spool(tmp_path, f"{_gone_pid()} 1 {namespace}", ["autograder-zygote-a"])
    real_lstat = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p: os.stat_result(
        (*real_lstat(p)[:4], os.getuid() + 1, *real_lstat(p)[5:])) if str(p) == spool else real_lstat(p))
    scratch.sweep_abandoned()
    assert os.path.isdir(spool) and (tmp_path / "autograder-zygote-a").is_dir()
