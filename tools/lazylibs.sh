#!/bin/sh
# Libraries opened on first use (common/dl.h: libcurl for the etcd backend,
# libmicrohttpd for the status port) stay that way (meson test --suite lint):
#
#   tools/lazylibs.sh PROBE "SONAME..." PROGRAM...
#
#  1. PROBE (tools/dlopen_probe.c, linked against those libraries and
#     calling what the programs' tables call) links every SONAME: the names
#     the programs open are the libraries their headers came from;
#  2. no PROGRAM links any SONAME. A stray curl_* or MHD_* call outside the
#     tables, or a full dependency where a _headers one was meant, makes the
#     linker add it back, and every run pays for it again (docs/benchmarks.md,
#     "Launcher start-up").
#
# Prints one line per violation, and exits 1 when there is any.
set -u
command -v readelf >/dev/null || { echo "lazylibs: readelf not found (binutils)"; exit 77; }
[ $# -ge 2 ] || { echo "usage: tools/lazylibs.sh PROBE \"SONAME...\" PROGRAM..."; exit 2; }
probe=$1
sonames=$(printf '%s' "$2" | tr -s '\n\t' '  ')
shift 2
# The NEEDED entries of an ELF file, on one line, space-separated.
needed() {
    [ -f "$1" ] || { echo "lazylibs: $1 not found" >&2; return 2; }
    readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' '
}
status=0
probe_needs=$(needed "$probe") || exit 2
for so in $sonames; do
    case " $probe_needs " in
    *" $so "*) ;;
    *)
        echo "lazylibs: the programs open $so, but the library they were compiled against is not it (dlopen-probe links: $probe_needs)"
        status=1
        ;;
    esac
done
for prog in "$@"; do
    prog_needs=$(needed "$prog") || exit 2
    for so in $sonames; do
        case " $prog_needs " in
        *" $so "*)
            echo "lazylibs: $prog links $so, which it must open on first use (common/dl.h)"
            status=1
            ;;
        esac
    done
done
[ $status -eq 0 ] && echo "lazylibs: ok ($sonames: opened on first use by $#, and what they were built against)"
exit $status
