#!/bin/sh
# Builds a Debian package of cddp from this tree, offline: meson builds and
# installs it (prefix /usr) into a staging directory, dpkg-shlibdeps works
# out its dependencies from the libraries the programs link, dpkg-deb packs
# it. Everything `meson install` puts down goes in: the four programs, their
# man pages, the docs, bash completion, cddp-rdzv's systemd unit; and
# /etc/default/cddp-rdzv as a conffile.
#
#   tools/mkdeb.sh [-B BUILDDIR] [-o OUTDIR]
#
#   -B BUILDDIR  the build directory to use (default build-deb/, configured
#                here: --prefix=/usr, release, -Dcuda=disabled; reused and
#                rebuilt incrementally on later runs)
#   -o OUTDIR    where the .deb goes (default: BUILDDIR, where older ones
#                are removed)
#
# Prints the path of the .deb on its last line. Needs meson, ninja, dpkg-dev
# (dpkg-shlibdeps) and the build dependencies (tools/setup.sh). The CUDA
# backend is left out so the package runs on any amd64 Debian 12 machine.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
builddir="$top/build-deb"
outdir=""
while getopts B:o: opt; do
    case $opt in
    B) builddir=$OPTARG ;;
    o) outdir=$OPTARG ;;
    *) echo "usage: tools/mkdeb.sh [-B BUILDDIR] [-o OUTDIR]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || { echo "mkdeb: unexpected argument '$1'" >&2; exit 2; }
for tool in meson ninja dpkg-deb dpkg-shlibdeps; do
    command -v "$tool" >/dev/null || { echo "mkdeb: $tool not found (apt-get install dpkg-dev meson ninja-build)" >&2; exit 2; }
done
[ -n "$outdir" ] || outdir=$builddir
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)

if [ ! -f "$builddir/build.ninja" ]; then
    meson setup "$builddir" "$top" --prefix=/usr --buildtype=release -Dcuda=disabled \
        -Dsanitize=false >/dev/null
fi
# Only what is installed and built by ninja (the tests and benchmarks are
# not needed; configure_file's outputs exist already).
targets=$(ninja -C "$builddir" -t targets all | cut -d: -f1 >"$builddir/.mkdeb-targets"
    meson introspect --installed "$builddir" | python3 -c '
import json, os, sys
b = os.path.realpath(sys.argv[1])
known = set(open(os.path.join(b, ".mkdeb-targets")).read().split())
for src in json.load(sys.stdin):
    rel = os.path.relpath(os.path.realpath(src), b)
    if rel in known:
        print(rel)
' "$builddir")
# shellcheck disable=SC2086
ninja -C "$builddir" $targets dlopen-probe >/dev/null

version=$(meson introspect --projectinfo "$builddir" | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
if rev=$(git -C "$top" log -1 --format='%cd.%h' --date=format:%Y%m%d 2>/dev/null); then
    version="$version+git$rev"
fi
arch=$(dpkg --print-architecture)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
DESTDIR="$root" meson install -C "$builddir" --no-rebuild --strip --quiet >/dev/null
# Debian's way: man pages compressed; the settings file (it may hold the
# join token) readable by root only.
find "$root/usr/share/man" -type f -name '*.[18]' -exec gzip -9n {} +
install -D -m 0600 "$top/contrib/systemd/cddp-rdzv.default" "$root/etc/default/cddp-rdzv"
install -d "$root/usr/share/doc/cddp"
cat >"$root/usr/share/doc/cddp/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: cddp

Files: *
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF

# Depends: the packages of the shared libraries the programs link, and of
# those they open on first use (libcurl for the etcd backend, libmicrohttpd
# for the status port; common/dl.h), which dpkg-shlibdeps cannot see through
# dlopen: dlopen-probe (tools/dlopen_probe.c, not installed) links those and
# calls what the programs call, so it stands in for them, minimum versions
# included.
mkdir -p "$stage/shlibs/debian"
printf 'Source: cddp\n\nPackage: cddp\nArchitecture: any\n' >"$stage/shlibs/debian/control"
deps=$(cd "$stage/shlibs" && dpkg-shlibdeps -O "$root"/usr/bin/* "$builddir/dlopen-probe" 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')
[ -n "$deps" ] || { echo "mkdeb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
# The probe links those libraries and the programs do not (the lint suite
# checks this on every build; here on the release build that is packaged).
sonames=$(sed -n 's/^#define CDDP_LIB[A-Z]*_SONAME "\(.*\)"$/\1/p' "$builddir/config.h")
lazy=$("$top/tools/lazylibs.sh" "$builddir/dlopen-probe" "$sonames" "$root/usr/bin/cddprun" \
    "$root/usr/bin/cddp-rdzv") || { echo "mkdeb: $lazy" >&2; exit 1; }

install -d "$root/DEBIAN"
printf '/etc/default/cddp-rdzv\n' >"$root/DEBIAN/conffiles"
# The unit is not enabled: a rendezvous server listening on every address
# is for the administrator to turn on (systemctl enable --now cddp-rdzv).
cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    systemctl try-restart cddp-rdzv.service >/dev/null 2>&1 || true
fi
exit 0
EOF
cat >"$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop cddp-rdzv.service >/dev/null 2>&1 || true
fi
exit 0
EOF
cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: cddp
Version: $version
Architecture: $arch
Maintainer: cddp developers <cddp@localhost>
Installed-Size: $size
Depends: $deps
Recommends: python3
Suggests: python3-torch
Section: science
Priority: optional
Description: torchrun-compatible launcher, rendezvous server and ResNet DDP trainer in C
 cddprun takes torchrun's command line and runs a per-node elastic agent:
 workers with torchrun's environment, restarts, rendezvous rounds, no
 orphans, a status port. cddp-rdzv is the standalone rendezvous server
 (with a hardened systemd unit), cddpctl reads the status port, and
 cddp-train trains torchvision's ResNets data-parallel on the CPU.
EOF
deb="$outdir/cddp_${version}_${arch}.deb"
# In its own build directory, only the newest package is kept (so that
# apt-get install ./build-deb/cddp_*.deb names one).
if [ "$outdir" = "$(cd "$builddir" && pwd)" ]; then
    find "$outdir" -maxdepth 1 -name "cddp_*_${arch}.deb" ! -name "$(basename "$deb")" -delete
fi
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
