#!/usr/bin/env bash
# Build helm (v3) from its Go module through the Go module proxy, for the install-path tests
# (tests/unit/test_install_paths.py renders and lints charts/batchfill with it). Idempotent: builds only when
# the binary is missing or was built for another version.
#
#   scripts/build-helm.sh               build if needed, print the binary's path on the last line of stdout
#   scripts/build-helm.sh --check       exit 0 when the binary is present and current, 1 otherwise (no build)
#   scripts/build-helm.sh --print-path  print the binary's path (no build)
#   scripts/build-helm.sh --force       rebuild
#
# Output (outside the repository, never committed):
#   ${BATCHFILL_K8S_CACHE:-$HOME/.cache/batchfill/k8s}/tools/bin/helm   (+ .helm.version stamp)
#
# helm.sh/helm/v3's go.mod has no replace or exclude directives, so plain `go install pkg@version` works (unlike
# k8s.io/kubernetes, see scripts/build-k8s.sh). The version is stamped with the ldflags of helm's Makefile, so
# `helm version` reports it. Cold build: a few minutes on 2 cores.
#
# Exit codes: 0 ok; 1 --check found it missing; 2 build failed; 3 no usable Go toolchain.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}   # newest helm v3 on the proxy (2026-11)
CACHE=${BATCHFILL_K8S_CACHE:-$HOME/.cache/batchfill/k8s}
OUT=$CACHE/tools/bin
HELM=$OUT/helm

mode=build
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --print-path) echo "$HELM"; exit 0 ;;
  --force) mode=force ;;
  -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

PROGRESS_TAG=build-helm
# shellcheck source=scripts/lib/progress.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"
current() { [ -x "$HELM" ] && [ "$(cat "$OUT/.helm.version" 2>/dev/null || true)" = "$HELM_VERSION" ]; }

if [ "$mode" = check ]; then current && exit 0 || exit 1; fi
if [ "$mode" = build ] && current; then log "up to date: $HELM ($HELM_VERSION)"; echo "$HELM"; exit 0; fi

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then PATH=/usr/local/go/bin:$PATH; fi
command -v go >/dev/null 2>&1 || { log "no Go toolchain on PATH (helm ${HELM_VERSION} needs Go >= 1.26)"; exit 3; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

mkdir -p "$OUT"
exec 9>"$OUT/.helm.lock"
if ! flock -n 9; then log "another build holds $OUT/.helm.lock; waiting"; flock 9; fi
if [ "$mode" = build ] && current; then log "up to date: $HELM ($HELM_VERSION)"; echo "$HELM"; exit 0; fi

TMP=$(mktemp -d "$OUT/.tmp-helm.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
t0=$(date +%s)
# The ldflags of helm's Makefile: the version, and the default Kubernetes version of `helm template`/`helm lint`
# (.Capabilities.KubeVersion), which helm derives from its k8s.io/client-go v0.Y -> 1.Y; unstamped it is v1.20,
# which a chart's kubeVersion constraint rejects.
gomod=$(go mod download -json "helm.sh/helm/v3@${HELM_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[ -f "$gomod" ] || { log "FAILED: helm.sh/helm/v3@${HELM_VERSION} not on the module proxy"; exit 2; }
# sed's own `q`, not `| head -1`: under pipefail a closed pipe would kill sed with SIGPIPE (exit 141).
kminor=$(sed -n 's|^[[:space:]]*k8s\.io/client-go v0\.\([0-9]*\)\..*|\1|p;T;q' "$gomod")
[ -n "$kminor" ] || { log "FAILED: no k8s.io/client-go requirement in $gomod"; exit 2; }
ld="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for p in pkg/lint/rules pkg/chartutil; do
  ld="$ld -X helm.sh/helm/v3/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/$p.k8sVersionMinor=$kminor"
done
trap 'stop_heartbeat; rm -rf "$TMP"' EXIT
step "helm ${HELM_VERSION}: go install" env GOBIN="$TMP" \
  go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" \
  || { log "FAILED: go install helm; fix the cause above and run scripts/build-helm.sh again (Go's caches are kept)"; exit 2; }
mv -f "$TMP/helm" "$HELM"
echo "$HELM_VERSION" > "$OUT/.helm.version"
v=$("$HELM" version --short 2>&1) || { log "FAILED: the built helm does not run: $v"; exit 2; }
log "built in $(( $(date +%s) - t0 ))s: $v"
echo "$HELM"
