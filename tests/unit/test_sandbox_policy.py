"""The sandbox policy as data (`autograder.sandbox.policy.SandboxPolicy`), checked without
starting bubblewrap: what the sandbox shows of the host, its environment, the limits the child
sets, and the mounts the zygote makes, each from the one policy object."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from autograder.references.solutions import PACKAGE_DIR, REPO_DIR, solutions_dir
from autograder.references.store import cache_dir
from autograder.runtime import zygote
from autograder.sandbox import visibility
from autograder.sandbox.bwrap import bwrap_command, mount_options
from autograder.sandbox.limits import MiB, NOBODY, Limits
from autograder.sandbox.policy import RUNTIME_DEST, hidden_paths, sandbox_policy
from autograder.shared.mounts import Mount

SMALL = Limits(memory=1024 * MiB, cpu_seconds=50, file_size=3 * MiB, nofile=64, nproc=100,
               tmp_size=32 * MiB)


def bubblewrap(hide=(), limits: Limits = SMALL, **kw):
    return sandbox_policy("bubblewrap", limits, hidden_paths(hide), **kw)


def test_nothing_of_the_checkout_is_mounted():
    """The repository, the package, the solutions and the reference cache: nothing of them is
    in the sandbox, as root or not; the runtime comes from the staged copy, not the package."""
    secrets = [REPO_DIR, PACKAGE_DIR, PACKAGE_DIR / "sandbox" / "policy.py", solutions_dir(),
               solutions_dir() / "01_attention.ipynb"] + ([cache_dir()] if cache_dir() else [])
    for root in (True, False):
        with mock.patch("os.geteuid", return_value=0 if root else 1000):
            policy = bubblewrap()
        assert policy.exposes(os.path.dirname(os.__file__))  # the model does see things
        assert policy.exposes(os.path.dirname(json.__file__) + "/decoder.py")
        assert [str(s) for s in secrets if policy.exposes(str(s))] == []
        assert not any(visibility.under(m.source, str(PACKAGE_DIR)) for m in policy.mounts)
        runtime = [m for m in policy.mounts if m.dest == RUNTIME_DEST]
        assert [m.source for m in runtime] == [str(visibility.stage_runtime())]


def test_secrets_inside_a_mounted_folder_are_covered(tmp_path, monkeypatch):
    """A grader installed in site-packages (which is mounted), the reference cache and a
    results file placed there: each is covered, the rest of site-packages stays visible."""
    site = tmp_path / "site-packages"
    for folder in ("autograder/grading", "autograder/cases", "torchlike", "refs"):
        (site / folder).mkdir(parents=True)
    (site / "autograder" / "cases" / "ch01.py").write_text("CASES = []")
    (site / "results.json").write_text("{}")
    real = visibility.interpreter_dirs()
    monkeypatch.setattr(visibility, "interpreter_dirs", lambda: real + [str(site)])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("AUTOGRADER_CACHE_DIR", str(site / "refs"))
    policy = bubblewrap(hide=[site / "results.json"])
    assert policy.exposes(str(site / "torchlike"))
    for secret in ("autograder", "autograder/cases/ch01.py", "refs", "results.json"):
        assert not policy.exposes(str(site / secret)), secret
    assert policy.host_path(str(site / "results.json")) == "/dev/null"
    assert policy.host_path(str(site / "autograder")) is None  # an empty tmpfs


def test_a_hidden_folder_under_the_system_is_covered_and_its_neighbours_are_not():
    policy = bubblewrap(hide=["/usr/share/doc"])
    assert not policy.exposes("/usr/share/doc") and not policy.exposes("/usr/share/doc/x")
    assert policy.exposes("/usr/bin")
    if os.path.islink("/bin"):  # (merged /usr) a link in the sandbox too
        assert policy.host_path("/bin/sh") == "/usr/bin/sh"
    argv = bwrap_command(policy, ["python"])
    assert argv[argv.index("/usr/share/doc") - 1] == "--tmpfs"


def test_the_environment_holds_no_secret_and_no_host_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOGRADER_SEED", "20261126")
    monkeypatch.setenv("AUTOGRADER_SOLUTIONS", str(tmp_path))
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    for mode, home in (("bubblewrap", "/tmp"), ("container", str(tmp_path)), ("fallback", str(tmp_path))):
        env = sandbox_policy(mode, SMALL, hidden_paths(), home=home).environment("tok")
        assert [k for k in env if k.startswith("AUTOGRADER_")] == ["AUTOGRADER_CHILD"]
        assert env["AUTOGRADER_CHILD"] == "tok" and "20261126" not in json.dumps(env)
        assert env["HOME"] == env["TMPDIR"] == home
        assert env["CUDA_VISIBLE_DEVICES"] == "0"  # the GPU's variables are passed on


def test_the_child_sets_the_limits_the_policy_holds():
    """The child config, applied by the runtime's own `set_limits` in a fresh process, gives
    exactly the Limits as hard and soft rlimits."""
    config = sandbox_policy("fallback", SMALL, [], home="/tmp").child_config("tok")
    code = ("import json, resource, sys; from autograder.runtime.prepare import set_limits; "
            "set_limits(json.loads(sys.argv[1])); print(json.dumps({n: resource.getrlimit("
            "getattr(resource, 'RLIMIT_' + n)) for n in ('DATA', 'AS', 'CPU', 'FSIZE', 'CORE', 'NOFILE')}))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_DIR)})
    assert r.returncode == 0, r.stderr
    got = {name: tuple(pair) for name, pair in json.loads(r.stdout).items()}
    gpu = bool(sandbox_policy("fallback", SMALL, []).devices)
    want = {"DATA": SMALL.memory, "CPU": SMALL.cpu_seconds, "FSIZE": SMALL.file_size, "CORE": 0,
            "NOFILE": SMALL.nofile, **({} if gpu else {"AS": 2 * SMALL.memory})}
    assert {name: got[name] for name in want} == {name: (v, v) for name, v in want.items()}
    assert config["nproc"] == SMALL.nproc


def test_the_zygote_mounts_what_the_policy_says(monkeypatch):
    """A student's box forked by the zygote gets the policy's /tmp (same size and mode), its own
    /dev/shm, pseudo-terminals and /proc: the zygote's mount(2) calls, recorded."""
    policy = bubblewrap(uid=62001)
    config = json.loads(json.dumps(policy.box_config("t")))  # as it travels: plain JSON
    assert config["uid"] == 62001 and config["rlimits"] == policy.child_config("t")["rlimits"]
    calls = []
    monkeypatch.setattr(zygote, "_mount", lambda source, target, fstype, flags, data=None:
                        calls.append((source, target, fstype, flags, data)))
    monkeypatch.setattr(zygote.os.path, "isdir", lambda path: True)
    for plain in config["mounts"]:
        zygote.apply_mount(Mount.from_plain(plain))
    tmpfs = [(target, data) for _, target, fstype, _, data in calls if fstype == "tmpfs"]
    assert tmpfs == [("/tmp", f"mode=1777,size={SMALL.tmp_size}"), ("/dev/shm", f"mode=1777,size={SMALL.tmp_size}")]
    assert [c[1] for c in calls if c[2] in ("devpts", "proc")] == ["/dev/pts", "/proc"]
    with pytest.raises(zygote.SetupError):  # binds are bubblewrap's, never the zygote's
        zygote.apply_mount(Mount("ro-bind", "/etc", source="/etc"))


