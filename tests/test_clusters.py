"""Cluster recipes (docs/clusters.md): the SLURM sbatch script and the GKE JobSet manifest, rendered by
their --dry-run and checked field by field; the SLURM variables reach jax.distributed as the trainer needs."""
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from atgrpo_jax import distributed

SCRIPTS = Path(__file__).resolve().parent.parent / "tpu_scripts"
OVERRIDE = "--config.env.kwargs.system_prompt=Say \"it's\" \\done"  # quotes and a backslash survive


def render(name, *args):
    out = subprocess.run(["bash", str(SCRIPTS / name), "--dry-run", *args], capture_output=True, text=True,
                         timeout=60)
    return out


def test_slurm_sbatch_script(tmp_path):
    out = render("slurm.sh", "--nodes", "4", "--gpus-per-node", "8", "--config", "configs/math_qwen3_8b.py",
                 "--workdir", "/shared/runs/m", "--partition", "h100", "--", OVERRIDE)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    (tmp_path / "job.sbatch").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0  # valid bash
    sbatch = dict(line[len("#SBATCH --"):].split("=", 1) for line in text.splitlines() if line.startswith("#SBATCH"))
    assert sbatch["nodes"] == "4" and sbatch["ntasks-per-node"] == "1" and sbatch["gpus-per-node"] == "8"
    assert sbatch["partition"] == "h100"
    assert "export JAX_LOCAL_DEVICE_IDS=0,1,2,3,4,5,6,7" in text  # every GPU of the node, not one per process
    [srun] = [shlex.split(line) for line in text.splitlines() if line.startswith("srun ")]
    train = srun[srun.index("python"):]
    assert train[:5] == ["python", "-m", "atgrpo_jax.train", "--config=configs/math_qwen3_8b.py",
                         "--workdir=/shared/runs/m"]
    assert {"--config.distributed.auto=True", "--config.mesh.data=4", OVERRIDE} <= set(train)


def test_slurm_variables_give_jax_all_of_a_nodes_gpus(monkeypatch):
    """What jax.distributed.initialize() (distributed.auto) makes of the job's variables on node 2 of 4."""
    from jax._src.clusters import ClusterEnv

    for key, value in dict(SLURM_JOB_ID="77", SLURM_STEP_NODELIST="gpu[10-13]", SLURM_NTASKS="4",
                           SLURM_PROCID="2", SLURM_LOCALID="0").items():
        monkeypatch.setenv(key, value)
    address, count, pid, local = ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, list(range(8)), None, None)  # JAX_LOCAL_DEVICE_IDS from the script
    assert address.startswith("gpu10:") and (count, pid, local) == (4, 2, list(range(8)))
    assert ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, None)[3] == [0]  # without it


def jobset(*args):
    out = render("gke.sh", "--image", "us-docker.pkg.dev/p/atgrpo:1", "--config", "configs/math_qwen3_8b.py",
                 "--workdir", "gs://bucket/run", "--name", "math8b", *args, "--", OVERRIDE)
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    assert doc["apiVersion"].startswith("jobset.x-k8s.io/") and doc["kind"] == "JobSet"
    [job] = doc["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    return doc, job, pod, container


def test_gke_tpu_jobset():
    doc, job, pod, c = jobset("--tpu", "tpu-v5p-slice", "--topology", "2x2x4", "--nodes", "4")
    spec = job["template"]["spec"]
    assert spec["parallelism"] == spec["completions"] == 4 and spec["completionMode"] == "Indexed"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                   "cloud.google.com/gke-tpu-topology": "2x2x4"}
    assert c["resources"]["limits"] == {"google.com/tpu": 4}
    assert c["command"][:5] == ["python", "-m", "atgrpo_jax.train", "--config=configs/math_qwen3_8b.py",
                                "--workdir=gs://bucket/run"]
    assert {"--config.distributed.auto=True", "--config.mesh.data=4", OVERRIDE} <= set(c["command"])
    assert "cloud.google.com/gke-nodepool" in doc["metadata"]["annotations"].values()


def test_gke_gpu_jobset_names_the_coordinator_the_trainer_reads():
    doc, job, pod, c = jobset("--gpu", "nvidia-h100-80gb", "--gpus-per-node", "8", "--nodes", "2")
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8} and "--config.distributed.auto=True" not in c["command"]
    env = {e["name"]: e for e in c["env"]}
    # the variables atgrpo_jax.distributed.init_distributed reads; pod 0 by the JobSet's DNS name
    assert env[distributed.ENV_COORDINATOR]["value"] == "math8b-workers-0-0.math8b:8476"
    assert env[distributed.ENV_NUM_PROCESSES]["value"] == "2"
    assert "job-completion-index" in env[distributed.ENV_PROCESS_ID]["valueFrom"]["fieldRef"]["fieldPath"]
    assert doc["spec"]["network"]["enableDNSHostnames"] is True


@pytest.mark.parametrize("script, args, message", [
    ("slurm.sh", ["--workdir", "/x"], "--config is required"),
    ("slurm.sh", ["--config", "c.py", "--workdir", "/x", "--nodes", "0"], "--nodes must be a positive integer"),
    ("gke.sh", ["--image", "i", "--config", "c.py", "--workdir", "/local", "--gpu", "g"], "must be a gs:// path"),
    ("gke.sh", ["--image", "i", "--config", "c.py", "--workdir", "gs://b/r", "--gpu", "g", "--tpu", "t",
                "--topology", "2x2"], "exactly one of --tpu and --gpu"),
    ("gke.sh", ["--image", "i", "--config", "c.py", "--workdir", "gs://b/r", "--tpu", "t"], "--tpu needs --topology"),
])
def test_bad_flags_are_one_line(script, args, message):
    out = render(script, *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
