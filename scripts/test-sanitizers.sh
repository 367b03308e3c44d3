#!/usr/bin/env bash
# The test suite again under AddressSanitizer and UndefinedBehaviorSanitizer (a Debug build in
# build-sanitize/). The PyTorch round trips (torchvision's too) and the multi-host test are left
# out: they check the same binary's results through other programs and take minutes more under
# the sanitizers; so is the benchmark's path (test_bench_quick), which measures a Release build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --for-tests
cmake -S . -B build-sanitize -DTALLY_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug > /dev/null
cmake --build build-sanitize -j"$(nproc)"
cd build-sanitize
ctest --output-on-failure -j1 -E "test_torch_roundtrip|test_torch_photos|test_torchvision_resnet|test_torchvision_convnext|test_multihost|test_bench_quick" "$@"
