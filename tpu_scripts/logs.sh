#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Stream the training log of one worker (default 0) or of all workers.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tpu_scripts/logs.sh --name NAME --zone ZONE [--worker N|all] [--lines N] [--no-follow]

  --name NAME          TPU name
  --zone ZONE          its zone
  --project PROJECT    Google Cloud project (default: gcloud's configured one)
  --worker N|all       which worker's log (default: 0, the one that prints metrics)
  --lines N            start with the last N lines (default: 100)
  --no-follow          print and exit instead of following the log
  --dir DIR            project directory on the workers (default: atgrpo-jax)
  --dry-run            Print the commands instead of running them
  -h, --help           This help
USAGE
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WORKER=0 LINES=100 FOLLOW=(-F)
while (($#)); do
  common_flag "$@"
  if ((NSHIFT == 0)); then
    case "$1" in
      --worker | --worker=*) flag_value "$@" && WORKER=$VALUE ;;
      --lines | --lines=*) flag_value "$@" && LINES=$VALUE ;;
      --no-follow) FOLLOW=() NSHIFT=1 ;;
      *) die "unknown flag '$1' (see --help)" ;;
    esac
  fi
  shift "$NSHIFT"
done

scope
[[ "$WORKER" == all || "$WORKER" =~ ^[0-9]+$ ]] || die "--worker must be a worker index or 'all', got '$WORKER'"
[[ "$LINES" =~ ^[0-9]+$ ]] || die "--lines must be a number, got '$LINES'"
on_workers "$WORKER" "$(quote_all tail -n "$LINES" ${FOLLOW[@]+"${FOLLOW[@]}"} "$REMOTE_DIR/$LOG")"
