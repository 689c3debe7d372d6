#!/usr/bin/env bash
# Rebuilds Scarab in release mode and runs every benchmark of docs/benchmarks.md on this
# machine's disk. Pass --quick for a smoke run. Results go to stdout as a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
exec ./target/release/scarab bench --dir target/bench "$@"
