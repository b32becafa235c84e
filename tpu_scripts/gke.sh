#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Train on a GKE TPU slice or on GPU nodes as a JobSet: renders the manifest and applies it (docs/clusters.md).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tpu_scripts/gke.sh --image IMAGE --config configs/X.py --workdir gs://BUCKET/RUN
                          (--tpu TYPE --topology AxB[xC] | --gpu TYPE --gpus-per-node G) --nodes N
                          [options] [--config.key=value ...]

A JobSet with one indexed Job of N pods, one per host, each running
`python -m atgrpo_jax.train` in IMAGE (an image with this project installed:
`pip install -e ".[tpu]"` or `".[cuda12]"`). TPU: jax.distributed finds the
slice's hosts itself (--config.distributed.auto=True). GPU: pod 0 is the
coordinator, named by the JobSet's DNS (NAME-workers-0-0.NAME), each pod's
process id is its completion index. The mesh's data axis spans the hosts
(--config.mesh.data=N). A failed pod restarts the whole JobSet (up to
--max-restarts), which resumes from the last checkpoint in the gs:// workdir.

  --image IMAGE        container image
  --config FILE        config file, relative to the image's working directory
  --workdir gs://...   checkpoints, metrics and TensorBoard
  --nodes N            hosts (pods) (default 1)
  --tpu TYPE           GKE TPU accelerator, e.g. tpu-v5p-slice, tpu-v6e-slice
  --topology T         the slice's topology, e.g. 2x2x2 (v5p-16: 2 hosts of 4 chips)
  --chips-per-node C   TPU chips per host (default 4)
  --gpu TYPE           GKE GPU accelerator, e.g. nvidia-h100-80gb
  --gpus-per-node G    GPUs per host (default 8)
  --name NAME          JobSet name (default atgrpo)
  --namespace NS       Kubernetes namespace (default: kubectl's)
  --max-restarts R     JobSet restarts after a failure (default 3)
  --config.KEY=VALUE   config overrides, passed through unchanged (also after --)
  --no-preflight       apply without checking that the config fits the slice first
  --dry-run            Print the manifest instead of applying it
  -h, --help           This help
USAGE
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

IMAGE="" CONFIG="" WORKDIR="" NODES=1 TPU_TYPE="" TOPOLOGY="" CHIPS=4 GPU_TYPE="" GPUS=8 NAMESPACE="" RESTARTS=3
OVERRIDES=()
NAME=atgrpo
while (($#)); do
  common_flag "$@"
  if ((NSHIFT == 0)); then
    case "$1" in
      --image | --image=*) flag_value "$@" && IMAGE=$VALUE ;;
      --config | --config=*) flag_value "$@" && CONFIG=$VALUE ;;
      --workdir | --workdir=*) flag_value "$@" && WORKDIR=$VALUE ;;
      --nodes | --nodes=*) flag_value "$@" && NODES=$VALUE ;;
      --tpu | --tpu=*) flag_value "$@" && TPU_TYPE=$VALUE ;;
      --topology | --topology=*) flag_value "$@" && TOPOLOGY=$VALUE ;;
      --chips-per-node | --chips-per-node=*) flag_value "$@" && CHIPS=$VALUE ;;
      --gpu | --gpu=*) flag_value "$@" && GPU_TYPE=$VALUE ;;
      --gpus-per-node | --gpus-per-node=*) flag_value "$@" && GPUS=$VALUE ;;
      --namespace | --namespace=*) flag_value "$@" && NAMESPACE=$VALUE ;;
      --max-restarts | --max-restarts=*) flag_value "$@" && RESTARTS=$VALUE ;;
      --config.*=*) OVERRIDES+=("$1") NSHIFT=1 ;;
      --) shift && OVERRIDES+=("$@") && break ;;
      *) die "unknown flag '$1' (config overrides look like --config.rollout.k=8; see --help)" ;;
    esac
  fi
  shift "$NSHIFT"
done

