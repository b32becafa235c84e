#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Create a Cloud TPU VM or pod slice (directly, or as a queued resource for spot/reserved capacity).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tpu_scripts/create.sh --name NAME --zone ZONE --accelerator-type TYPE [options] [-- GCLOUD_FLAGS...]

Creates a TPU VM (one host) or pod slice (several hosts) with gcloud.

  --name NAME               TPU name (also the queued resource's name)
  --zone ZONE               e.g. us-east5-a, europe-west4-b
  --accelerator-type TYPE   v4-8, v5p-8, v5p-32, v5litepod-8, v6e-8, ...
  --version VERSION         TPU runtime (software) version; default by generation:
                            v6e: v2-alpha-tpuv6e, v5p: v2-alpha-tpuv5,
                            v5e: v2-alpha-tpuv5-lite, v4: tpu-ubuntu2204-base
  --project PROJECT         Google Cloud project (default: gcloud's configured one)
  --spot                    Spot capacity, through a queued resource
  --reserved                Reserved capacity, through a queued resource
  --queued                  Use a queued resource for on-demand capacity too
  --dry-run                 Print the commands instead of running them
  -h, --help                This help

Flags after `--` go to the gcloud create command unchanged.
A queued resource becomes a TPU once capacity is granted; watch it with
  gcloud compute tpus queued-resources describe NAME --zone ZONE
and delete it with tpu_scripts/teardown.sh --queued.
USAGE
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

default_version() {
  case "$1" in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*) echo v2-alpha-tpuv5-lite ;;
    v4-* | v3-* | v2-*) echo tpu-ubuntu2204-base ;;
    *) die "no default runtime version for accelerator type '$1'; pass --version" ;;
  esac
}

ACCELERATOR="" VERSION="" CAPACITY="" QUEUED=0 EXTRA=()
while (($#)); do
  common_flag "$@"
  if ((NSHIFT == 0)); then
    case "$1" in
      --accelerator-type | --accelerator-type=*) flag_value "$@" && ACCELERATOR=$VALUE ;;
      --version | --version=*) flag_value "$@" && VERSION=$VALUE ;;
      --spot | --reserved)
        [[ -z "$CAPACITY" || "$CAPACITY" == "$1" ]] || die "--spot and --reserved exclude each other"
        CAPACITY=$1 QUEUED=1 NSHIFT=1 ;;
      --queued) QUEUED=1 NSHIFT=1 ;;
      --) shift && EXTRA=("$@") && break ;;
      *) die "unknown flag '$1' (see --help)" ;;
    esac
  fi
  shift "$NSHIFT"
done

scope
require "$ACCELERATOR" --accelerator-type
VERSION=${VERSION:-$(default_version "$ACCELERATOR")}

if ((QUEUED)); then
  run gcloud compute tpus queued-resources create "$NAME" "${SCOPE[@]}" --node-id="$NAME" \
    --accelerator-type="$ACCELERATOR" --runtime-version="$VERSION" ${CAPACITY:+"$CAPACITY"} ${EXTRA[@]+"${EXTRA[@]}"}
  echo "queued: check with gcloud compute tpus queued-resources describe $NAME --zone $ZONE" >&2
else
  run gcloud compute tpus tpu-vm create "$NAME" "${SCOPE[@]}" \
    --accelerator-type="$ACCELERATOR" --version="$VERSION" ${EXTRA[@]+"${EXTRA[@]}"}
fi
