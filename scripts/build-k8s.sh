#!/usr/bin/env bash
# Build the local Kubernetes control plane of the cluster tests and the demo from Go modules, through the Go
# module proxy only (no GitHub releases, no container images): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl and kwok. Why from source: the control plane then needs no Docker, no kind image and
# no release download, only a Go toolchain and the proxy, and each binary is exactly the pinned version
# (the versions below; kwok's fake nodes carry the nvidia.com/gpu capacity the tests schedule against).
#
#   scripts/build-k8s.sh               build what is missing, print the bin dir on the last line of stdout
#   scripts/build-k8s.sh --check       exit 0 when every binary is present and current, 1 otherwise (no build)
#   scripts/build-k8s.sh --print-dir   print the bin dir (no build)
#   scripts/build-k8s.sh --force       rebuild everything
#   BATCHFILL_BUILD_KUBELET=1 ...      also the kubelet (real nodes: `dev-cluster up --real-nodes N`); it is
#                                      built from the same wrapper module, 40-95 s with a warm Go build cache
#
# Output (outside the repository, survives between runs on one machine, never committed):
#   ${BATCHFILL_K8S_CACHE:-$HOME/.cache/batchfill/k8s}/<k8s version>/bin/{etcd,kube-*,kubectl,kwok[,kubelet]}
#   .../<k8s version>/kwok-stages/          kwok's Stage YAMLs (node/fast, node/heartbeat-with-lease, pod/fast, ...)
#   .../<k8s version>/build-info.env        versions, stage dir, per-component build time
#   .../<k8s version>/build/{k8s,etcd}/     the generated wrapper modules (go.mod/go.sum are generated here)
# A binary is rebuilt only when it is missing or was built for another version (bin/.<name>.version).
#
# kube-apiserver & co. cannot be built with `go install k8s.io/kubernetes/cmd/...@v1.x`: k8s.io/kubernetes'
# go.mod requires its staging modules at v0.0.0 and replaces them with ./staging/src/... . A wrapper module
# whose own go.mod replaces each staging module with the published v0.Y.Z does build; the staging list is read
# from the proxied go.mod of the chosen version, so it is right for any minor. etcd gets its own wrapper module
# (its server module has replace directives too), so its dependency versions stay apart from Kubernetes'.
#
# Exit codes: 0 ok; 1 --check found something missing; 2 build failed; 3 no usable Go toolchain.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.5}     # k8s.io/kubernetes (newest 1.36 patch the proxy serves, 2026-11)
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}   # go.etcd.io/etcd/server/v3
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}    # sigs.k8s.io/kwok (built against k8s.io/* v0.36.1)
CACHE=${BATCHFILL_K8S_CACHE:-$HOME/.cache/batchfill/k8s}
ROOT=$CACHE/$K8S_VERSION
OUT=$ROOT/bin
WORK=$ROOT/build
STAGES=$ROOT/kwok-stages
K8S_BINS="kube-apiserver kube-controller-manager kube-scheduler kubectl"
WITH_KUBELET=${BATCHFILL_BUILD_KUBELET:-0}

mode=build
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --print-dir) echo "$OUT"; exit 0 ;;
  --force) mode=force ;;
  -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

PROGRESS_TAG=build-k8s
# shellcheck source=scripts/lib/progress.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"

# --- what is missing ---------------------------------------------------------------------------------------
current() {  # name version -> 0 when bin/name exists and was built for version
  [ -x "$OUT/$1" ] && [ "$(cat "$OUT/.$1.version" 2>/dev/null || true)" = "$2" ]
}
need_k8s=0; need_etcd=0; need_kwok=0; need_kubelet=0
for b in $K8S_BINS; do current "$b" "$K8S_VERSION" || need_k8s=1; done
current etcd "$ETCD_VERSION" || need_etcd=1
current kwok "$KWOK_VERSION" || need_kwok=1
[ -f "$STAGES/node/fast/node-initialize.yaml" ] && [ -f "$STAGES/pod/fast/pod-ready.yaml" ] || need_kwok=1
[ "$WITH_KUBELET" = 1 ] && ! current kubelet "$K8S_VERSION" && need_kubelet=1
if [ "$mode" = force ]; then need_k8s=1; need_etcd=1; need_kwok=1; need_kubelet=$WITH_KUBELET; fi

if [ "$mode" = check ]; then
  [ $((need_k8s + need_etcd + need_kwok + need_kubelet)) -eq 0 ] && exit 0 || exit 1
fi
if [ $((need_k8s + need_etcd + need_kwok + need_kubelet)) -eq 0 ]; then
  log "up to date: $OUT"; echo "$OUT"; exit 0
fi

