#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Start training on every worker of a TPU VM or pod slice at once, detached, logging to a file.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tpu_scripts/launch.sh --name NAME --zone ZONE --config configs/X.py --workdir gs://BUCKET/RUN
                             [options] [--config.key=value ...]

Runs `python -m atgrpo_jax.train --config=... --workdir=... [overrides]` on all
workers in one gcloud ssh --worker=all call. Each worker's process is detached
(setsid nohup) and writes ~/DIR/logs/train.log; JAX connects the hosts by itself
on TPU. Checkpoints (orbax, through tensorstore) and TensorBoard events (through
gcsfs) go to the gs:// workdir, which every host must share. The workers' service
account needs write access to the bucket.

  --name NAME          TPU name
  --zone ZONE          its zone
  --project PROJECT    Google Cloud project (default: gcloud's configured one)
  --config FILE        config file, relative to the project directory
  --workdir gs://...   checkpoints and TensorBoard
  --config.KEY=VALUE   config overrides, passed through unchanged (also after --)
  --env KEY=VALUE      environment variable for the trainer (repeatable)
  --dir DIR            project directory on the workers (default: atgrpo-jax)
  --accelerator-type T the slice (v5p-32, ...) the preflight compiles for (default: asked of gcloud)
  --no-preflight       start without compiling the step for the slice here first
  --dry-run            Print the commands instead of running them
  -h, --help           This help

Before anything starts on the workers, `python -m atgrpo_jax.plan --compile=TYPE` compiles
the config's training step for the slice on this machine (no TPU needed; PYTHON picks the
interpreter) and a config that does not fit is refused in one line.
Follow the logs with tpu_scripts/logs.sh and stop the run with tpu_scripts/stop.sh.
USAGE
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CONFIG="" WORKDIR="" OVERRIDES=() ENVS=(PYTHONUNBUFFERED=1) ACCEL=""
while (($#)); do
  common_flag "$@"
  if ((NSHIFT == 0)); then
    case "$1" in
      --config | --config=*) flag_value "$@" && CONFIG=$VALUE ;;
      --workdir | --workdir=*) flag_value "$@" && WORKDIR=$VALUE ;;
      --accelerator-type | --accelerator-type=*) flag_value "$@" && ACCEL=$VALUE ;;
      --config.*=*) OVERRIDES+=("$1") NSHIFT=1 ;;
      --env | --env=*)
        flag_value "$@"
        [[ "$VALUE" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env needs KEY=VALUE, got '$VALUE'"
        ENVS+=("$VALUE") ;;
      --) shift && OVERRIDES+=("$@") && break ;;
      *) die "unknown flag '$1' (config overrides look like --config.rollout.k=8; see --help)" ;;
    esac
  fi
  shift "$NSHIFT"
done

scope
require "$CONFIG" --config
require "$WORKDIR" --workdir
[[ "$WORKDIR" == gs://* ]] || die "--workdir must be a gs:// path: every host writes checkpoints to it"

if ((PREFLIGHT)) && [[ -z "$ACCEL" ]]; then
  DESCRIBE=(gcloud compute tpus tpu-vm describe "$NAME" "${SCOPE[@]}" --format="value(acceleratorType)")
  if ((DRY_RUN)); then
    echo "preflight: ACCELERATOR_TYPE is what $(quote_all "${DESCRIBE[@]}") prints" >&2
    ACCEL=ACCELERATOR_TYPE
  else
    ACCEL=$("${DESCRIBE[@]}") || die "cannot ask gcloud for $NAME's accelerator type (pass --accelerator-type)"
  fi
fi
preflight --config="$CONFIG" --compile="$ACCEL" ${OVERRIDES[@]+"${OVERRIDES[@]}"}

# distributed.auto: jax.distributed finds the pod's hosts itself (TPU metadata).
TRAIN=(.venv/bin/python -m atgrpo_jax.train --config="$CONFIG" --workdir="$WORKDIR" --config.distributed.auto=True
       ${OVERRIDES[@]+"${OVERRIDES[@]}"})
DIR=$(quote "$REMOTE_DIR")
# A second trainer cannot open the TPU, so refuse to start while the last one runs.
# `cmd &` puts the whole &&-list before it in the background, hence the `;`s.
on_workers all "cd $DIR && mkdir -p logs || exit 1;\
 if [ -f $PID_FILE ] && kill -0 \"\$(cat $PID_FILE)\" 2>/dev/null;\
 then echo \"\$(hostname): already training (pid \$(cat $PID_FILE)); stop it with tpu_scripts/stop.sh\" >&2; exit 1; fi;\
 $(quote_all env "${ENVS[@]}") setsid nohup $(quote_all "${TRAIN[@]}") > $LOG 2>&1 < /dev/null &\
 echo \$! > $PID_FILE; echo \"\$(hostname): started, log ~/$DIR/$LOG\""
