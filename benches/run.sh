#!/usr/bin/env bash
# Rebuilds Scarab in release mode and runs every benchmark of docs/benchmarks.md on this
# machine's disk. Pass --quick for a smoke run. Results go to stdout as a Markdown table.
# The scratch directory is $SCARAB_BENCH_DIR, else /var/tmp/scarab-bench: on the disk, as
# /var/lib/scarab is, and outside target/, which on the machine of docs/benchmarks.md sits
# in block groups so full that every file created there costs ten times as much.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
exec ./target/release/scarab bench --dir "${SCARAB_BENCH_DIR:-/var/tmp/scarab-bench}" "$@"
