"""What model-written code can read: atgrpo_jax.envs.sandbox with its file-system layers.

Each case runs with the private root (a mount namespace; where the kernel allows it) and with
the audit hook alone (`Limits.filesystem_isolation=False`), so both layers are exercised here.
"""
import json
import os
import sys
from pathlib import Path

import pytest

from atgrpo_jax.envs import sandbox
from atgrpo_jax.envs.sandbox import Limits, run_python

REPO = Path(__file__).resolve().parents[2]
LIMITS = Limits(wall_s=10.0, cpu_s=10.0, memory_mb=1024, max_output_bytes=1 << 16)
LAYERS = [pytest.param(True, id="private-root"), pytest.param(False, id="audit-hook")]
SECRET = "hunter2-do-not-leak"

READ_ATTEMPTS = """
import json, os, sys
paths = json.loads(sys.stdin.read())

def attempt(name, read):
    try:
        out = read()
    except Exception as exc:
        print(name, "refused", type(exc).__name__)
    else:
        print(name, "READ", repr(out)[:300])

for name, path in paths.items():
    attempt(name, lambda: open(path, "rb").read())
attempt("secret-via-os.open", lambda: os.read(os.open(paths["secret"], os.O_RDONLY), 100))
attempt("secret-via-proc-root", lambda: open("/proc/self/root" + paths["secret"]).read())
attempt("secret-via-sqlite", lambda: __import__("sqlite3").connect(paths["secret"]).execute("select 1").fetchall())
attempt("secret-dir-listing", lambda: os.listdir(os.path.dirname(paths["secret"])))
attempt("import-spwd", lambda: __import__("spwd").getspall())
attempt("import-pwd", lambda: __import__("pwd").getpwall())
attempt("mknod", lambda: os.mknod("disk"))
"""


def _expect_layer(result, private_root):
    assert result.isolation in ("mount-namespace", "audit-hook"), result
    if not private_root:
        assert result.isolation == "audit-hook"
    elif result.isolation != "mount-namespace":
        pytest.skip("the kernel refuses a mount namespace here (RunResult.isolation == 'audit-hook')")


@pytest.mark.parametrize("private_root", LAYERS)
def test_reads_outside_the_sandbox_are_refused(private_root, tmp_path):
    secret = tmp_path / "credentials.json"
    secret.write_text(SECRET)
    paths = {"shadow": "/etc/shadow", "passwd": "/etc/passwd", "secret": str(secret),
             "repo-readme": str(REPO / "README.md"), "repo-sandbox": str(Path(sandbox.__file__).resolve()),
             "init-environ": "/proc/1/environ"}
    limits = Limits(**{**LIMITS.__dict__, "filesystem_isolation": private_root})
    result = run_python(READ_ATTEMPTS, json.dumps(paths), limits)
    _expect_layer(result, private_root)
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert len(lines) == len(paths) + 7, result.stdout
    refusals = {"PermissionError", "FileNotFoundError", "ImportError", "ModuleNotFoundError", "AttributeError"}
    for line in lines:
        name, verdict, kind = line.split(" ", 2)
        assert verdict == "refused" and kind in refusals, line
    assert SECRET not in result.stdout + result.stderr_tail


@pytest.mark.parametrize("private_root", LAYERS)
def test_python_its_packages_stdin_and_working_directory_work(private_root):
    code = """
import sys, os, json
import numpy as np, sympy
import ssl, sqlite3, lzma, bz2, zlib, ctypes, decimal, hashlib, uuid, csv, curses, fractions
a = np.linalg.solve(np.array([[2.0, 1.0], [1.0, 3.0]]), np.array([3.0, 5.0]))
x = sympy.Symbol("x")
open("notes.txt", "w").write(sys.stdin.read())
os.makedirs("sub")
with open("sub/data.json", "w") as f:
    json.dump({"roots": sorted(map(int, sympy.solve(x**2 - 5 * x + 6, x)))}, f)
db = sqlite3.connect("local.db"); db.execute("create table t (v)"); db.commit()
print(np.round(a, 6).tolist(), json.load(open("sub/data.json"))["roots"], open("notes.txt").read())
print(sorted(os.listdir(".")), lzma.decompress(lzma.compress(b"ok")).decode(), hashlib.sha256(b"").hexdigest()[:8])
"""
    limits = Limits(**{**LIMITS.__dict__, "filesystem_isolation": private_root})
    result = run_python(code, "from stdin", limits)
    _expect_layer(result, private_root)
    assert result.ok, result
    assert result.stdout.splitlines() == [
        "[0.8, 1.4] [2, 3] from stdin", "['.stdin', 'local.db', 'main.py', 'notes.txt', 'sub'] ok e3b0c442"]


