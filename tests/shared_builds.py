"""Things a test session builds once for all its xdist workers: a run to copy and damage, a module's
checkpoints, a child process's results. Without this, each worker that runs one of the module's tests builds
its own (a session-scoped fixture is per worker)."""
import fcntl
import os
import shutil

SESSION_DIR_ENV = "ATGRPO_TEST_SESSION_DIR"  # the controller's scratch folder (tests/conftest.py), shared by workers


def built_once(name: str, build) -> str:
    """The directory `build(path)` fills, built by whichever worker asks first; the others wait for it and get
    the same path. A build that raises leaves nothing behind, and the next one to ask builds again. What is
    built is shared: tests read it or copy it, never change it."""
    path = os.path.join(os.environ[SESSION_DIR_ENV], name)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path + ".done"):
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
            try:
                build(path)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            open(path + ".done", "w").close()
    return path
