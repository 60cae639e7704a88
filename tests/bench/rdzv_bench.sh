#!/bin/sh
# Rendezvous benchmark (docs/benchmarks.md, "Rendezvous"): prints figures,
# never passes or fails on time.
#
#   tests/bench/rdzv_bench.sh [BUILD_DIR] [REPEAT]     (default: build 3)
#
#  1. cddp-rdzv on 127.0.0.1 and a free port;
#  2. rdzv-load: N = 100, 1,000, 10,000 agents (one process, one libuv loop,
#     the real agent client each) join one run, REPEAT times each (a new run
#     id each time); then one agent (rank 0, the worst case) drops its
#     connection as a SIGKILLed agent's kernel does, and the survivors
#     rejoin at once: time to the new round. Server CPU from /proc;
#  3. the server's peak RSS (VmHWM) after all of it;
#  4. rdzv-state-bench: the state machine alone at 100,000 nodes.
# 10,000 connections need ~10,100 open files in rdzv-load (it raises its
# soft limit to the hard limit and says so if that is not enough).
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
repeat=${2:-3}
rdzv=$build/rendezvous/cddp-rdzv
load=$build/tests/bench/rdzv-load
sm=$build/tests/bench/rdzv-state-bench
PY=/usr/bin/python3
for b in "$rdzv" "$load" "$sm"; do
    [ -x "$b" ] || { echo "rdzv_bench: $b not built (run tools/setup.sh)" >&2; exit 2; }
done

tmp=$(mktemp -d)
"$rdzv" --host 127.0.0.1 --port 0 >"$tmp/rdzv.out" 2>"$tmp/rdzv.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
i=0
while ! grep -q listening "$tmp/rdzv.out" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "rdzv_bench: cddp-rdzv did not start" >&2; cat "$tmp/rdzv.err" >&2; exit 1; }
    sleep 0.05
done
port=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$tmp/rdzv.out")

echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(uname -sr)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min load average before the run)"
echo "limits:  open files $(ulimit -n) soft / $(ulimit -Hn) hard, somaxconn $(cat /proc/sys/net/core/somaxconn)"
echo

: >"$tmp/runs.jsonl"
for n in 100 1000 10000; do
    r=1
    while [ $r -le "$repeat" ]; do
        "$load" --port "$port" --agents $n --run-id "bench-$n-$r" --kill 1 --server-pid $pid \
            --timeout 120 | tee -a "$tmp/runs.jsonl"
        r=$((r + 1))
    done
done
rss=$(awk '/VmHWM/ {print $2}' /proc/$pid/status)
"$sm" --nodes 100000 | tee "$tmp/state.json"

$PY - "$tmp/runs.jsonl" "$tmp/state.json" "$rss" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
state = json.load(open(sys.argv[2]))
rss_kib = int(sys.argv[3])
print()
print("| agents | round (ms) | server CPU for it (ms) | node loss -> restart pushed (ms) | node loss -> new round (ms) |")
print("|---:|---:|---:|---:|---:|")
for n in sorted({r["agents"] for r in runs}):
    rs = [r for r in runs if r["agents"] == n]
    med = lambda k: statistics.median(r[k] for r in rs if k in r)
    print(f"| {n:,} | {med('round_ms'):.0f} | {med('server_cpu_ms'):.0f} | "
          f"{med('restart_push_ms'):.0f} | {med('new_round_ms'):.0f} |")
print()
print(f"cddp-rdzv peak RSS after all runs: {rss_kib / 1024:.1f} MiB")
print(f"state machine alone, {state['nodes']:,} nodes: round {state['round_ms']:.0f} ms, "
      f"encode {state['encode_ms']:.0f} ms, node loss -> new round {state['loss_ms']:.0f} ms, "
      f"heartbeat sweep {state['beat_ms']:.0f} ms, peak RSS {state['peak_rss_mib']:.0f} MiB")
print(f"(medians of {len(runs) // len({r['agents'] for r in runs})} runs per row)")
PYEOF
