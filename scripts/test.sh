#!/usr/bin/env bash
# Fresh machine to a passing test suite: installs, builds, runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure -j1 "$@"
