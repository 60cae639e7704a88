#!/bin/sh
# tools/logcodes.sh must pass on the tree and fail on each kind of mistake:
# run on a copy of the tree (sources, docs, tools) with one mistake at a time.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 2
tmp=${TMPDIR:-/tmp}/cddp-logcodes-selftest.$$
trap 'rm -rf "$tmp"' EXIT
status=0

fresh() {
    rm -rf "$tmp" && mkdir -p "$tmp" || exit 2
    git ls-files -co --exclude-standard -- '*.c' '*.h' '*.cc' '*.cpp' '*.cu' '*.cuh' '*.md' '*.py' \
        tools | grep -v '^tests/fixtures/' | tar -cf - -T - | tar -xf - -C "$tmp" || exit 2
}

# expect WHAT-THE-OUTPUT-SAYS: the check fails and says it.
expect() {
    out=$(tools/logcodes.sh "$tmp" 2>&1) && { echo "selftest: passed with $case"; status=1; return; }
    case "$out" in
    *"$1"*) ;;
    *) echo "selftest: $case: expected '$1' in: $out"; status=1 ;;
    esac
}

fresh
tools/logcodes.sh "$tmp" >/dev/null || { echo "selftest: the copy does not pass"; exit 1; }

case="an unregistered id"
fresh && sed -i 's/log_warn("A0211"/log_warn("A9999"/' "$tmp/agent/logs.c" && expect "A9999 is not registered"
case="an id used for two meanings (two files, two levels)"
fresh && sed -i 's/log_warn("A0211"/log_warn("A0301"/' "$tmp/agent/logs.c" && expect "A0301 is used in"
case="an id registered twice"
fresh && echo "A0001  INFO  again" >>"$tmp/tools/logcodes.txt" && expect "A0001 is registered twice"
case="a level the registry does not list"
fresh && sed -i 's/^A0211  WARNING /A0211  ERROR /' "$tmp/tools/logcodes.txt" && expect "A0211 is logged at WARNING"
case="an id registered but unused"
fresh && echo "Z0001  INFO  nothing" >>"$tmp/tools/logcodes.txt" && expect "Z0001 is registered but used nowhere"
case="an unregistered id in the docs"
fresh && echo "see Q1234" >>"$tmp/docs/cli.md" && expect "mentions Q1234"
case="a docs table that disagrees on a level"
fresh && sed -i 's/^| T0002 | DEBUG |/| T0002 | INFO |/' "$tmp/docs/trainer.md" && expect "says T0002 is INFO"
case="a stale docs/log-codes.md"
fresh && echo "x" >>"$tmp/docs/log-codes.md" && expect "out of date"
[ $status -eq 0 ] && echo "selftest: ok"
exit $status
