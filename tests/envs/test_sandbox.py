"""Containment tests for atgrpo_jax.envs.sandbox.

Every hostile program must end within its limit + 1 s, leave no process and no
working directory behind, and leave the test process (its parent) unharmed.
Most cases run both with namespaces (when the kernel allows them) and with the
audit-hook-only fallback.
"""
import os
import time

import pytest

from atgrpo_jax.envs.sandbox import Limits, RunResult, run_many, run_python

FAST = Limits(wall_s=1.5, cpu_s=1.0, memory_mb=256, max_output_bytes=1 << 16)
MODES = [pytest.param(True, id="namespaces"), pytest.param(False, id="hook-only")]
PRINT_CWD = "import os, sys\nprint(os.getcwd(), flush=True)\n"


def _limits(namespaces, **kw):
    return Limits(**{**FAST.__dict__, "namespaces": namespaces, **kw})


def _survivors(workdir):
    """Processes whose command line names this run's working directory."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if workdir.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _run_contained(code, limits, stdin=""):
    started = time.monotonic()
    result = run_python(PRINT_CWD + code, stdin, limits)
    elapsed = time.monotonic() - started
    assert isinstance(result, RunResult) and not result.sandbox_error, result
    assert elapsed < limits.wall_s + 1.0, (elapsed, result)
    workdir = result.stdout.splitlines()[0]
    assert workdir.startswith("/") and "atgrpo-sandbox-" in workdir
    assert not os.path.exists(workdir), "working directory left behind"
    assert _survivors(workdir) == [], "a sandboxed process outlived the run"
    return result, elapsed


def test_program_reads_stdin_and_writes_stdout():
    result = run_python("import sys\nprint(sum(map(int, sys.stdin.read().split())))", "1 2 3\n40\n", FAST)
    assert result.ok and result.stdout == "46\n" and result.exit_code == 0
    assert not (result.timed_out or result.memory_exceeded or result.output_truncated)


def test_nonzero_exit_and_traceback_tail():
    result = run_python("raise ValueError('boom')", "", FAST)
    assert result.exit_code == 1 and not result.ok
    assert "ValueError: boom" in result.stderr_tail


def test_program_may_use_its_working_directory_and_numpy():
    code = "open('a.txt','w').write('42')\nimport numpy as np\nprint(int(np.array([int(open('a.txt').read())]).sum()))"
    result = run_python(code, "", Limits(wall_s=10, memory_mb=1024))
    assert result.ok and result.stdout.strip() == "42", result


@pytest.mark.parametrize("namespaces", MODES)
def test_infinite_loop_stops_at_cpu_limit(namespaces):
    result, elapsed = _run_contained("while True: pass", _limits(namespaces))
    assert result.timed_out and result.exit_code is None


@pytest.mark.parametrize("namespaces", MODES)
def test_sleeping_program_stops_at_wall_limit(namespaces):
    result, elapsed = _run_contained("import time\ntime.sleep(60)", _limits(namespaces, wall_s=1.0))
    assert result.timed_out and elapsed >= 1.0


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize("bomb", [
    "while True:\n    os.fork()",
    "import subprocess\nwhile True:\n    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])",
    "import multiprocessing\nwhile True:\n    multiprocessing.Process(target=time.sleep, args=(60,)).start()",
    "os.system('sleep 60 &')",
    "import _posixsubprocess\n_posixsubprocess.fork_exec([b'/bin/sleep'], [b'/bin/sleep', b'60'], True, (), None, None,"
    " -1, -1, -1, -1, -1, -1, -1, -1, False, True, None, None, None, -1, None, False)",
], ids=["os.fork", "subprocess", "multiprocessing", "os.system", "fork_exec"])
def test_fork_bombs_are_refused(namespaces, bomb):
    result, _ = _run_contained("import time\n" + bomb, _limits(namespaces))
    assert result.exit_code == 1 and "PermissionError" in result.stderr_tail


@pytest.mark.parametrize("namespaces", MODES)
def test_memory_bomb(namespaces):
    # Touching pages is slow on a loaded machine: a small cap and a generous clock keep this about memory.
    limits = _limits(namespaces, memory_mb=128, wall_s=3.0, cpu_s=3.0)
    result, _ = _run_contained("a = []\nwhile True:\n    a.append(bytearray(10**7))", limits)
    assert result.memory_exceeded and not result.ok


def test_single_huge_allocation_is_refused():
    result, _ = _run_contained("x = bytearray(8 * 10**9)", FAST)
    assert result.memory_exceeded


@pytest.mark.parametrize("namespaces", MODES)
def test_100mb_print_is_cut_at_the_cap(namespaces):
    result, _ = _run_contained("sys.stdout.write('x' * 10**8)", _limits(namespaces))
    assert result.output_truncated and not result.ok
    assert len(result.stdout.encode()) <= FAST.max_output_bytes


def test_stderr_flood_is_cut_and_only_the_tail_kept():
    result, _ = _run_contained("while True:\n    sys.stderr.write('e' * 1000)", FAST)
    assert result.output_truncated and len(result.stderr_tail) <= FAST.stderr_tail_bytes


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize("target", ["/tmp/atgrpo_sandbox_escape", "../atgrpo_sandbox_escape"])
def test_writing_outside_the_working_directory_fails(namespaces, target, tmp_path):
    outside = os.path.normpath(os.path.join("/tmp", os.path.basename(target)))
    code = (f"try:\n    open({target!r}, 'w').write('x')\nexcept PermissionError:\n    print('refused')\n"
            f"for f in (lambda: os.mkdir({target!r}), lambda: os.rename('nope', {target!r}),"
            f" lambda: os.symlink('/tmp', 'link'), lambda: os.open('/tmp', os.O_RDONLY),"
            f" lambda: next(os.fwalk('/tmp'))):\n"
            "    try:\n        f()\n    except PermissionError:\n        print('refused')\n")
    result, _ = _run_contained(code, _limits(namespaces))
    assert result.stdout.splitlines()[1:] == ["refused"] * 6
    assert not os.path.exists(outside)


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize("attempt", [
    "import socket\ns = socket.socket()",
    "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=0.5)",
    "import socket\nsocket.create_connection(('8.8.8.8', 53), timeout=0.5)",
    "import socket\nsocket.getaddrinfo('example.com', 80)",
    "import urllib.request\nurllib.request.urlopen('http://1.1.1.1', timeout=0.5)",
])
def test_sockets_fail(namespaces, attempt):
    result, _ = _run_contained(attempt, _limits(namespaces))
    assert result.exit_code == 1 and "PermissionError" in result.stderr_tail


def test_network_namespace_has_no_interface_but_loopback():
    code = ("names = [l.split(':')[0].strip() for l in open('/proc/self/net/dev').read().splitlines()[2:]]\n"
            "print(os.getpid(), ' '.join(names))")
    result, _ = _run_contained(code, FAST)
    pid, interfaces = result.stdout.splitlines()[1].split(" ", 1)
    if pid == "2":  # the program runs under an init, so namespaces were entered
        assert interfaces.split() == ["lo"]


@pytest.mark.parametrize("namespaces", MODES)
def test_parent_environment_is_not_visible(namespaces, monkeypatch):
    monkeypatch.setenv("ATGRPO_TEST_SECRET", "hunter2-secret")
    code = ("print(sorted(os.environ))\nprint('secret' in str(os.environ))\n"
            "try:\n    print(open('/proc/%d/environ' % int(sys.stdin.read())).read())\n"
            "except PermissionError:\n    print('refused')\n")
    result, _ = _run_contained(code, _limits(namespaces), stdin=str(os.getpid()))
    assert "hunter2" not in result.stdout
    assert set(eval(result.stdout.splitlines()[1])) <= {
        "PATH", "LANG", "HOME", "TMPDIR", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LC_CTYPE"}
    assert result.stdout.splitlines()[2:] == ["False", "refused"]


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize("attack", [
    "os.kill(os.getppid(), 9)",
    "os.kill(int(sys.stdin.read()), 9)",
    "os.kill(-1, 9)",
    "os.killpg(os.getpgid(int(sys.stdin.read())), 9)",
])
def test_signalling_the_parent_is_contained(namespaces, attack):
    result, _ = _run_contained(attack, _limits(namespaces), stdin=str(os.getpid()))
    assert not result.ok  # refused (PermissionError) or, for getppid in a PID namespace, only its own init
    assert os.getpid() > 0  # we are still here


def test_run_many_is_ordered_and_bounded():
    code = ("import sys, time\nn = int(sys.stdin.read())\nstart = time.monotonic()\ntime.sleep(0.4)\n"
            "print(n, start, time.monotonic())")
    n, workers = 16, 4
    results = run_many([code] * n, [str(i) for i in range(n)], FAST, max_workers=workers)
    assert [int(r.stdout.split()[0]) for r in results] == list(range(n))
    spans = [tuple(map(float, r.stdout.split()[1:])) for r in results]
    most_at_once = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert 2 <= most_at_once <= workers  # concurrent, and never more than the pool size


def test_run_many_mixes_failures_without_raising():
    codes = ["print(1)", "while True: pass", "raise SystemExit(7)", "print(", "\x00\udcff"]
    results = run_many(codes, limits=Limits(wall_s=1.0, cpu_s=1.0), max_workers=2)
    assert [r.stdout for r in results[:1]] == ["1\n"]
    assert results[1].timed_out and results[2].exit_code == 7
    assert results[3].exit_code == 1 and "SyntaxError" in results[3].stderr_tail
    assert not results[4].ok
    with pytest.raises(ValueError):
        run_many(["print(1)"], ["", ""])
    assert run_many([]) == []
