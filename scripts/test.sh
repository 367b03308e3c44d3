#!/usr/bin/env bash
# Fresh machine to a passing test suite: installs (with what only tests need: Chromium, PyTorch),
# builds, runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --for-tests
cd build
ctest --output-on-failure -j1 "$@"
