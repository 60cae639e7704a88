#!/bin/sh
# Style checks run by the test suite (meson test --suite lint):
#  1. clang-format in check mode over every C/C++/CUDA source we own;
#  2. banned functions (atoi, strtok, sprintf, strcpy, strcat, gets): use
#     common/strutil.h's checked replacements and snprintf;
#  3. log message ids against their registry, tools/logcodes.txt
#     (tools/logcodes.sh says what it checks);
#  4. size limits on product source (outside tests/): no file over 1,200
#     lines, no function over 150 (tools/sizes.py; docs/architecture.md,
#     "Size limits", names the one file allowed past the first and why).
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 2
files=$(git ls-files '*.c' '*.h' '*.cc' '*.cpp' '*.cu' '*.cuh' 2>/dev/null | grep -v '^tests/fixtures/')
[ -n "$files" ] || files=$(find common proto rendezvous agent launcher trainer tests -name '*.[ch]' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh')
status=0
if command -v clang-format >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    if ! clang-format --dry-run -Werror $files 2>/tmp/cddp-lint.$$; then
        head -40 /tmp/cddp-lint.$$
        echo "lint: clang-format: files above differ from .clang-format (run: clang-format -i FILE)"
        status=1
    fi
    rm -f /tmp/cddp-lint.$$
else
    echo "lint: clang-format not installed; format check skipped"
fi
# shellcheck disable=SC2086
banned=$(grep -nE '(^|[^_a-zA-Z0-9])(atoi|atol|strtok|sprintf|vsprintf|strcpy|strcat|gets)[[:space:]]*\(' $files \
    | grep -v 'lint: allow')
if [ -n "$banned" ]; then
    echo "$banned"
    echo "lint: banned functions above (use cddp_parse_long, snprintf, cddp_strlcpy)"
    status=1
fi
tools/logcodes.sh >/dev/null || { tools/logcodes.sh; status=1; }
# shellcheck disable=SC2086
product=$(printf '%s\n' $files | grep -v '^tests/')
# shellcheck disable=SC2086
if ! python3 tools/sizes.py $product; then
    echo "lint: size limits above (split the file by what it holds, the function by its steps)"
    status=1
fi
[ $status -eq 0 ] && echo "lint: ok"
exit $status