def test_without_setpriv_the_child_drops_itself_but_not_in_a_zygotes_box():
    """No setpriv: a bubblewrap child as root becomes the student's uid itself; a box forked by
    the zygote is that uid already (the zygote dropped), and could not drop again."""
    with mock.patch("os.geteuid", return_value=0), mock.patch("shutil.which", return_value=None):
        policy = bubblewrap(uid=62001)
    assert policy.drops_itself and policy.child_config("t")["drop"] == [62001, 62001]
    assert bwrap_command(policy, ["python"])[-2:] == ["--", "python"]
    assert policy.box_config("t")["drop"] is None and policy.box_config("t")["uid"] == 62001


def test_the_bwrap_tmp_is_the_policys():
    policy = bubblewrap()
    argv = bwrap_command(policy, ["python"])
    i = argv.index("--tmpfs")
    assert argv[i - 4:i + 2] == ["--perms", "1777", "--size", str(SMALL.tmp_size), "--tmpfs", "/tmp"]
    assert mount_options(policy.mounts[0], variant=1) == ["--tmpfs", "/tmp", "--chmod", "1777", "/tmp"]


def test_privileges_follow_the_policy():
    with mock.patch("os.geteuid", return_value=0):
        root = bubblewrap(uid=62001)
        zygote_policy = bubblewrap(keep_root=True)
    with mock.patch("os.geteuid", return_value=1000):
        user = bubblewrap()
    if root.setpriv:
        assert "--reuid=62001" in bwrap_command(root, ["python"])
        assert root.child_config("t")["drop"] is None
    else:
        assert root.child_config("t")["drop"] == [62001, 62001]
    assert bwrap_command(zygote_policy, ["python"])[-3:] == ["ALL", "--", "python"]
    assert zygote_policy.child_config("t")["drop"] is None and not zygote_policy.setpriv
    argv = bwrap_command(user, ["python"])
    assert "--unshare-user" in argv and "--disable-userns" in argv and argv[-2:] == ["--", "python"]
    assert user.child_config("t")["drop"] is None
    with mock.patch("os.geteuid", return_value=0):
        fallback = sandbox_policy("fallback", SMALL, [], home="/tmp")
        assert fallback.with_uid(62002).child_config("t")["drop"] == [62002, 62002]
        assert fallback.mounts == () and fallback.runtime == str(visibility.stage_runtime())
    with pytest.raises(ValueError):
        bwrap_command(fallback, ["python"])


def test_the_policy_is_frozen_and_rendered_deterministically():
    a, b = bubblewrap(), bubblewrap()
    assert a == b and hash(a) == hash(b)
    assert bwrap_command(a, ["python"]) == bwrap_command(b, ["python"])
    assert json.dumps(a.child_config("t")) == json.dumps(b.child_config("t"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.uid = 0  # type: ignore[misc]
    depths = [m.dest.count("/") for m in a.mounts[:a.mounts.index(Mount("proc", "/proc"))]]
    assert depths == sorted(depths)  # shallowest first: a deeper mount is never covered
    assert a.uid == NOBODY and a.with_uid(7).uid == 7 and a.uid == NOBODY


@pytest.mark.parametrize("plain", [
    {"kind": "tmpfs", "dest": "/tmp", "size": "1G"},
    {"kind": "tmpfs", "dest": "/tmp", "mode": "0777"},
    {"kind": "bind", "dest": "/tmp"},
    {"kind": "tmpfs", "dest": "tmp"},
    ["tmpfs", "/tmp"],
])
def test_a_malformed_mount_is_refused(plain):
    with pytest.raises(ValueError):
        Mount.from_plain(plain)


def test_a_mount_survives_its_plain_form():
    m = Mount("tmpfs", "/dev/shm", perms="1777", size=5, optional=True)
    assert Mount.from_plain(json.loads(json.dumps(m.to_plain()))) == m
