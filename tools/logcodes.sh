#!/bin/sh
# The log message id registry (tools/logcodes.txt) against the tree.
#
#   tools/logcodes.sh [--check] [DIR]   check (tools/lint.sh runs this)
#   tools/logcodes.sh --docs [DIR]      rewrite docs/log-codes.md from the registry
#
# DIR is the tree's top (default: this script's). The check fails on an id
# used in the C/C++/CUDA sources but not registered, registered twice,
# registered but used nowhere, used in two source files (one meaning, one
# place: a message shared by two call sites goes through one function), or
# logged at a level the registry does not list (the level is read from
# log_debug/log_info/log_warn/log_error/log_crit, cddp_log_write(CDDP_LOG_X,
# and agent_failed, which logs at ERROR); on an id in docs/, README.md or the
# Python tests that is not registered; on a docs table row "| ID | LEVEL |"
# that disagrees with the registry; and when docs/log-codes.md differs from
# what --docs writes.
set -u
mode=check
case "${1:-}" in
--check) shift ;;
--docs) mode=docs; shift ;;
esac
top=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$top" || exit 2
reg=tools/logcodes.txt
doc=docs/log-codes.md
[ -f "$reg" ] || { echo "logcodes: $reg is missing"; exit 1; }

# The page docs/log-codes.md, from the registry.
render() {
    awk '
    BEGIN {
        print "# Log message ids"
        print ""
        print "<!-- Written by tools/logcodes.sh --docs from tools/logcodes.txt; edit that"
        print "     file and rerun it (tools/lint.sh fails while this page is out of date). -->"
        print ""
        print "Every line a cddp program logs carries a stable id after its level:"
        print ""
        print "    cddprun[4242] node0 12:00:03.120 WARNING A0401: [default] Worker group FAILED. ..."
        print ""
        print "An id means one thing for good, so scripts and alerts may grep for it."
        print "`LOGLEVEL` (DEBUG, INFO, WARNING, ERROR, CRITICAL; WARNING by default)"
        print "chooses which lines are written. The level below is the one the line is"
        print "logged at (two when it depends on the case)."
        open = 0
    }
    /^#[^#]/ || /^#$/ || /^[[:space:]]*$/ { next }
    /^## / {
        sub(/^## /, "")
        print ""
        print "## " $0
        print ""
        print "| id | level | meaning |"
        print "|---|---|---|"
        next
    }
    {
        id = $1; lv = $2
        $1 = ""; $2 = ""
        sub(/^[[:space:]]+/, "")
        gsub(/,/, ", ", lv)
        gsub(/\|/, "\\|")
        print "| " id " | " lv " | " $0 " |"
    }' "$reg"
}

if [ "$mode" = docs ]; then
    render >"$doc" && echo "logcodes: wrote $doc"
    exit $?
fi

tmp=${TMPDIR:-/tmp}/cddp-logcodes.$$
mkdir -p "$tmp" || exit 2
trap 'rm -rf "$tmp"' EXIT

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    srcs=$(git ls-files '*.c' '*.h' '*.cc' '*.cpp' '*.cu' '*.cuh' | grep -v '^tests/fixtures/')
    texts=$(git ls-files 'docs/*.md' 'README.md' '*.py' | grep -v "^$doc\$")
else
    srcs=$(find . -path ./tests/fixtures -prune -o -path ./build -prune -o \
        \( -name '*.[ch]' -o -name '*.cc' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) \
        -print | sed 's|^\./||')
    texts=$(find docs README.md tests -name '*.md' -o -name '*.py' 2>/dev/null | grep -v "^$doc\$")
fi

