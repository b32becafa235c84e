#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Delete a TPU VM or pod slice (or the queued resource that created it).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tpu_scripts/teardown.sh --name NAME --zone ZONE [--queued] [--yes] [--project PROJECT] [--dry-run]

  --queued     the TPU came from a queued resource (create.sh --spot/--reserved/--queued):
               delete the queued resource and its TPU
  --yes        do not ask for confirmation
USAGE
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

QUEUED=0 YES=()
while (($#)); do
  common_flag "$@"
  if ((NSHIFT == 0)); then
    case "$1" in
      --queued) QUEUED=1 NSHIFT=1 ;;
      --yes) YES=(--quiet) NSHIFT=1 ;;
      *) die "unknown flag '$1' (see --help)" ;;
    esac
  fi
  shift "$NSHIFT"
done

scope
if ((QUEUED)); then
  run gcloud compute tpus queued-resources delete "$NAME" "${SCOPE[@]}" --force ${YES[@]+"${YES[@]}"}
else
  run gcloud compute tpus tpu-vm delete "$NAME" "${SCOPE[@]}" ${YES[@]+"${YES[@]}"}
fi
