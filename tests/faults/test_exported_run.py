"""An exported policy of the demo evaluates with the demo's config: the checkpoint's own architecture
(its config.json: vocabulary, sizes) wins over the config's preset."""
import json
import os
import sys

from faults_util import ROOT, run


def test_an_exported_demo_policy_evaluates_with_the_demo_config(finished_run, tmp_path):
    out = tmp_path / "hf"
    proc = run([sys.executable, "-m", "atgrpo_jax.export", f"--checkpoint={finished_run}", f"--out={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~mask  # not mkdtemp's 0700: a server may run as another user
    assert all(os.stat(out / f).st_mode & 0o777 == 0o666 & ~mask for f in os.listdir(out))
    proc = run([sys.executable, "-m", "atgrpo_jax.evaluate", f"--config={ROOT}/configs/demo.py",
                f"--hf_path={out}", f"--out={tmp_path / 'eval'}", "--tasks=4"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert result["model"] == str(out) and 0.0 <= result["eval_success"] <= 1.0
