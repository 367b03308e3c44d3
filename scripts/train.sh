#!/usr/bin/env bash
# Fresh machine to a trained encoder: installs what building and training need (not the tests'
# Chromium or PyTorch), builds, then trains with the default recipe (inbatch on Fashion-MNIST,
# configs/inbatch.ini). Extra arguments go to `tally train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/tally train --objective=inbatch "$@"
