#!/bin/sh
# The whole test suite on a fresh Debian 12 machine (README's second command):
#   1. set-up (tools/setup.sh --asan: packages, build/, build-asan/)
#   2. meson test in build/: unit (cmocka), lint, fuzz seed replay
#   2b. libFuzzer targets for a few seconds each (build-fuzz/, clang)
#   3. pytest in build/: integration and compat (real processes, real PyTorch)
#   4. the same again with ASan/UBSan (build-asan/): unit tests and the
#      integration tests not marked 'heavy' (leaks and UB fail them)
#   5. one closing line: N passed, N failed, N skipped
# Exit status 0 only when nothing failed.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

tools/setup.sh --asan || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }

PY=/usr/bin/python3 # Debian's python3, where python3-torch lives
reports=""
out="$top/build/test-reports"
rm -rf "$out" && mkdir -p "$out"

stage() { echo; echo "=== $* ==="; }

stage "unit, lint, fuzz (build/)"
meson test -C build --print-errorlogs --num-processes 2
cp build/meson-logs/testlog.json "$out/meson.json" 2>/dev/null
reports="$reports $out/meson.json"

stage "fuzz (build-fuzz/: clang, libFuzzer, a few seconds per target)"
# Only the fuzz targets are built here; their results join the summary.
rm -f build-fuzz/meson-logs/testlog.json
if [ -f build-fuzz/build.ninja ] || CC=clang meson setup build-fuzz -Dfuzz=true -Dcuda=disabled >/dev/null; then
    # Regenerate first if meson files changed, so the target list is current.
    ninja -C build-fuzz build.ninja >/dev/null
    fuzz_targets=$(cd build-fuzz && meson introspect --targets | $PY -c \
        'import json,os,sys; print(" ".join(os.path.relpath(t["filename"][0]) for t in json.load(sys.stdin) if t["name"].startswith("fuzz_")))')
    # shellcheck disable=SC2086
    ninja -C build-fuzz $fuzz_targets && \
        meson test -C build-fuzz --no-rebuild --print-errorlogs --suite fuzz
fi
cp build-fuzz/meson-logs/testlog.json "$out/meson-fuzz.json" 2>/dev/null
reports="$reports $out/meson-fuzz.json"

stage "integration and compat (build/)"
CDDP_BUILD_DIR="$top/build" $PY -m pytest -p no:cacheprovider -q -rfEs \
    --junitxml="$out/pytest.xml" tests/integration tests/compat
reports="$reports $out/pytest.xml"

stage "unit under ASan/UBSan (build-asan/)"
meson test -C build-asan --print-errorlogs --num-processes 2 --suite unit --suite fuzz
cp build-asan/meson-logs/testlog.json "$out/meson-asan.json" 2>/dev/null
reports="$reports $out/meson-asan.json"

stage "integration under ASan/UBSan (build-asan/)"
CDDP_BUILD_DIR="$top/build-asan" $PY -m pytest -p no:cacheprovider -q -rfEs -m "not heavy" \
    --junitxml="$out/pytest-asan.xml" tests/integration
reports="$reports $out/pytest-asan.xml"

stage "summary"
# shellcheck disable=SC2086
exec $PY tools/summary.py $reports