# Uses in the source: FILE ID LEVEL ("?" when the line does not say).
# shellcheck disable=SC2086
grep -nE '"[A-Z][0-9]{4}"' $srcs /dev/null | awk '
{
    line = $0
    file = line; sub(/:.*/, "", file)
    while (match(line, /"[A-Z][0-9][0-9][0-9][0-9]"/)) {
        id = substr(line, RSTART + 1, 5)
        before = substr(line, 1, RSTART - 1)
        line = substr(line, RSTART + RLENGTH)
        lv = "?"
        if (before ~ /log_debug\($/) lv = "DEBUG"
        else if (before ~ /log_info\($/) lv = "INFO"
        else if (before ~ /log_warn\($/) lv = "WARNING"
        else if (before ~ /log_error\($/) lv = "ERROR"
        else if (before ~ /log_crit\($/) lv = "CRITICAL"
        else if (before ~ /agent_failed\([^,]*, *$/) lv = "ERROR"
        else if (match(before, /CDDP_LOG_[A-Z]+, *$/)) {
            lv = substr(before, RSTART + 9)
            sub(/,.*/, "", lv)
        }
        print file, id, lv
    }
}' >"$tmp/uses"

# Ids in the docs and the tests: FILE ID.
# shellcheck disable=SC2086
grep -noE '\b[A-Z][0-9]{4}\b' $texts /dev/null | awk -F: '{ print $1, $3 }' >"$tmp/mentions"
# Table rows "| ID | LEVEL |" in the docs: FILE ID LEVEL.
# shellcheck disable=SC2086
grep -hoE '^\| *[A-Z][0-9]{4} *\| *[A-Z]+' $texts /dev/null | tr -d '| ' | \
    sed -E 's/^([A-Z][0-9]{4})/\1 /' >"$tmp/rows"

status=0
awk -v uses="$tmp/uses" -v mentions="$tmp/mentions" -v rows="$tmp/rows" -v reg="$reg" '
function fail(msg) { print "logcodes: " msg; bad = 1 }
BEGIN {
    split("DEBUG INFO WARNING ERROR CRITICAL", names, " ")
    for (i in names) known[names[i]] = 1
    n = 0
    while ((getline l < reg) > 0) {
        n++
        if (l ~ /^#/ || l ~ /^[[:space:]]*$/) continue
        split(l, f, /[[:space:]]+/)
        id = f[1]; lv = f[2]
        if (id !~ /^[A-Z][0-9][0-9][0-9][0-9]$/ || lv == "" || split(l, g, /[[:space:]]+/) < 3) {
            fail(reg ":" n ": not \"ID LEVEL meaning\": " l); continue
        }
        if (id in level) { fail(id " is registered twice (" reg ":" line_of[id] " and " n ")"); continue }
        nl = split(lv, ls, ",")
        for (k = 1; k <= nl; k++) {
            if (!(ls[k] in known)) fail(reg ":" n ": " id ": unknown level " ls[k])
            ok[id, ls[k]] = 1
        }
        level[id] = lv; line_of[id] = n
    }
    while ((getline l < uses) > 0) {
        split(l, f, " ")
        file = f[1]; id = f[2]; lv = f[3]
        used[id] = 1
        if (!(id in level)) { fail(file ": " id " is not registered in " reg); continue }
        if (lv != "?" && !((id, lv) in ok))
            fail(file ": " id " is logged at " lv " but registered as " level[id] " (another meaning? give it a free id)")
        if ((id in where) && where[id] != file)
            fail(id " is used in " where[id] " and " file " (another meaning? give it a free id)")
        where[id] = file
    }
    for (id in level)
        if (!(id in used)) fail(id " is registered but used nowhere in the source")
    while ((getline l < mentions) > 0) {
        split(l, f, " ")
        if (!(f[2] in level)) fail(f[1] ": mentions " f[2] ", which is not registered")
    }
    while ((getline l < rows) > 0) {
        split(l, f, " ")
        if ((f[1] in level) && !((f[1], f[2]) in ok))
            fail("a docs table says " f[1] " is " f[2] "; " reg " says " level[f[1]])
    }
    exit bad
}' || status=1

render >"$tmp/doc"
if ! cmp -s "$tmp/doc" "$doc"; then
    echo "logcodes: $doc is out of date: run tools/logcodes.sh --docs"
    status=1
fi
[ $status -eq 0 ] && echo "logcodes: ok"
exit $status
