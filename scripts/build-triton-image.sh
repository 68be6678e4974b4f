#!/usr/bin/env bash
# Build the Triton image a real node of the test bed runs, without Docker and without a registry:
#   batchfill.local/tritonserver:<tag>  tritonserver 2.51 from the nvidia-pytriton wheel, its Python-backend stub,
#   onnxruntime, numpy and the OCR example's weights, on a Debian bookworm minbase root filesystem
# as a docker-archive tar (`ctr images import` takes it), cached outside the repository and named by a hash of its
# inputs, so it is rebuilt only when one of them changes. (The nodes' pause image is busybox, built in Python:
# operator/batchfill/testbed/node/images.py.)
#
#   scripts/build-triton-image.sh [triton]              build if missing; print the archive path last on stdout
#   scripts/build-triton-image.sh [triton] --check      exit 0 when the archive exists, 1 otherwise (no build)
#   scripts/build-triton-image.sh [triton] --print-path print the archive path (no build)
#   scripts/build-triton-image.sh [triton] --print-ref  print the image reference (no build)
#   scripts/build-triton-image.sh [triton] --force      rebuild
#
# Output (outside the repository; never committed):
#   ${BATCHFILL_IMAGE_CACHE:-$HOME/.cache/batchfill/images}/tritonserver-<hash>.tar
#   .../wheels/   the wheels pip downloaded (a warm rebuild installs from here, --no-index)
#   .../<name>-<hash>.build.log   the build's output when batchfill.testbed.images runs it (by hand: stderr)
# Archives of older inputs stay until removed by hand (rm ~/.cache/batchfill/images/tritonserver-*.tar): two
# checkouts with different versions of this script then do not rebuild over each other.
# <hash>: the first 16 hex digits of sha256 over this script's text and every value below that the environment
# may override (suite, Debian packages, wheel pins). The Debian mirror is not an
# input: every mirror serves the same suite.
#
# How: `debootstrap --variant=minbase` (from the mirror apt uses, read from /etc/apt/sources.list{,.d}) into the
# rootfs of an umoci bundle; the wheels installed with pip --target (no pip in the image); the wheel's
# tritonserver moved to /opt/tritonserver (Triton's default --backend-directory and --cache-directory are under
# it, so the rendered args need no extra flag), the Python backend and the 3.11 stub side by side in
# backends/python (the backend starts the stub from its own directory); /usr/local/bin/tritonserver sets
# LD_LIBRARY_PATH to the wheel's bundled libraries (the moved binaries lose their $ORIGIN rpath) and execs it.
# Entrypoint `tini --`: signals reach tritonserver and the Python-backend stubs it leaves are reaped. User 1000
# (triton-server), as in NGC's images. Then `umoci repack` and `skopeo copy oci:... docker-archive:...`.
#
# Exit codes: 0 ok; 1 --check: archive missing; 2 build failed; 3 a needed tool is missing (the message names the
# Debian package); 4 not root (debootstrap and the bundle's file ownership need it).
set -euo pipefail

SUITE=${BATCHFILL_IMAGE_SUITE:-bookworm}
DEB_PACKAGES=${BATCHFILL_IMAGE_DEB_PACKAGES:-python3.11 python3-minimal libpython3.11 tini libstdc++6 libgcc-s1 zlib1g libexpat1}
NUMPY_VERSION=${BATCHFILL_IMAGE_NUMPY:-1.26.4}       # nvidia-pytriton 0.7.0 requires numpy<2
ONNXRUNTIME_VERSION=${BATCHFILL_IMAGE_ONNXRUNTIME:-1.32.0}
# onnxruntime's own requirements (installed --no-deps, pinned, so the hash names them) and the OCR weights
EXTRA_WHEELS=${BATCHFILL_IMAGE_EXTRA_WHEELS:-flatbuffers==25.12.19 packaging==26.4 protobuf==7.36.2 rapidocr-onnxruntime==1.4.4}
PY=3.11  # the stub and every cp311 wheel must match the image's python3.11
CACHE=${BATCHFILL_IMAGE_CACHE:-$HOME/.cache/batchfill/images}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYPROJECT=${BATCHFILL_PYPROJECT:-$HERE/../pyproject.toml}
PIP_PYTHON=${BATCHFILL_PIP_PYTHON:-python3}
TRITON_VERSION=2.51  # what nvidia-pytriton 0.7.0 ships; only a label in the tag

