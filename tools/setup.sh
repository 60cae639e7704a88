#!/bin/sh
# Set-up for a fresh Debian 12 machine, safe to run again: installs the
# Debian packages that are missing (apt-get, non-interactive), then configures
# and builds with meson.
#
#   tools/setup.sh            runtime + build packages, build/ (release-ish)
#   tools/setup.sh --test     also what the test suite needs (PyTorch, pytest, etcd, clang, ...)
#   tools/setup.sh --asan     build-asan/ with -Dsanitize=true (implies --test)
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

want_test=0
want_asan=0
for arg in "$@"; do
    case "$arg" in
    --test) want_test=1 ;;
    --asan) want_asan=1; want_test=1 ;;
    *) echo "setup.sh: unknown option '$arg' (use --test or --asan)" >&2; exit 2 ;;
    esac
done

# Build and runtime: compilers, meson, and every library the programs link.
pkgs="build-essential meson ninja-build pkg-config git
      libuv1-dev libcjson-dev libcurl4-openssl-dev libmicrohttpd-dev libcmocka-dev
      libopenblas-dev libdnnl-dev libgloo-dev libturbojpeg0-dev zlib1g-dev
      dataset-fashion-mnist"
# The test suite: real PyTorch as the oracle, real etcd, curl, sanitizers and fuzzers.
test_pkgs="python3 python3-pytest python3-torch python3-torchvision python3-numpy
           etcd-server etcd-client curl clang clang-format libclang-rt-14-dev
           iproute2 procps psmisc wrk hyperfine gdb python3-yaml
           prometheus chromium chromium-driver
           slurm-wlm munge util-linux"
# gdb's py-bt for Python workers' stacks: python3.11-dbg ships the symbols and
# the gdb extension for Debian's /usr/bin/python3.11 (docs/cli.md).
test_pkgs="$test_pkgs python3.11-dbg"
# tests/integration/test_etcd.py makes its TLS test CA with openssl.
test_pkgs="$test_pkgs openssl"
# tests/netns.py drops packets with nftables (loss without sch_netem).
test_pkgs="$test_pkgs nftables"
# The Python wheel (pyproject.toml): meson-python and build to make it
# offline, patchelf for its RUNPATHs (strip, readelf: binutils), venv and pip
# to install it (tests/integration/test_wheel.py, test_interpreter.py).
test_pkgs="$test_pkgs python3-mesonpy python3-build python3-venv python3-pip patchelf binutils"
[ $want_test -eq 1 ] && pkgs="$pkgs $test_pkgs"

# Packaging: scdoc turns docs/man/*.scd into man pages at build time; the
# install and .deb tests read them (man-db), verify the unit (systemd),
# build the package (dpkg-dev) and install it in a fresh root (debootstrap).
pkgs="$pkgs scdoc"
# tools/gpu-check --pack gives the GPU bundle's binaries a RUNPATH (patchelf).
pkgs="$pkgs patchelf"
[ $want_test -eq 1 ] && pkgs="$pkgs man-db systemd dpkg-dev debootstrap util-linux"

missing=""
for p in $pkgs; do
    st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [ "$st" = "installed" ] || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing:$missing"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -q
    # shellcheck disable=SC2086
    $sudo apt-get install -y -q --no-install-recommends $missing
fi

configure() { # dir, options...
    dir=$1; shift
    if [ -f "$dir/build.ninja" ]; then
        meson configure "$dir" "$@" >/dev/null
    else
        meson setup "$dir" "$@"
    fi
    ninja -C "$dir"
}

configure build
[ $want_asan -eq 1 ] && configure build-asan -Dsanitize=true -Dcuda=disabled
exit 0
