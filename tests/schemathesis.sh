#!/usr/bin/env bash
# Fuzzes a live `scarab serve` against schema/openapi.yaml with schemathesis, every check
# on (`--checks all`), fixed seed, bounded examples. Builds nothing: $1 is the scarab
# binary (default target/debug/scarab). SEED and MAX_EXAMPLES may be set in the
# environment. Exits non-zero on any failure. Per-operation settings: schemathesis.toml.
set -euo pipefail
# A relative binary path is taken from where the script is called, else from the repo root.
binary=${1:-}
if [[ -n $binary && -e $binary ]]; then
  binary=$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")
fi
cd "$(dirname "$0")/.."
binary=${binary:-target/debug/scarab}
seed=${SEED:-1}
max_examples=${MAX_EXAMPLES:-50}

if [[ ! -x $binary ]]; then
  echo "schemathesis.sh: no scarab binary at $binary (build it first)" >&2
  exit 2
fi
# `st`, or the same CLI as a module when pip put the script outside PATH (--user).
if command -v st >/dev/null 2>&1; then
  st=(st)
else
  python3 -m pip install --quiet schemathesis
  if command -v st >/dev/null 2>&1; then
    st=(st)
  else
    st=(python3 -m schemathesis.cli)
  fi
fi

state=$(mktemp -d)
server=
cleanup() {
  if [[ -n $server ]]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$state"
}
trap cleanup EXIT

# A free loopback port: bind port 0, note what the kernel gave, let it go.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
"$binary" serve --state-dir "$state/state" --listen "127.0.0.1:$port" 2>"$state/serve.log" &
server=$!

ready=
for _ in $(seq 1 100); do
  if [[ -s $state/state/admin.token ]] &&
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
      "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then
    ready=yes
    break
  fi
  if ! kill -0 "$server" 2>/dev/null; then
    echo "schemathesis.sh: scarab serve exited early:" >&2
    cat "$state/serve.log" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z $ready ]]; then
  echo "schemathesis.sh: scarab serve did not become ready in 10 s:" >&2
  cat "$state/serve.log" >&2
  exit 1
fi
token=$(cat "$state/state/admin.token")

status=0
"${st[@]}" run schema/openapi.yaml \
  --url "http://127.0.0.1:$port" \
  -H "Authorization: Bearer $token" \
  --checks all \
  --seed "$seed" \
  --max-examples "$max_examples" \
  --no-color || status=$?

if ! kill -0 "$server" 2>/dev/null; then
  echo "schemathesis.sh: scarab serve died during the run:" >&2
  tail -n 50 "$state/serve.log" >&2
  status=1
fi
exit "$status"
