# shellcheck shell=bash
# Shared by the Cloud TPU scripts: flag parsing, required flags, and the
# runner that prints commands instead of running them under --dry-run.
# Each script defines usage() and then sources this file.

# Globals the scripts read after parsing (shellcheck: assigned here, used there).
# shellcheck disable=SC2034
{
  NAME="" ZONE="" PROJECT="" DRY_RUN=0 VALUE="" NSHIFT=0 PREFLIGHT=1
  REMOTE_DIR="atgrpo-jax"  # the project on every worker, relative to the remote home
  LOG="logs/train.log"     # training log on every worker, relative to REMOTE_DIR
  PID_FILE="logs/train.pid"
}

die() {
  echo "error: $*" >&2
  exit 2
}

# flag_value ARG [NEXT...]: the value of `--flag=value` or `--flag value`; sets VALUE and NSHIFT.
flag_value() {
  if [[ "$1" == *=* ]]; then
    VALUE=${1#*=}
    NSHIFT=1
  elif [[ $# -ge 2 && "$2" != --* ]]; then
    VALUE=$2
    NSHIFT=2
  else
    die "$1 needs a value"
  fi
}

# common_flag ARG...: handles the flags every script has; NSHIFT=0 if ARG is not one of them.
common_flag() {
  NSHIFT=0
  case "$1" in
    --name | --name=*) flag_value "$@" && NAME=$VALUE ;;
    --zone | --zone=*) flag_value "$@" && ZONE=$VALUE ;;
    --project | --project=*) flag_value "$@" && PROJECT=$VALUE ;;
    --dir | --dir=*) flag_value "$@" && REMOTE_DIR=$VALUE ;;
    --dry-run) DRY_RUN=1 && NSHIFT=1 ;;
    --no-preflight) PREFLIGHT=0 && NSHIFT=1 ;;
    -h | --help) usage && exit 0 ;;
  esac
}

require() {  # require VALUE FLAG
  [[ -n "$1" ]] || die "$2 is required (see --help)"
}

# quote ARG: ARG as one shell word (unchanged when it needs no quotes; --flag='value' for flags).
quote() {
  local safe='^[A-Za-z0-9_@%+=:,./-]+$' flag='^(--[A-Za-z0-9.-]+=)(.+)$'
  if [[ "$1" =~ $safe ]]; then
    printf '%s' "$1"
  elif [[ "$1" =~ $flag ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
    quote "${BASH_REMATCH[2]}"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# quote_all ARG...: the arguments as one line of shell words.
quote_all() {
  local out="" arg
  for arg in "$@"; do
    out+="${out:+ }$(quote "$arg")"
  done
  printf '%s' "$out"
}

# run CMD ARG...: run the command, or with --dry-run print it as one line.
run() {
  if ((DRY_RUN)); then
    printf '%s\n' "$(quote_all "$@")"
  else
    "$@"
  fi
}

# scope: the --zone/--project flags of every gcloud TPU command (needs --name and --zone).
scope() {
  require "$NAME" --name
  require "$ZONE" --zone
  SCOPE=(--zone="$ZONE")
  if [[ -n "$PROJECT" ]]; then
    SCOPE+=(--project="$PROJECT")
  fi
}

# on_workers WORKER COMMAND: run a shell command on TPU VM workers (all, or an index) over ssh.
on_workers() {
  run gcloud compute tpus tpu-vm ssh "$NAME" "${SCOPE[@]}" --worker="$1" --command="$2"
}

# preflight PLAN_ARG...: `python -m atgrpo_jax.plan PLAN_ARG...` on this machine before anything starts on
# the cluster (`--compile=TARGET` compiles the step for the slice here, no TPU needed). A run that does
# not fit stops the script with the planner's one line (exit 1; 2 for bad input). PYTHON picks the
# interpreter (default python, with this project installed); --no-preflight skips the check.
preflight() {
  ((PREFLIGHT)) || return 0
  local python=${PYTHON:-python} err rc=0
  if ((DRY_RUN)); then  # on stderr: stdout is the commands (or manifest) the run would submit
    printf 'preflight: %s\n' "$(quote_all "$python" -m atgrpo_jax.plan "$@")" >&2
    return 0
  fi
  echo "preflight: $python -m atgrpo_jax.plan $*" >&2
  err=$("$python" -m atgrpo_jax.plan "$@" 2>&1 >/dev/null) || rc=$?
  if ((rc == 0)); then
    echo "preflight: it fits" >&2
    return 0
  fi
  local verdict
  verdict=$(grep -E '^(DOES NOT FIT|error:|libtpu (aborted|failed) compiling)' <<<"$err" | tail -n 1)
  if [[ -z "$verdict" ]]; then
    echo "error: the preflight could not run (install this project here: pip install -e \".[tpu]\"; or pass --no-preflight): $(tail -n 1 <<<"$err")" >&2
    exit 2
  fi
  echo "$verdict (nothing was started; --no-preflight skips this check)" >&2
  exit $((rc == 1 ? 1 : 2))
}