image=triton
mode=build
for arg in "$@"; do
  case "$arg" in
    triton) image=$arg ;;
    --check) mode=check ;;
    --print-path) mode=print-path ;;
    --print-ref) mode=print-ref ;;
    --force) mode=force ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done

PROGRESS_TAG=build-image
# shellcheck source=scripts/lib/progress.sh
. "$HERE/lib/progress.sh"

# --- inputs and names ------------------------------------------------------------------------------------------
PYTRITON_VERSION=$(sed -n 's/^[[:space:]]*"nvidia-pytriton==\([^"]*\)".*/\1/p' "$PYPROJECT" 2>/dev/null | head -n 1)
if [ -z "$PYTRITON_VERSION" ]; then
  log "no nvidia-pytriton==X pin found in $PYPROJECT (set BATCHFILL_PYPROJECT)"; exit 2
fi
WHEELS="nvidia-pytriton==$PYTRITON_VERSION numpy==$NUMPY_VERSION onnxruntime==$ONNXRUNTIME_VERSION $EXTRA_WHEELS"

input_hash() {
  {
    cat "${BASH_SOURCE[0]}"
    printf 'suite=%s\ndebs=%s\nwheels=%s\npython=%s\n' "$SUITE" "$DEB_PACKAGES" "$WHEELS" "$PY"
  } | sha256sum | cut -c1-16
}
HASH=$(input_hash)
NAME=tritonserver; REF="batchfill.local/tritonserver:$TRITON_VERSION-$HASH"
ARCHIVE=$CACHE/$NAME-$HASH.tar

case "$mode" in
  print-path) echo "$ARCHIVE"; exit 0 ;;
  print-ref) echo "$REF"; exit 0 ;;
  check) [ -s "$ARCHIVE" ] && exit 0 || exit 1 ;;
esac
if [ "$mode" = build ] && [ -s "$ARCHIVE" ]; then
  log "up to date: $ARCHIVE ($REF)"; echo "$ARCHIVE"; exit 0
fi

# --- tools -------------------------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || { log "must run as root (debootstrap, chroot and the bundle's uid 0 files)"; exit 4; }
need() {  # command debian-package
  command -v "$1" >/dev/null 2>&1 || { log "$1 is missing: apt-get install $2"; exit 3; }
}
need umoci umoci; need skopeo skopeo; need debootstrap debootstrap
"$PIP_PYTHON" -m pip --version >/dev/null 2>&1 || { log "$PIP_PYTHON -m pip does not run (set BATCHFILL_PIP_PYTHON)"; exit 3; }

mkdir -p "$CACHE"
# One build per cache at a time (parallel test sessions, a developer's shell).
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then log "another build holds $CACHE/.build.lock; waiting"; flock 9; fi
if [ "$mode" = build ] && [ -s "$ARCHIVE" ]; then log "built meanwhile: $ARCHIVE"; echo "$ARCHIVE"; exit 0; fi

