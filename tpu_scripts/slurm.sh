#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Train on several GPU hosts under SLURM: writes an sbatch script and submits it (docs/clusters.md).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tpu_scripts/slurm.sh --nodes N --gpus-per-node G --config configs/X.py --workdir DIR
                            [options] [--config.key=value ...]

One task per node, each with all of its node's GPUs (JAX_LOCAL_DEVICE_IDS); `srun`
starts `python -m atgrpo_jax.train` on every node and jax.distributed reads the
hosts from SLURM's variables (--config.distributed.auto=True). The mesh's data axis
spans the nodes (--config.mesh.data=N), fsdp the GPUs of each node. DIR must be
shared by every node (a shared file system or gs://). Resubmitting the same
command resumes the run from its last checkpoint.

  --nodes N            hosts (default 2)
  --gpus-per-node G    GPUs per host (default 8)
  --config FILE        config file, relative to the project directory
  --workdir DIR        checkpoints, metrics and TensorBoard (shared by every node)
  --config.KEY=VALUE   config overrides, passed through unchanged (also after --)
  --name NAME          job name (default atgrpo)
  --partition P        SLURM partition
  --account A          SLURM account
  --time T             time limit (default 24:00:00)
  --cpus-per-task C    CPUs per node's task (default 32)
  --dir DIR            project directory on the nodes (default: this checkout)
  --venv DIR           virtual environment to activate (default: DIR/.venv if it exists)
  --no-preflight       submit without the planner's memory check first
  --dry-run            Print the sbatch script instead of submitting it
  -h, --help           This help
USAGE
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NODES=2 GPUS=8 CONFIG="" WORKDIR="" OVERRIDES=() PARTITION="" ACCOUNT="" TIME=24:00:00 CPUS=32 VENV=""
NAME=atgrpo REMOTE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
while (($#)); do
  common_flag "$@"
  if ((NSHIFT == 0)); then
    case "$1" in
      --nodes | --nodes=*) flag_value "$@" && NODES=$VALUE ;;
      --gpus-per-node | --gpus-per-node=*) flag_value "$@" && GPUS=$VALUE ;;
      --config | --config=*) flag_value "$@" && CONFIG=$VALUE ;;
      --workdir | --workdir=*) flag_value "$@" && WORKDIR=$VALUE ;;
      --partition | --partition=*) flag_value "$@" && PARTITION=$VALUE ;;
      --account | --account=*) flag_value "$@" && ACCOUNT=$VALUE ;;
      --time | --time=*) flag_value "$@" && TIME=$VALUE ;;
      --cpus-per-task | --cpus-per-task=*) flag_value "$@" && CPUS=$VALUE ;;
      --venv | --venv=*) flag_value "$@" && VENV=$VALUE ;;
      --config.*=*) OVERRIDES+=("$1") NSHIFT=1 ;;
      --) shift && OVERRIDES+=("$@") && break ;;
      *) die "unknown flag '$1' (config overrides look like --config.rollout.k=8; see --help)" ;;
    esac
  fi
  shift "$NSHIFT"
done

require "$CONFIG" --config
require "$WORKDIR" --workdir
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got '$NODES'"
[[ "$GPUS" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node must be a positive integer, got '$GPUS'"
[[ -n "$VENV" || ! -d "$REMOTE_DIR/.venv" ]] || VENV="$REMOTE_DIR/.venv"

TRAIN=(python -m atgrpo_jax.train "--config=$CONFIG" "--workdir=$WORKDIR" --config.distributed.auto=True
       "--config.mesh.data=$NODES" "${OVERRIDES[@]}")
# The planner's memory check before anything is queued (80 GB GPUs; compiling for GPUs needs jax's CUDA plugin).
preflight "--config=$CONFIG" --device=gpu --gpu-memory-gb=80 "--num-devices=$((NODES * GPUS))" \
  "--config.mesh.data=$NODES" "${OVERRIDES[@]}"

render() {
  echo "#!/usr/bin/env bash"
  echo "#SBATCH --job-name=$NAME"
  echo "#SBATCH --nodes=$NODES"
  echo "#SBATCH --ntasks-per-node=1"
  echo "#SBATCH --gpus-per-node=$GPUS"
  echo "#SBATCH --cpus-per-task=$CPUS"
  echo "#SBATCH --time=$TIME"
  echo "#SBATCH --output=logs/%x-%j.out"
  [[ -z "$PARTITION" ]] || echo "#SBATCH --partition=$PARTITION"
  [[ -z "$ACCOUNT" ]] || echo "#SBATCH --account=$ACCOUNT"
  echo "set -euo pipefail"
  echo "cd $(quote "$REMOTE_DIR")"
  [[ -z "$VENV" ]] || echo "source $(quote "$VENV/bin/activate")"
  echo "export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=.95"
  echo "# one process per node, on all of its GPUs: jax.distributed.initialize() reads the hosts, the process"
  echo "# count and this process's id from SLURM's variables, and would otherwise take one GPU per process"
  echo "export JAX_LOCAL_DEVICE_IDS=$(seq -s, 0 $((GPUS - 1)))"
  echo "srun --kill-on-bad-exit=1 $(quote_all "${TRAIN[@]}")"
}

if ((DRY_RUN)); then
  render
else
  mkdir -p "$REMOTE_DIR/logs"
  render | sbatch --chdir="$REMOTE_DIR"
fi
