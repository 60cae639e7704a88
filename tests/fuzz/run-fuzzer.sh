#!/bin/sh
# Runs a libFuzzer target for a bounded time (meson test --suite fuzz):
#   run-fuzzer.sh TARGET SEEDS_DIR DICT SECONDS
# New inputs go to a scratch corpus in the build tree, never into SEEDS_DIR;
# a crash leaves its reproducer (crash-*) in the build tree's fuzz-artifacts/.
set -eu
target=$1 seeds=$2 dict=$3 secs=$4
name=$(basename "$target")
work=$(cd "$(dirname "$target")" && pwd)/fuzz-work/$name
mkdir -p "$work/corpus" "$work/artifacts"
# -error_exitcode=1: libFuzzer's default (77) would read as "skipped" to meson.
# -seed=1: a fresh checkout (CI) explores the same inputs every time, so a
# run fails only on a real regression; longer local runs explore further.
exec "$target" -max_total_time="$secs" -timeout=10 -error_exitcode=1 -seed=1 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -dict="$dict" -artifact_prefix="$work/artifacts/" \
    "$work/corpus" "$seeds"
