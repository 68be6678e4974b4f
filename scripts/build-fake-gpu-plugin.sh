#!/usr/bin/env bash
# Build batchfill-fake-gpu, the kubelet device plugin that advertises fake nvidia.com/gpu devices on the test
# bed's real nodes (source: tools/fake-gpu-plugin/, its own Go module with a committed go.sum), through the Go
# module proxy only, into the bin dir of the control plane that scripts/build-k8s.sh builds.
#
#   scripts/build-fake-gpu-plugin.sh               build if needed, print the binary's path on the last line of stdout
#   scripts/build-fake-gpu-plugin.sh --check       exit 0 when the binary is present and current, 1 otherwise (no build)
#   scripts/build-fake-gpu-plugin.sh --print-path  print the binary's path (no build)
#   scripts/build-fake-gpu-plugin.sh --force       rebuild
#
# Output (outside the repository, never committed):
#   ${BATCHFILL_K8S_CACHE:-$HOME/.cache/batchfill/k8s}/<k8s version>/bin/batchfill-fake-gpu
#   .../bin/.batchfill-fake-gpu.source     sha256 of the source files it was built from
# Unlike the control plane (rebuilt when its pinned version changes), the plugin is our own code: it is rebuilt
# whenever a file under tools/fake-gpu-plugin/ changes. A separate script rather than a section of build-k8s.sh,
# so that its --check keeps meaning "the control plane is current" and a source edit never takes that lock.
# A build takes seconds with a warm Go build cache (gRPC and the kubelet's API package, about a minute cold).
#
# Exit codes: 0 ok; 1 --check found it missing or stale; 2 build failed; 3 no usable Go toolchain.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.5}   # the bin dir's version; go.mod requires k8s.io/kubelet v0.36.5 to match
CACHE=${BATCHFILL_K8S_CACHE:-$HOME/.cache/batchfill/k8s}
OUT=$CACHE/$K8S_VERSION/bin
NAME=batchfill-fake-gpu
BIN=$OUT/$NAME
STAMP=$OUT/.$NAME.source
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools/fake-gpu-plugin" && pwd)

mode=build
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --print-path) echo "$BIN"; exit 0 ;;
  --force) mode=force ;;
  -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

PROGRESS_TAG=build-fake-gpu
# shellcheck source=scripts/lib/progress.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"

# Names and contents of every file under the source dir, in a fixed order: a rename or a new file counts too.
source_hash() {
  (cd "$SRC" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}
hash=$(source_hash)
current() { [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null || true)" = "$hash" ]; }

if [ "$mode" = check ]; then current && exit 0 || exit 1; fi
if [ "$mode" = build ] && current; then log "up to date: $BIN"; echo "$BIN"; exit 0; fi

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then PATH=/usr/local/go/bin:$PATH; fi
command -v go >/dev/null 2>&1 || { log "no Go toolchain on PATH (Go >= 1.26 is needed to build $NAME)"; exit 3; }
gov=$(go env GOVERSION 2>/dev/null || true)             # go1.26.8
gominor=$(echo "${gov#go}" | cut -d. -f2)
if [ "$(echo "${gov#go}" | cut -d. -f1)" != 1 ] || [ "${gominor:-0}" -lt 26 ] 2>/dev/null; then
  log "Go ${gov:-unknown} is too old: $NAME (k8s.io/kubelet v0.36) needs Go >= 1.26"; exit 3
fi
# -mod=readonly: the committed go.mod and go.sum are the truth; a build must never rewrite repository files.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"

mkdir -p "$OUT"
exec 9>"$OUT/.$NAME.lock"
if ! flock -n 9; then log "another build holds $OUT/.$NAME.lock; waiting"; flock 9; fi
if [ "$mode" = build ] && current; then log "up to date: $BIN"; echo "$BIN"; exit 0; fi

TMP=$(mktemp -d "$OUT/.tmp-$NAME.XXXXXX")
cleanup() { stop_heartbeat; rm -rf "$TMP"; }
trap cleanup EXIT
cd "$SRC"
if ! step "$NAME: go build" go build -trimpath -ldflags "-s -w" -o "$TMP/$NAME" .; then
  log "FAILED: go build in $SRC${LOG_HINT}"
  log "what to do: read the go output above; fix its cause (the module proxy: go env GOPROXY; Go >= 1.26) and run scripts/build-fake-gpu-plugin.sh again"
  exit 2
fi
mv -f "$TMP/$NAME" "$BIN"
echo "$hash" > "$STAMP"
log "built $BIN ($(du -k "$BIN" | cut -f1) KiB, $(go env GOVERSION))"
echo "$BIN"
