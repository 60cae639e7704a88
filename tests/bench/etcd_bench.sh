#!/bin/sh
# etcd-v3 rendezvous benchmark (docs/benchmarks.md, "Rendezvous over etcd"):
# prints figures, never passes or fails on time.
#
#   tests/bench/etcd_bench.sh [BUILD_DIR] [SIZES]     (default: build "10 100 1000")
#
#  1. one etcd member (Debian's etcd-server) on 127.0.0.1, free ports, a
#     data directory in a temporary directory (tmpfs or disk: say which);
#  2. etcd-bench: N agents in one process (the real etcd-v3 backend each)
#     join one run (N-1:N nodes); round, then the node-rank-0 agent leaves
#     and the survivors form the next round; etcd's CPU from /proc;
#  3. the same N with rdzv-load against cddp-rdzv (the built-in server),
#     for comparison.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
sizes=${2:-"10 100 1000"}
bench=$build/tests/bench/etcd-bench
load=$build/tests/bench/rdzv-load
rdzv=$build/rendezvous/cddp-rdzv
for b in "$bench" "$load" "$rdzv" /usr/bin/etcd; do
    [ -x "$b" ] || { echo "etcd_bench: $b missing (tools/setup.sh)" >&2; exit 2; }
done
tmp=$(mktemp -d)
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cport=$(free_port); pport=$(free_port)
/usr/bin/etcd --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$cport" \
    --advertise-client-urls "http://127.0.0.1:$cport" --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "default=http://127.0.0.1:$pport" >"$tmp/etcd.log" 2>&1 &
epid=$!
"$rdzv" --host 127.0.0.1 --port 0 >"$tmp/rdzv.out" 2>"$tmp/rdzv.err" &
rpid=$!
trap 'kill -TERM $epid $rpid 2>/dev/null; wait $epid $rpid 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
i=0
until curl -sf "http://127.0.0.1:$cport/health" >/dev/null 2>&1 && grep -q listening "$tmp/rdzv.out"; do
    i=$((i + 1)); [ $i -lt 200 ] || { echo "etcd_bench: etcd or cddp-rdzv did not start" >&2; exit 1; }
    sleep 0.05
done
rport=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$tmp/rdzv.out")
cpu() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$1/stat"; }
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(etcd --version | head -1), data dir on $(df --output=fstype "$tmp" | tail -1)"
for n in $sizes; do
    c0=$(cpu $epid)
    out=$("$bench" --endpoints "127.0.0.1:$cport" --agents "$n" --timeout 600 || true)
    c1=$(cpu $epid)
    echo "etcd-v3 $out etcd_cpu_s=$(echo "$c1 - $c0" | bc)"
    out=$("$load" --port "$rport" --agents "$n" --min $((n - 1)) --max "$n" --kill 1 --server-pid "$rpid" || true)
    echo "c10d    $out"
done
