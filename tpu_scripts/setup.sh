#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Install the project and jax[tpu] on every worker of a TPU VM or pod slice.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tpu_scripts/setup.sh --name NAME --zone ZONE (--repo URL [--ref REF] | --local-dir DIR) [options]

On every worker (gcloud ... ssh --worker=all): puts the project in ~/DIR (a git
clone, or a copy of a local directory), makes a Python venv with uv, and
installs the project with its tpu extra: jax[tpu], gcsfs and google-cloud-storage (gs:// workdirs).

  --name NAME          TPU name
  --zone ZONE          its zone
  --project PROJECT    Google Cloud project (default: gcloud's configured one)
  --repo URL           git repository to clone on every worker
  --ref REF            branch, tag or commit to check out (default: main)
  --local-dir DIR      copy this local directory instead (without .git, .venv, caches)
  --dir DIR            project directory on the workers, under the home (default: atgrpo-jax)
  --python VERSION     Python of the venv (default: 3.11; jax 0.10.2 needs >= 3.11)
  --hf-model ORG/NAME  also download this Hugging Face checkpoint to ~/DIR/models/NAME on every
                       worker (then train with --config.model.hf_path=models/NAME)
  --dry-run            Print the commands instead of running them
  -h, --help           This help
USAGE
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

LIBTPU_LINKS="https://storage.googleapis.com/jax-releases/libtpu_releases.html"
REPO="" REF="main" LOCAL_DIR="" PYTHON="3.11" HF_MODEL=""
while (($#)); do
  common_flag "$@"
  if ((NSHIFT == 0)); then
    case "$1" in
      --repo | --repo=*) flag_value "$@" && REPO=$VALUE ;;
      --ref | --ref=*) flag_value "$@" && REF=$VALUE ;;
      --local-dir | --local-dir=*) flag_value "$@" && LOCAL_DIR=$VALUE ;;
      --python | --python=*) flag_value "$@" && PYTHON=$VALUE ;;
      --hf-model | --hf-model=*) flag_value "$@" && HF_MODEL=$VALUE ;;
      *) die "unknown flag '$1' (see --help)" ;;
    esac
  fi
  shift "$NSHIFT"
done

scope
[[ -n "$REPO" || -n "$LOCAL_DIR" ]] || die "one of --repo URL or --local-dir DIR is required (see --help)"
[[ -z "$REPO" || -z "$LOCAL_DIR" ]] || die "--repo and --local-dir exclude each other"
[[ -z "$HF_MODEL" || "$HF_MODEL" =~ ^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$ ]] ||
  die "--hf-model must look like ORG/NAME (e.g. Qwen/Qwen3-8B), got '$HF_MODEL'"
DIR=$(quote "$REMOTE_DIR")

# 1. The code, identical on every worker.
if [[ -n "$LOCAL_DIR" ]]; then
  [[ -f "$LOCAL_DIR/setup.py" ]] || die "--local-dir $LOCAL_DIR has no setup.py"
  ARCHIVE="${TMPDIR:-/tmp}/atgrpo-jax-$NAME.tgz"
  run tar --exclude=.git --exclude=.venv --exclude=__pycache__ --exclude='*.pyc' \
    -czf "$ARCHIVE" -C "$LOCAL_DIR" .
  run gcloud compute tpus tpu-vm scp "$ARCHIVE" "$NAME:atgrpo-jax-src.tgz" "${SCOPE[@]}" --worker=all
  on_workers all "mkdir -p $DIR && tar -xzf atgrpo-jax-src.tgz -C $DIR && rm atgrpo-jax-src.tgz"
else
  on_workers all "(command -v git >/dev/null || (sudo apt-get update -y && sudo apt-get install -y git))\
 && ([ -d $DIR/.git ] || git clone $(quote "$REPO") $DIR)\
 && git -C $DIR fetch --depth=1 origin $(quote "$REF") && git -C $DIR checkout --detach FETCH_HEAD"
fi

# 2. A venv with the project and its "tpu" extra (setup.py): jax[tpu] at the jax version the project pins
#    (libtpu), gcsfs and google-cloud-storage (epath and orbax on gs://).
on_workers all "cd $DIR && python3 -m pip install --user --upgrade uv\
 && ([ -x .venv/bin/python ] || python3 -m uv venv --seed --python $(quote "$PYTHON") .venv)\
 && .venv/bin/python -m pip install --upgrade pip\
 && .venv/bin/python -m pip install -e $(quote ".[tpu]") -f $LIBTPU_LINKS"

# 3. Every worker sees the whole slice (JAX finds the other hosts by itself on TPU).
on_workers all "cd $DIR && .venv/bin/python -c 'import jax; print(jax.process_index(), jax.local_device_count(), jax.device_count())'"

# 4. Optionally, the weights: every host reads its own slice of them (models/hf_io.py).
if [[ -n "$HF_MODEL" ]]; then
  on_workers all "cd $DIR && .venv/bin/python -c \"from huggingface_hub import snapshot_download;\
 snapshot_download('$HF_MODEL', local_dir='models/${HF_MODEL#*/}')\""
fi
