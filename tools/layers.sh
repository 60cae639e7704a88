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

files=$(git ls-files '*.c' '*.h' '*.cc' '*.cu' '*.cuh' 2>/dev/null)
[ -n "$files" ] || files=$(find common proto store status rendezvous agent launcher trainer \
    -name '*.[ch]' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh')
# One grep a rule over every file (a process per file took 30 s on a
# small VM); awk checks each project include against its folder's list.
status=0
out=$(grep -HE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]+/' $files /dev/null |
    awk -F: '
    BEGIN {
        ok["common"] = "common"
        ok["proto"] = "common proto"
        ok["store"] = "common proto store"
        ok["status"] = "common proto status"
        ok["rendezvous"] = "common proto store status rendezvous"
        ok["agent"] = "common proto store status rendezvous agent"
        ok["launcher"] = "common proto store status rendezvous agent launcher"
        ok["trainer"] = "common proto store trainer"
    }
    {
        f = $1; folder = f; sub(/\/.*/, "", folder)
        if (!(folder in ok)) next
        line = substr($0, length(f) + 2)
        sub(/^[^"]*"/, "", line); sub(/\/.*/, "", line)
        if (index(" " ok[folder] " ", " " line " ") == 0 && !seen[f, line]++)
            print "layers: " f " includes a header from " line "/, which " folder "/ may not use"
    }')
if [ -n "$out" ]; then
    echo "$out"
    status=1
fi
# forbid ERE WHY FILE...: each file with an include matching ERE is a
# violation (its lines, then one line naming it and WHY)
forbid() {
    re=$1 why=$2
    shift 2
    for f in $(grep -lE "$re" "$@" /dev/null); do
        grep -nE "$re" "$f"
        echo "layers: $f $why"
        status=1
    done
}
inc='^[[:space:]]*#[[:space:]]*include[[:space:]]*<'
# 2. the foundation is libc, POSIX and pthreads only
common=$(for f in $files; do case $f in common/*) echo "$f" ;; esac; done)
forbid "$inc(uv|cjson/|curl/|microhttpd|gloo/|dnnl|cuda|cudnn|cublas|nccl)" \
    "(common/) includes a third-party library header" $common
# 3. pure cores: no event loop, no sockets
cores=$(for f in $files; do
    case $f in
    proto/* | store/kvstore.[ch] | store/tcpstore_wire.[ch] | rendezvous/state.[ch] | rendezvous/jobstats.[ch] | rendezvous/conf.[ch] | agent/policy.[ch] | agent/watchdog.[ch] | agent/filetimer_core.[ch] | agent/goodput.[ch] | rendezvous/etcd_round.[ch] | rendezvous/etcd_wire.[ch] | \
        trainer/buckets.[ch] | trainer/data/sampler.[ch])
        echo "$f" ;;
    esac
done)
forbid "$inc(uv\.h|sys/socket\.h|netinet/|netdb\.h|arpa/)" \
    "is a pure core and includes libuv or a socket header" $cores
[ $status -eq 0 ] && echo "layers: ok"
exit $status
