#!/usr/bin/env bash
# The long fuzzing profile: scripts/fuzz.sh [INPUTS] [SEED] (CI runs a short one in tests/cli/test_fuzz.py)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/fuzz.py "${1:-5000}" "${2:-0}"