# --- Go toolchain --------------------------------------------------------------------------------------------
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then PATH=/usr/local/go/bin:$PATH; fi
if ! command -v go >/dev/null 2>&1; then
  log "no Go toolchain on PATH (Go >= 1.26 is needed to build Kubernetes ${K8S_VERSION})"; exit 3
fi
gov=$(go env GOVERSION 2>/dev/null || true)             # go1.26.8
gominor=$(echo "${gov#go}" | cut -d. -f2)
if [ "$(echo "${gov#go}" | cut -d. -f1)" != 1 ] || [ "${gominor:-0}" -lt 26 ] 2>/dev/null; then
  log "Go ${gov:-unknown} is too old: Kubernetes ${K8S_VERSION} needs Go >= 1.26"; exit 3
fi
# Fail fast instead of downloading another toolchain; static binaries; let `go build` fill go.sum.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"

mkdir -p "$OUT" "$WORK/k8s" "$WORK/etcd"
# One build at a time per version directory (parallel test sessions, CI and a developer's shell).
exec 9>"$ROOT/.build.lock"
if ! flock -n 9; then log "another build holds $ROOT/.build.lock; waiting"; flock 9; fi
# Re-check after waiting: the other build may have produced everything.
if [ "$mode" != force ]; then
  need_k8s=0; need_etcd=0; need_kwok=0; need_kubelet=0
  for b in $K8S_BINS; do current "$b" "$K8S_VERSION" || need_k8s=1; done
  current etcd "$ETCD_VERSION" || need_etcd=1
  current kwok "$KWOK_VERSION" || need_kwok=1
  [ -f "$STAGES/node/fast/node-initialize.yaml" ] && [ -f "$STAGES/pod/fast/pod-ready.yaml" ] || need_kwok=1
  [ "$WITH_KUBELET" = 1 ] && ! current kubelet "$K8S_VERSION" && need_kubelet=1
fi

TMP=$(mktemp -d "$ROOT/.tmp-bin.XXXXXX")
cleanup() { stop_heartbeat; rm -rf "$TMP"; }
trap cleanup EXIT
fail() {
  log "FAILED: $*"
  log "what to do: read the go output above${LOG_HINT#, }; fix its cause (disk space: df -h ~/.cache; the module proxy: go env GOPROXY; Go >= 1.26) and run scripts/build-k8s.sh again: finished components and Go's caches are kept"
  exit 2
}
gomod_path() {  # module@version -> path of its go.mod in the module cache (downloads .mod only)
  go list -m -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p'
}
install_bins() {  # version names... : move freshly built binaries into place, then stamp them
  local v=$1; shift
  for b in "$@"; do
    mv -f "$TMP/$b" "$OUT/$b"
    echo "$v" > "$OUT/.$b.version"
  done
}
timing=""

# --- Kubernetes components (wrapper module local.test/k8sbin) -------------------------------------------------
wrapper_module() {  # (re)generate $WORK/k8s/go.mod for k8s.io/kubernetes@$K8S_VERSION
  log "Kubernetes ${K8S_VERSION}: generating the wrapper module in $WORK/k8s"
  cd "$WORK/k8s"
  rm -f go.mod go.sum
  gover=$(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/')
  printf 'module local.test/k8sbin\n\ngo %s.0\n' "$gover" > go.mod
  kmod=$(gomod_path "k8s.io/kubernetes@${K8S_VERSION}") || fail "k8s.io/kubernetes@${K8S_VERSION} not on the proxy"
  [ -f "$kmod" ] || fail "no go.mod for k8s.io/kubernetes@${K8S_VERSION}"
  staging="v0.${K8S_VERSION#v1.}"                        # v1.36.5 -> v0.36.5
  n=0
  for m in $(sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*|\1|p' "$kmod"); do
    go mod edit "-replace=${m}=${m}@${staging}"; n=$((n + 1))
  done
  [ $n -gt 0 ] || fail "found no staging replace directives in $kmod"
  # Keep Kubernetes' own GODEBUG defaults (`godebug k=v` lines and `godebug ( ... )` blocks).
  # sed, not grep: a go.mod without such lines must not fail the pipeline under pipefail.
  { sed -n 's/^godebug \([^(].*\)/\1/p' "$kmod"
    sed -n '/^godebug (/,/^)/p' "$kmod" | sed '1d;$d'; } | while read -r kv _; do
    [ -n "$kv" ] && go mod edit "-godebug=${kv}"
  done
  log "replaced $n staging modules with ${staging}"
}
k8s_ldflags() {  # what hack/lib/version.sh stamps
  local minor vp ld="-s -w"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  for vp in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $vp.gitVersion=$K8S_VERSION -X $vp.gitMajor=1 -X $vp.gitMinor=$minor"
    ld="$ld -X $vp.gitTreeState=clean -X $vp.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  done
  echo "$ld"
}
k8s_build() {  # label binaries... : go get + go build k8s.io/kubernetes/cmd/<binary> in the wrapper module
  local label=$1 pkgs="" b; shift
  for b in "$@"; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
  cd "$WORK/k8s"
  # shellcheck disable=SC2086
  step "Kubernetes ${K8S_VERSION}: go get ($label)" go get $(for p in $pkgs; do printf '%s@%s ' "$p" "$K8S_VERSION"; done) \
    || fail "go get k8s.io/kubernetes ($label)"
  # shellcheck disable=SC2086
  step "Kubernetes ${K8S_VERSION}: go build $*" go build -trimpath -ldflags "$(k8s_ldflags)" -o "$TMP/" $pkgs \
    || fail "go build $*"
  install_bins "$K8S_VERSION" "$@"
}
if [ $need_k8s = 1 ]; then
  t0=$(date +%s)
  wrapper_module
  log "go build $K8S_BINS (cold: 8-11 min on 2 cores, ~25 s with a warm Go build cache)"
  # shellcheck disable=SC2086
  k8s_build control-plane $K8S_BINS
  timing="$timing k8s=$(( $(date +%s) - t0 ))s"
fi

# --- kubelet (only with BATCHFILL_BUILD_KUBELET=1; the same wrapper module) ------------------------------------
if [ $need_kubelet = 1 ]; then
  t0=$(date +%s)
  grep -q "^replace k8s.io/api => k8s.io/api v0.${K8S_VERSION#v1.}$" "$WORK/k8s/go.mod" 2>/dev/null || wrapper_module
  log "go build kubelet (~40-95 s with a warm Go build cache; cold: minutes more on top of the control plane's build)"
  k8s_build kubelet kubelet
  timing="$timing kubelet=$(( $(date +%s) - t0 ))s"
fi

# --- etcd (wrapper module local.test/etcdbin) -------------------------------------------------------------------
if [ $need_etcd = 1 ]; then
  t0=$(date +%s)
  log "etcd ${ETCD_VERSION}"
  cd "$WORK/etcd"
  rm -f go.mod go.sum
  gover=$(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/')
  printf 'module local.test/etcdbin\n\ngo %s.0\n' "$gover" > go.mod
  step "etcd ${ETCD_VERSION}: go get" go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" || fail "go get etcd"
  step "etcd ${ETCD_VERSION}: go build" go build -trimpath -ldflags "-s -w" -o "$TMP/etcd" go.etcd.io/etcd/server/v3 \
    || fail "go build etcd"
  install_bins "$ETCD_VERSION" etcd
  timing="$timing etcd=$(( $(date +%s) - t0 ))s"
fi

# --- kwok (its go.mod has no replace directives: plain go install) + its Stage YAMLs -----------------------------
if [ $need_kwok = 1 ]; then
  t0=$(date +%s)
  log "kwok ${KWOK_VERSION}"
  step "kwok ${KWOK_VERSION}: go install" env GOFLAGS=-buildvcs=false GOBIN="$TMP" \
    go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" || fail "go install kwok"
  install_bins "$KWOK_VERSION" kwok
  # The stages ship in the module zip; copy them out of the (read-only, cleanable) module cache.
  src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@${KWOK_VERSION}/kustomize/stage"
  [ -f "$src/node/fast/node-initialize.yaml" ] || fail "kwok stages not found at $src"
  rm -rf "$STAGES.tmp"; cp -r "$src" "$STAGES.tmp"; chmod -R u+w "$STAGES.tmp"
  rm -rf "$STAGES"; mv "$STAGES.tmp" "$STAGES"
  timing="$timing kwok=$(( $(date +%s) - t0 ))s"
fi

{
  echo "K8S_VERSION=$K8S_VERSION"
  echo "ETCD_VERSION=$ETCD_VERSION"
  echo "KWOK_VERSION=$KWOK_VERSION"
  echo "BIN_DIR=$OUT"
  echo "KWOK_STAGES=$STAGES"
  echo "GO_VERSION=$(go env GOVERSION)"
  echo "LAST_BUILD=\"$(date -u +%Y-%m-%dT%H:%M:%SZ)${timing}\""
} > "$ROOT/build-info.env"
log "built:${timing:- nothing}"
# No `| head` here: under pipefail a reader that closes the pipe first kills the writer with SIGPIPE (exit 141)
# after a good build. Capture whole, print the first line.
v=$("$OUT/kube-apiserver" --version 2>&1) || fail "the built kube-apiserver does not run: $v"
log "${v%%$'\n'*}"
v=$("$OUT/etcd" --version 2>&1) || fail "the built etcd does not run: $v"
log "${v%%$'\n'*}"
echo "$OUT"
