#!/bin/sh
# The folder map's rules (docs/architecture.md, "Layout"), checked on every
# source file we own (meson test --suite lint):
#  1. a folder includes project headers only from the folders below it:
#       common/     nothing but common/
#       proto/      common/
#       store/      common/ proto/
#       status/     common/ proto/
#       rendezvous/ common/ proto/ store/ status/
#       agent/      common/ proto/ store/ status/ rendezvous/
#       launcher/   common/ proto/ store/ status/ rendezvous/ agent/
#       trainer/    common/ proto/ store/ (nothing of rendezvous/: the workers
#                   speak torch's TCPStore, store/'s client and server)
#     (tests/ and tools/ may include anything);
#  2. common/ includes no third-party library header (libc, POSIX, pthreads);
#  3. the pure cores include no libuv and no socket header: proto/,
#     store/kvstore.[ch] and tcpstore_wire.[ch], rendezvous/state.[ch] and
#     conf.[ch], agent/policy.[ch], agent/watchdog.[ch], agent/filetimer_core.[ch], rendezvous/etcd_round.[ch], etcd_wire.[ch],
#     trainer/buckets.[ch], trainer/data/sampler.[ch].
# Prints one line per violation and exits 1 when there is any.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 2

allowed() {
    case $1 in
    common) echo "common" ;;
    proto) echo "common proto" ;;
    store) echo "common proto store" ;;
    status) echo "common proto status" ;;
    rendezvous) echo "common proto store status rendezvous" ;;
    agent) echo "common proto store status rendezvous agent" ;;
    launcher) echo "common proto store status rendezvous agent launcher" ;;
    trainer) echo "common proto store trainer" ;;
    *) echo "*" ;;
    esac
}

files=$(git ls-files '*.c' '*.h' '*.cc' '*.cu' '*.cuh' 2>/dev/null)
[ -n "$files" ] || files=$(find common proto store status rendezvous agent launcher trainer \
    -name '*.[ch]' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh')
status=0
for f in $files; do
    folder=${f%%/*}
    ok=$(allowed "$folder")
    [ "$ok" = "*" ] && continue
    # 1. project includes: "folder/name.h"
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z_]*\)\/.*/\1/p' "$f" | sort -u); do
        case " $ok " in
        *" $inc "*) ;;
        *)
            echo "layers: $f includes a header from $inc/, which $folder/ may not use"
            status=1
            ;;
        esac
    done
    # 2. the foundation is libc, POSIX and pthreads only
    if [ "$folder" = common ] &&
        grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(uv|cjson/|curl/|microhttpd|gloo/|dnnl|cuda|cudnn|cublas|nccl)' "$f"; then
        echo "layers: $f (common/) includes a third-party library header"
        status=1
    fi
    # 3. pure cores: no event loop, no sockets
    case $f in
    proto/* | store/kvstore.[ch] | store/tcpstore_wire.[ch] | rendezvous/state.[ch] | rendezvous/jobstats.[ch] | rendezvous/conf.[ch] | agent/policy.[ch] | agent/watchdog.[ch] | agent/filetimer_core.[ch] | agent/goodput.[ch] | rendezvous/etcd_round.[ch] | rendezvous/etcd_wire.[ch] | \
        trainer/buckets.[ch] | trainer/data/sampler.[ch])
        if grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(uv\.h|sys/socket\.h|netinet/|netdb\.h|arpa/)' "$f"; then
            echo "layers: $f is a pure core and includes libuv or a socket header"
            status=1
        fi
        ;;
    esac
done
[ $status -eq 0 ] && echo "layers: ok"
exit $status