require "$IMAGE" --image
require "$CONFIG" --config
require "$WORKDIR" --workdir
[[ "$WORKDIR" == gs://* ]] || die "--workdir must be a gs:// path: every pod writes checkpoints to it"
if [[ -n "$TPU_TYPE" && -n "$GPU_TYPE" ]] || [[ -z "$TPU_TYPE" && -z "$GPU_TYPE" ]]; then
  die "give exactly one of --tpu and --gpu"
fi
[[ -z "$TPU_TYPE" || -n "$TOPOLOGY" ]] || die "--tpu needs --topology (e.g. 2x2x2)"
for pair in "--nodes:$NODES" "--chips-per-node:$CHIPS" "--gpus-per-node:$GPUS" "--max-restarts:$RESTARTS"; do
  [[ "${pair#*:}" =~ ^[0-9]+$ ]] || die "${pair%%:*} must be an integer, got '${pair#*:}'"
done
((NODES >= 1)) || die "--nodes must be >= 1"
[[ "$NAME" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "--name must be a DNS label (lower case, digits, -), got '$NAME'"

# json STRING: STRING as a JSON (and so YAML) double-quoted scalar.
json() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "$s"
}

ARGS=(python -m atgrpo_jax.train "--config=$CONFIG" "--workdir=$WORKDIR" "--config.mesh.data=$NODES")
[[ -z "$TPU_TYPE" ]] || ARGS+=(--config.distributed.auto=True)
ARGS+=("${OVERRIDES[@]}")

# Before the cluster sees anything: a TPU slice's step compiled here for its topology; GPUs the planner's
# memory check (compiling for GPUs needs jax's CUDA plugin).
if [[ -n "$TPU_TYPE" ]]; then
  case "$TPU_TYPE" in
    tpu-v5p-slice) FAMILY=v5p ;; tpu-v6e-slice) FAMILY=v6e ;; tpu-v5-lite-podslice) FAMILY=v5e ;;
    tpu-v4-podslice) FAMILY=v4 ;; *) FAMILY="" ;;
  esac
  if [[ -n "$FAMILY" ]]; then
    preflight "--config=$CONFIG" "--compile=$FAMILY:$TOPOLOGY" "--config.mesh.data=$NODES" "${OVERRIDES[@]}"
  fi
else
  preflight "--config=$CONFIG" --device=gpu --gpu-memory-gb=80 "--num-devices=$((NODES * GPUS))" \
    "--config.mesh.data=$NODES" "${OVERRIDES[@]}"
fi

render() {
  cat <<YAML
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: $NAME
YAML
  [[ -z "$NAMESPACE" ]] || echo "  namespace: $(json "$NAMESPACE")"
  [[ -z "$TPU_TYPE" ]] || cat <<YAML
  annotations:
    alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool
YAML
  cat <<YAML
spec:
  failurePolicy:
    maxRestarts: $RESTARTS
  network:
    enableDNSHostnames: true
  replicatedJobs:
  - name: workers
    replicas: 1
    template:
      spec:
        parallelism: $NODES
        completions: $NODES
        completionMode: Indexed
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            nodeSelector:
YAML
  if [[ -n "$TPU_TYPE" ]]; then
    echo "              cloud.google.com/gke-tpu-accelerator: $(json "$TPU_TYPE")"
    echo "              cloud.google.com/gke-tpu-topology: $(json "$TOPOLOGY")"
  else
    echo "              cloud.google.com/gke-accelerator: $(json "$GPU_TYPE")"
  fi
  cat <<YAML
            containers:
            - name: train
              image: $(json "$IMAGE")
              command:
YAML
  local arg
  for arg in "${ARGS[@]}"; do
    echo "              - $(json "$arg")"
  done
  cat <<YAML
              env:
              - name: PYTHONUNBUFFERED
                value: "1"
YAML
  if [[ -n "$GPU_TYPE" ]]; then
    cat <<YAML
              - name: XLA_PYTHON_CLIENT_MEM_FRACTION
                value: ".95"
              - name: ATGRPO_COORDINATOR
                value: "$NAME-workers-0-0.$NAME:8476"
              - name: ATGRPO_NUM_PROCESSES
                value: "$NODES"
              - name: ATGRPO_PROCESS_ID
                valueFrom:
                  fieldRef:
                    fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
              ports:
              - containerPort: 8476
              resources:
                limits:
                  nvidia.com/gpu: $GPUS
YAML
  else
    cat <<YAML
              resources:
                limits:
                  google.com/tpu: $CHIPS
YAML
  fi
}

if ((DRY_RUN)); then
  render
else
  render | kubectl apply ${NAMESPACE:+--namespace "$NAMESPACE"} -f -
fi
