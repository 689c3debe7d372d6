#!/usr/bin/env bash
# The long form of the kill -9 torture (docs/benchmarks.md#the-kill--9-torture): 100
# SIGKILLs of a service under a steady load of two-step runs, then every acknowledged run
# must have succeeded with each step run exactly once. The suite runs the short form (10
# cycles). Pass a cycle count to change it; SCARAB_TORTURE_SEED=N replays a seed.
set -euo pipefail
cd "$(dirname "$0")/.."
export SCARAB_TORTURE_CYCLES="${1:-100}"
exec cargo test --locked --test it torture -- --nocapture
