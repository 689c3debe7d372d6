#!/usr/bin/env bash
# Builds the .deb with cargo-deb and checks it (issue 7's acceptance, docs/operations.md):
#   1. its contents and control files (dpkg-deb --contents / --info);
#   2. the packaged binary, unpacked with `dpkg -x` into a temporary root, against a
#      temporary state dir: --version, `config check`, serve, submit a pipeline, wait
#      for it to succeed, SIGTERM, exit code 0;
#   3. the packaged unit: `systemd-analyze verify` and
#      `systemd-analyze security --offline=true` with an exposure of at most 3.0.
# Idempotent; leaves only the packages in target/debian/. Needs a Rust toolchain, dpkg and
# systemd-analyze (installed with apt-get when missing and running as root).
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_EXPOSURE=3.0
READY_TIMEOUT=60   # seconds for /readyz to answer 200
RUN_TIMEOUT=60     # seconds for the smoke pipeline to succeed
STOP_TIMEOUT=30    # seconds for SIGTERM to end the service

log() { printf 'check-deb: %s\n' "$*" >&2; }
die() {
    printf 'check-deb: FAIL: %s\n' "$*" >&2
    exit 1
}

# The caller's SCARAB_* settings must not leak into the packaged binary under test.
while read -r name; do unset "$name"; done < <(compgen -e | grep '^SCARAB_' || true)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/scarab-check-deb.XXXXXX")
SERVER_PID=""