def test_private_root_holds_only_python_and_the_working_directory(tmp_path):
    """os.stat raises no audit event: what it finds is what the kernel shows the program."""
    secret = tmp_path / "credentials.json"
    secret.write_text(SECRET)
    venv = sys.prefix + "/"  # a venv inside the checkout (.venv) is bound, and with it the folders above it
    gone = [p for p in ["/etc/passwd", "/etc/shadow", "/etc/hosts", "/home", "/work", os.path.expanduser("~/.config"),
                        str(secret), str(REPO / "README.md"), "/usr/bin", "/var", "/sys"]
            if os.path.exists(p) and not venv.startswith(p.rstrip("/") + "/")]
    kept = [os.path.dirname(os.__file__), os.path.dirname(__import__("numpy").__file__), "/dev/null",
            "/dev/urandom", "/proc/self/status"]
    code = ("import json, os, sys\npaths = json.loads(sys.stdin.read())\n"
            "print(json.dumps({p: os.path.exists(p) for p in paths}))\n"
            "print(bool(os.statvfs('/').f_flag & os.ST_RDONLY), os.path.exists(os.getcwd() + '/main.py'))\n")
    mounts_before = Path("/proc/self/mountinfo").read_text()
    result = run_python(code, json.dumps(gone + kept), LIMITS)
    _expect_layer(result, True)
    assert result.ok, result
    seen, flags = result.stdout.splitlines()
    assert len(gone) >= 6 and json.loads(seen) == {**{p: False for p in gone}, **{p: True for p in kept}}
    assert flags == "True True"  # the root is read-only; the working directory is there
    assert Path("/proc/self/mountinfo").read_text() == mounts_before  # nothing propagated to the machine


def test_filesystem_plan_lists_python_not_the_machine():
    plan = sandbox.filesystem_plan()
    assert set(plan) == {"dirs", "files", "links", "devices"}
    assert any(os.path.dirname(os.__file__).startswith(d) for d in plan["dirs"])
    assert any(os.path.basename(f).startswith("libc.so") for f in plan["files"])
    assert plan["devices"] == ["/dev/null", "/dev/zero", "/dev/urandom"]
    listed = plan["dirs"] + plan["files"] + [link for link, _ in plan["links"]]
    assert all(p == os.path.realpath(p) for p in plan["dirs"] + plan["files"])
    in_repo = [p for p in listed if p.startswith(str(REPO) + "/") or str(REPO).startswith(p + "/")]
    assert not [p for p in in_repo if not p.startswith(sys.prefix + "/")]  # only a venv inside the checkout
    assert [p for p in listed if p.startswith("/etc/")] == ["/etc/ld.so.cache"]
    assert not [p for p in listed if p.startswith(("/home/", os.path.expanduser("~/.config")))]


def test_a_private_root_that_fails_half_way_falls_back_to_the_hook(monkeypatch):
    """A listed file vanished since the plan was made (say, a library upgraded mid-run): the
    bind mount fails after the new root's tmpfs covers the working directory; the run goes on
    in the real working directory, with the hook's read check, and says so."""
    plan = sandbox.filesystem_plan()
    monkeypatch.setattr(sandbox, "filesystem_plan", lambda: {**plan, "files": [*plan["files"], "/nonexistent/lib.so"]})
    code = ("import os\nopen('out.txt', 'w').write('kept')\n"
            "print(sorted(os.listdir('.')), open(os.getcwd() + '/out.txt').read(), os.path.exists('/etc/passwd'))\n"
            "try:\n    open('/etc/passwd').read()\nexcept PermissionError:\n    print('refused')\n")
    with pytest.warns(RuntimeWarning, match="no private root"):
        result = run_python(code, "", LIMITS)
    assert result.ok and result.isolation == "audit-hook", result
    assert result.stdout.splitlines() == ["['.stdin', 'main.py', 'out.txt'] kept True", "refused"]


MANY_FILES = """
import os
written = 0
try:
    for i in range(20):  # 20 x 15 MB: each file under max_file_mb, 300 MB together
        with open(f"f{i}", "wb") as f:
            for _ in range(15):
                f.write(b"x" * (1 << 20))
                written += 1 << 20
except OSError as e:
    print("stopped", os.strerror(e.errno))
print("written", written >> 20)
"""


def test_many_files_together_stay_under_the_disk_quota(tmp_path):
    limits = Limits(**{**LIMITS.__dict__, "max_disk_mb": 40})
    result = run_python(MANY_FILES, "", limits)
    _expect_layer(result, True)
    assert result.ok, result
    stopped, written = result.stdout.splitlines()
    assert stopped == "stopped No space left on device"
    assert 30 <= int(written.split()[1]) <= 40  # the quota, not a single file's cap (15 MB each is allowed)