unmount_under() {  # dir: every mount below it, deepest first (debootstrap's own, or ours, after a failure)
  local m
  for m in $(awk -v r="$1/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
}
# Under the lock every temporary folder of ours is a dead build's (SIGKILL runs no trap). --one-file-system: a mount
# that would not go away (a bind of /dev) is never descended into.
for stale in "$CACHE"/.tmp-tritonserver.*; do
  [ -d "$stale" ] || continue
  log "removing $stale, left by a build that was killed"
  unmount_under "$stale"; rm -rf --one-file-system "$stale"
done
TMP=$(mktemp -d "$CACHE/.tmp-$NAME.XXXXXX")
BUNDLE=$TMP/bundle
ROOTFS=$BUNDLE/rootfs
unmount_rootfs() { unmount_under "$ROOTFS"; }
cleanup() { stop_heartbeat; unmount_under "$TMP"; rm -rf --one-file-system "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
  log "FAILED: $*"
  log "what to do: read the output above; fix its cause (disk space: df -h $CACHE; the Debian mirror or PyPI) and run scripts/build-triton-image.sh again (downloaded wheels are kept in $CACHE/wheels)"
  exit 2
}

# --- the mirror apt uses -----------------------------------------------------------------------------------------
debian_mirror() {
  local f u
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # one-line form: deb [options] URI SUITE COMPONENTS...
    u=$(awk -v suite="$SUITE" '$1 == "deb" { for (i = 2; i < NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $(i+1) == suite) { print $i; exit } }' "$f")
    [ -n "$u" ] && { echo "$u"; return; }
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822 stanzas: the URIs of the first stanza whose Suites include the plain suite (not -security/-updates)
    u=$(awk -v suite="$SUITE" 'BEGIN { RS = ""; FS = "\n" }
      { uri = ""; ok = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { split($i, a, /[[:space:]]+/); uri = a[2] }
          if ($i ~ /^Suites:/) { n = split($i, s, /[[:space:]]+/); for (j = 2; j <= n; j++) if (s[j] == suite) ok = 1 }
        }
        if (ok && uri != "") { print uri; exit } }' "$f")
    [ -n "$u" ] && { echo "$u"; return; }
  done
  echo "http://deb.debian.org/debian"
}

# --- the OCI layout and bundle -----------------------------------------------------------------------------------
oci_start() {
  umoci init --layout "$TMP/oci"
  umoci new --image "$TMP/oci:$NAME"
  umoci unpack --image "$TMP/oci:$NAME" "$BUNDLE" >/dev/null
}
oci_finish() {  # config flags... : repack the bundle, set the config, write the docker-archive atomically
  step "$NAME: umoci repack" umoci repack --image "$TMP/oci:$NAME" "$BUNDLE" || fail "umoci repack"
  umoci config --image "$TMP/oci:$NAME" "$@" \
    --config.env="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" || fail "umoci config"
  umoci gc --layout "$TMP/oci"
  rm -f "$TMP/out.tar"
  step "$NAME: skopeo copy" skopeo copy --quiet "oci:$TMP/oci:$NAME" "docker-archive:$TMP/out.tar:$REF" \
    || fail "skopeo copy"
  mv -f "$TMP/out.tar" "$ARCHIVE"
  log "built $ARCHIVE ($REF, $(du -m "$ARCHIVE" | cut -f1) MB) in $(( $(date +%s) - T0 )) s"
  echo "$ARCHIVE"
}

T0=$(date +%s)

# --- triton: Debian root filesystem --------------------------------------------------------------------------------
MIRROR=$(debian_mirror)
oci_start
log "Debian $SUITE minbase from $MIRROR, with: $DEB_PACKAGES"
to_log() { local f=$1; shift; "$@" >"$f" 2>&1; }  # debootstrap's own lines, shown only when it fails
step "debootstrap $SUITE" to_log "$TMP/debootstrap.log" \
  debootstrap --variant=minbase --include="${DEB_PACKAGES// /,}" "$SUITE" "$ROOTFS" "$MIRROR" \
  || { tail -n 30 "$TMP/debootstrap.log" >&2; fail "debootstrap"; }
unmount_rootfs

# --- wheels: downloaded once into the cache, installed from there with --no-index ------------------------------------
WHEEL_DIR=$CACHE/wheels
mkdir -p "$WHEEL_DIR"
# Wheels for the image's Python and glibc (bookworm: 2.36), whichever interpreter runs pip; older pips do not
# expand a manylinux tag to the older ones it accepts, hence one --platform per glibc minor.
PIP_TARGET_FLAGS="--only-binary=:all: --no-deps --implementation cp --python-version $PY --abi cp${PY/./}"
for v in $(seq 36 -1 17); do PIP_TARGET_FLAGS="$PIP_TARGET_FLAGS --platform manylinux_2_${v}_x86_64"; done
PIP_TARGET_FLAGS="$PIP_TARGET_FLAGS --platform manylinux2014_x86_64"
pip_download() {  # extra pip flags... : every pinned wheel into the wheel dir
  # shellcheck disable=SC2086
  "$PIP_PYTHON" -m pip download --quiet --disable-pip-version-check $PIP_TARGET_FLAGS \
    --dest "$WHEEL_DIR" --find-links "$WHEEL_DIR" "$@" $WHEELS
}
if pip_download --no-index >/dev/null 2>&1; then
  log "wheels: all in $WHEEL_DIR"
else
  step "pip download" pip_download || fail "pip download $WHEELS"
fi
SITE=$ROOTFS/usr/local/lib/python$PY/dist-packages
# shellcheck disable=SC2086
step "pip install into the rootfs" env PIP_ROOT_USER_ACTION=ignore "$PIP_PYTHON" -m pip install --quiet --disable-pip-version-check --no-index \
  --find-links "$WHEEL_DIR" $PIP_TARGET_FLAGS --no-compile --target "$SITE" $WHEELS || fail "pip install --target"
rm -rf "$SITE/bin"  # console scripts with the build host's interpreter in their #! line

# --- tritonserver in /opt/tritonserver ---------------------------------------------------------------------------
OPT=$ROOTFS/opt/tritonserver
WHEEL_SERVER=$SITE/pytriton/tritonserver
[ -x "$WHEEL_SERVER/bin/tritonserver" ] || fail "the nvidia-pytriton wheel has no tritonserver/bin/tritonserver"
[ -f "$WHEEL_SERVER/python_backend_stubs/$PY/triton_python_backend_stub" ] || fail "no Python $PY backend stub in the wheel"
mkdir -p "$OPT/bin" "$OPT/backends" "$OPT/caches"
mv "$WHEEL_SERVER/bin/tritonserver" "$OPT/bin/tritonserver"
mv "$WHEEL_SERVER/backends/python" "$OPT/backends/python"
mv "$WHEEL_SERVER/python_backend_stubs/$PY/triton_python_backend_stub" "$OPT/backends/python/"
chmod 0755 "$OPT/backends/python/triton_python_backend_stub"
mv "$WHEEL_SERVER/caches/local" "$OPT/caches/local"
mv "$SITE/nvidia_pytriton.libs" "$OPT/lib"
rm -f "$OPT"/lib/libpython3-*  # the wheel's libpython3.13, for its 3.13 stub; the 3.11 stub links Debian's
# The rest of the wheel is pytriton's Python API (its requirements are not installed): drop it and its metadata.
rm -rf "$SITE/pytriton" "$SITE"/nvidia_pytriton-*.dist-info
cat > "$ROOTFS/usr/local/bin/tritonserver" <<'EOF'
#!/bin/sh
# tritonserver from the nvidia-pytriton wheel (scripts/build-triton-image.sh): its bundled libraries lost their
# $ORIGIN rpath when they moved here; python3 on PATH is how the Python-backend stub finds its site-packages.
export LD_LIBRARY_PATH="/opt/tritonserver/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
case ":$PATH:" in *:/usr/bin:*) ;; *) export PATH="/usr/bin:$PATH" ;; esac
unset PYTHONHOME
exec /opt/tritonserver/bin/tritonserver "$@"
EOF
chmod 0755 "$ROOTFS/usr/local/bin/tritonserver"