# Kill what this script started: the service and any step processes (and their
# `scarab supervise` parents) still working in the temporary state dir, by pid.
cleanup() {
    local rc=$?
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    local proc pid
    for proc in /proc/[0-9]*; do
        pid=${proc#/proc/}
        [[ "$pid" == "$$" ]] && continue
        if [[ "$(readlink "$proc/cwd" 2>/dev/null)" == "$WORK"/* ]] ||
            tr '\0' ' ' <"$proc/cmdline" 2>/dev/null | grep -qF "$WORK/"; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need() { command -v "$1" >/dev/null 2>&1 || die "$1 is required ($2)"; }
need cargo "a Rust toolchain"
need dpkg-deb "Debian's dpkg"
need dpkg "Debian's dpkg"

# ---------------------------------------------------------------------------- build
if ! cargo deb --version >/dev/null 2>&1; then
    log "cargo-deb is missing: cargo install cargo-deb --locked"
    cargo install cargo-deb --locked --version '^3'
fi
log "building the package (cargo deb: a release build)"
cargo deb --locked -o target/debian/ >"$WORK/cargo-deb.out"
# cargo-deb prints the path of each package it wrote (the .deb, and the -dbgsym .ddeb).
DEB=$(grep '/scarab_[^/]*\.deb$' "$WORK/cargo-deb.out" | tail -n 1 || true)
[[ -f "$DEB" ]] || die "cargo deb did not name a .deb (output: $(cat "$WORK/cargo-deb.out"))"
log "package: $DEB"

# ------------------------------------------------------------------------- contents
dpkg-deb --contents "$DEB" >"$WORK/contents"
dpkg-deb --info "$DEB" >"$WORK/info"

# A path in the package with the given mode (ls -l style, e.g. -rwxr-xr-x).
has_file() {
    awk -v path="./$1" -v mode="$2" '$1 == mode && $6 == path { found = 1 } END { exit !found }' \
        "$WORK/contents" || die "the package lacks $1 with mode $2 (dpkg-deb --contents):
$(cat "$WORK/contents")"
}
has_file usr/bin/scarab -rwxr-xr-x
size=$(awk '$6 == "./usr/bin/scarab" { print $3 }' "$WORK/contents")
((size < 60 * 1024 * 1024)) || die "usr/bin/scarab is $size bytes: not stripped?"
has_file etc/scarab/scarab.toml -rw-r-----
has_file usr/share/doc/scarab/README.md -rw-r--r--
has_file usr/share/doc/scarab/operations.md -rw-r--r--
has_file usr/share/doc/scarab/examples/release.yaml -rw-r--r--
has_file usr/share/bash-completion/completions/scarab -rw-r--r--
has_file usr/share/zsh/vendor-completions/_scarab -rw-r--r--
has_file usr/share/fish/vendor_completions.d/scarab.fish -rw-r--r--
has_file usr/share/man/man1/scarab.1.gz -rw-r--r--  # cargo-deb compresses man pages
UNIT_PATH=$(awk '$6 ~ /^\.\/(usr\/)?lib\/systemd\/system\/scarab\.service$/ { print substr($6, 3) }' "$WORK/contents")
[[ -n "$UNIT_PATH" ]] || die "the package lacks the unit scarab.service"
has_file "$UNIT_PATH" -rw-r--r--

for script in postinst prerm postrm conffiles; do
    grep -qE "^ +[0-9]+ bytes, +[0-9]+ lines +\*? *$script( |$)" "$WORK/info" ||
        die "the package lacks the control file $script:
$(cat "$WORK/info")"
done
grep -q '^ Depends:.*adduser' "$WORK/info" || die "Depends does not name adduser"
# The binary's relocations are packed (build.rs), which glibc reads since 2.36.
grep -qE '^ Depends:.*libc6 \(>= 2\.(3[6-9]|[4-9][0-9])' "$WORK/info" ||
    die "Depends does not require the glibc that reads packed relocations (>= 2.36): $(grep '^ Depends:' "$WORK/info")"

mkdir "$WORK/control"
dpkg-deb --control "$DEB" "$WORK/control"
[[ "$(grep -cx '/etc/scarab/scarab.toml' "$WORK/control/conffiles")" == 1 ]] ||
    die "conffiles must list /etc/scarab/scarab.toml once: $(cat "$WORK/control/conffiles")"
for script in postinst prerm postrm; do
    sh -n "$WORK/control/$script" || die "$script is not valid sh"
    ! grep -q '#DEBHELPER#' "$WORK/control/$script" || die "$script still holds #DEBHELPER#"
done
grep -q 'adduser --system' "$WORK/control/postinst" || die "postinst does not create the user"
grep -q 'deb-systemd-helper enable' "$WORK/control/postinst" || die "postinst does not enable the unit"
grep -q 'deb-systemd-invoke' "$WORK/control/postinst" || die "postinst does not start the unit"
grep -q 'deb-systemd-invoke stop' "$WORK/control/prerm" || die "prerm does not stop the unit"
grep -q 'rm -rf /var/lib/scarab' "$WORK/control/postrm" || die "postrm does not purge the state"
log "contents and control files: ok"

# ------------------------------------------------------------------ unpacked binary
ROOT="$WORK/root"
dpkg -x "$DEB" "$ROOT"
BIN="$ROOT/usr/bin/scarab"
cmp -s "$ROOT/etc/scarab/scarab.toml" packaging/scarab.toml || die "the packaged conffile differs from packaging/scarab.toml"
cmp -s "$ROOT/$UNIT_PATH" systemd/scarab.service || die "the packaged unit differs from systemd/scarab.service"

VERSION=$(dpkg-deb --field "$DEB" Version)
"$BIN" --version >"$WORK/version" || die "scarab --version failed"
grep -qF "${VERSION%-*}" "$WORK/version" || die "scarab --version ($(cat "$WORK/version")) is not ${VERSION%-*}"
log "scarab --version: $(cat "$WORK/version")"

CONFIG_ARGS=()
if "$BIN" config check --help >/dev/null 2>&1; then
    "$BIN" config check "$ROOT/etc/scarab/scarab.toml" || die "the packaged config does not pass scarab config check"
    # Every commented setting, uncommented, must be valid too: the file documents them.
    # Left out: the alternatives that name files which do not exist here (a token's
    # `file`, which excludes its `sha256`; `kubeconfig`, which excludes `in_cluster`), and
    # the secrets `dir`, which must exist.
    sed -E 's/^#([a-z_0-9]+ = )/\1/; s/^#(\[\[(webhooks|tokens|locks)\]\])$/\1/' \
        "$ROOT/etc/scarab/scarab.toml" | grep -Ev '^(file|kubeconfig|dir|tls_cert|tls_key|ca_cert) = ' >"$WORK/all-settings.toml"
    "$BIN" config check "$WORK/all-settings.toml" ||
        die "the packaged config with every setting uncommented does not pass scarab config check"
    printf 'listen = "127.0.0.1:7300"\nno_such_key = 1\n' >"$WORK/bad.toml"
    rc=0
    "$BIN" config check "$WORK/bad.toml" >"$WORK/bad.out" 2>&1 || rc=$?
    [[ "$rc" == 2 ]] || die "scarab config check of an invalid file exited $rc, not 2"
    grep -q 'no_such_key' "$WORK/bad.out" || die "scarab config check did not name the bad key: $(cat "$WORK/bad.out")"
    CONFIG_ARGS=(--config "$ROOT/etc/scarab/scarab.toml")
    log "scarab config check: ok"
else
    log "scarab config check is not available in this binary: skipped"
fi

# An HTTP status code from 127.0.0.1:$PORT, with bash's /dev/tcp (no curl needed).
http_status() {
    (
        exec 3<>"/dev/tcp/127.0.0.1/$PORT" || exit 1
        printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$1" >&3
        IFS=' ' read -r -t 5 _ status _ <&3 || exit 1
        printf '%s\n' "$status"
    ) 2>/dev/null
}

PORT=""
for _ in $(seq 1 50); do
    candidate=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
        PORT=$candidate
        break
    fi
done
[[ -n "$PORT" ]] || die "no free port found"

STATE="$WORK/state"
"$BIN" serve "${CONFIG_ARGS[@]}" --state-dir "$STATE" --listen "127.0.0.1:$PORT" \
    >"$WORK/serve.log" 2>&1 &
SERVER_PID=$!
server_log() { sed 's/^/  serve: /' "$WORK/serve.log" >&2; }

deadline=$((SECONDS + READY_TIMEOUT))
until [[ "$(http_status /readyz || true)" == 200 ]]; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        server_log
        die "scarab serve exited before it was ready"
    fi
    if ((SECONDS >= deadline)); then
        server_log
        die "/readyz did not answer 200 within ${READY_TIMEOUT}s"
    fi
    sleep 0.2
done
log "scarab serve is ready on 127.0.0.1:$PORT"

[[ "$(stat -c %a "$STATE/admin.token")" == 600 ]] || die "admin.token is not mode 0600"

CLIENT=(--url "http://127.0.0.1:$PORT" --state-dir "$STATE")
cat >"$WORK/smoke.yaml" <<'EOF'
name: deb-smoke
steps:
  - name: hello
    run: ["sh", "-c", "echo hello from the packaged scarab"]
EOF
RUN=$("$BIN" submit "$WORK/smoke.yaml" -q "${CLIENT[@]}") || {
    server_log
    die "scarab submit failed"
}
log "submitted run $RUN"

deadline=$((SECONDS + RUN_TIMEOUT))
while :; do
    "$BIN" show "$RUN" -o json "${CLIENT[@]}" >"$WORK/show.json" || die "scarab show failed"
    state=$(sed -n 's/^  "state": "\([a-z_]*\)".*/\1/p' "$WORK/show.json")
    case "$state" in
        succeeded) break ;;
        failed | dead_lettered | cancelled | quarantined)
            cat "$WORK/show.json" >&2
            die "the smoke run ended $state"
            ;;
    esac
    if ((SECONDS >= deadline)); then
        cat "$WORK/show.json" >&2
        die "the smoke run did not succeed within ${RUN_TIMEOUT}s (state: ${state:-unknown})"
    fi
    sleep 0.2
done
log "run $RUN succeeded"

kill -TERM "$SERVER_PID"
deadline=$((SECONDS + STOP_TIMEOUT))
while kill -0 "$SERVER_PID" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
        server_log
        die "scarab serve did not exit within ${STOP_TIMEOUT}s of SIGTERM"
    fi
    sleep 0.2
done
rc=0
wait "$SERVER_PID" || rc=$?
SERVER_PID=""
if [[ "$rc" != 0 ]]; then
    server_log
    die "scarab serve exited $rc after SIGTERM, not 0"
fi
log "SIGTERM: exit 0"

# ----------------------------------------------------------------------------- unit
if ! command -v systemd-analyze >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "systemd-analyze is missing: apt-get install systemd"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
    else
        die "systemd-analyze is missing: install the systemd package (apt-get install systemd) or run this as root"
    fi
fi

# verify checks that ExecStart's program exists: check a copy of the packaged unit whose
# ExecStart names the unpacked binary. Any warning fails the check.
mkdir "$WORK/verify"
sed "s#^ExecStart=/usr/bin/scarab #ExecStart=$BIN #" "$ROOT/$UNIT_PATH" >"$WORK/verify/scarab.service"
grep -q "^ExecStart=$BIN " "$WORK/verify/scarab.service" || die "the unit's ExecStart is not /usr/bin/scarab"
rc=0
systemd-analyze verify "$WORK/verify/scarab.service" >"$WORK/verify.out" 2>&1 || rc=$?
if [[ "$rc" != 0 || -s "$WORK/verify.out" ]]; then
    cat "$WORK/verify.out" >&2
    die "systemd-analyze verify failed (exit $rc)"
fi
log "systemd-analyze verify: ok"

systemd-analyze security --offline=true "$ROOT/$UNIT_PATH" >"$WORK/security.out" 2>&1 || {
    cat "$WORK/security.out" >&2
    die "systemd-analyze security failed"
}
exposure=$(sed -n 's/.*Overall exposure level for scarab\.service: \([0-9.]*\).*/\1/p' "$WORK/security.out")
[[ -n "$exposure" ]] || {
    cat "$WORK/security.out" >&2
    die "no overall exposure level in the output of systemd-analyze security"
}
if awk -v e="$exposure" -v max="$MAX_EXPOSURE" 'BEGIN { exit !(e > max) }'; then
    grep '✗' "$WORK/security.out" >&2 || true
    die "exposure level $exposure is above $MAX_EXPOSURE"
fi
log "systemd-analyze security --offline=true: exposure $exposure (at most $MAX_EXPOSURE)"
log "ok: $DEB"
