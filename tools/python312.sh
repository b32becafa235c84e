# shellcheck shell=bash
# Sourced by tools/*.sh: find_python312 prints a Python 3.12 (PYTHON312, pyenv's, or python3.12).
find_python312() {
  local c
  for c in "${PYTHON312:-}" "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python python3.12; do
    if [ -n "$c" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}
