#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Stop the training started by launch.sh on every worker.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tpu_scripts/stop.sh --name NAME --zone ZONE [--project PROJECT] [--dir DIR] [--dry-run]

Sends SIGTERM to the trainer whose pid launch.sh saved on each worker.
USAGE
}

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

while (($#)); do
  common_flag "$@"
  ((NSHIFT)) || die "unknown flag '$1' (see --help)"
  shift "$NSHIFT"
done

scope
DIR=$(quote "$REMOTE_DIR")
on_workers all "cd $DIR && if [ -f $PID_FILE ] && kill \"\$(cat $PID_FILE)\" 2>/dev/null;\
 then echo \"\$(hostname): stopped\"; else echo \"\$(hostname): not running\"; fi"