# --- user, trimming, a smoke test ----------------------------------------------------------------------------------
chroot "$ROOTFS" /usr/sbin/groupadd --gid 1000 triton-server
chroot "$ROOTFS" /usr/sbin/useradd --uid 1000 --gid 1000 --create-home --shell /bin/sh triton-server
# No package manager state, docs or caches in the image; the licences (usr/share/doc/*/copyright) stay.
rm -rf "$ROOTFS"/var/cache/apt/* "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/* "$ROOTFS"/usr/share/man \
  "$ROOTFS"/usr/share/info "$ROOTFS"/usr/share/locale "$ROOTFS"/usr/share/lintian
find "$ROOTFS/usr/share/doc" -type f ! -name copyright -delete
find "$ROOTFS/usr/share/doc" -type l -delete
find "$ROOTFS" -xdev -name __pycache__ -type d -prune -exec rm -rf {} +
mount -t proc proc "$ROOTFS/proc"
smoke=$(chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin /bin/sh -c \
  'out=$(tritonserver --help 2>&1); case "$out" in "Usage: tritonserver"*) ;; *) echo "tritonserver: $out"; exit 1 ;; esac
   python3 -c "import numpy, onnxruntime; print(numpy.__version__, onnxruntime.__version__)"' 2>&1) \
  || fail "smoke test in the rootfs: $smoke"
unmount_rootfs
rm -rf "$ROOTFS/root/.cache"  # onnxruntime's telemetry folder, from the import above
# debootstrap's device nodes: a runtime mounts the container's own /dev
find "$ROOTFS/dev" -xdev -mindepth 1 -delete
log "rootfs: $(du -sm "$ROOTFS" | cut -f1) MB; numpy, onnxruntime: $smoke"
find "$ROOTFS" -xdev -name __pycache__ -type d -prune -exec rm -rf {} +

# HOME: a runtime may leave it at / for a user it does not look up; onnxruntime writes a cache folder there.
oci_finish --config.user=1000:1000 --config.entrypoint=/usr/bin/tini --config.entrypoint=-- \
  --config.workingdir=/opt/tritonserver --config.env=HOME=/home/triton-server
