#!/usr/bin/env bash
# Scarab beside durable Celery on this machine, same work, same clients, one session:
# N one-step runs whose step spawns /bin/true, submitted by 2 concurrent clients, timed
# from the first submission until every run has finished. Installs what it needs itself:
# Redis from Debian's packages, Celery and the Redis client from PyPI into a venv under
# target/. Usage: benches/peer/run.sh [N] [ROUNDS] (defaults 2000, 3: the systems take
# turns, each reported by its median round). Results: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-2000}
ROUNDS=${2:-3}
if ! command -v redis-server >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
fi
VENV=target/peer-venv
if [[ ! -x $VENV/bin/celery ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'celery[redis]==5.*'
fi
cargo build --release --locked -q
exec "$VENV/bin/python" benches/peer/peer.py --runs "$N" --rounds "$ROUNDS" --scarab target/release/scarab
