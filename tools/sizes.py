#!/usr/bin/env python3
"""Size limits on product source (tools/lint.sh runs this; issue 22).

    tools/sizes.py FILE...     check the files
    tools/sizes.py --list FILE...   every function found, with its length
    tools/sizes.py --selftest  check the scanner on the layouts it must read

Two rules, one line per violation, exit 1 when there is any:

1. A file over MAX_FILE_LINES lines ("file.c: 1234 lines (limit 1200)").
   FILE_EXCEPTIONS names the files allowed past it; docs/architecture.md
   ("Size limits") says why each is.
2. A function over MAX_FUNCTION_LINES lines, counted from the first line of
   its signature to its closing brace
   ("file.c:120: name: 183 lines (limit 150)").

The scanner reads the layout .clang-format gives (lint.sh checks that
first): a function's body opens with a brace alone on its line, at the
indentation of its signature (column 0 for C functions and CUDA kernels,
deeper for C++ member functions written inside their class), and closes
with a brace at that same indentation. A brace alone on a line after a
header without parentheses (namespace, class, struct) or with an assignment
(an initializer) opens no function, and what is inside it is scanned as
usual. Blocks inside a function are never taken for functions: the scanner
goes on after the function's closing brace.
"""
import re
import sys

MAX_FILE_LINES = 1200
MAX_FUNCTION_LINES = 150

# The files allowed past MAX_FILE_LINES; docs/architecture.md says why.
FILE_EXCEPTIONS = {"rendezvous/state.c"}

# Words followed by parentheses in a signature that are not the function's
# name: attributes, CUDA launch bounds, C++ specifiers.
NOT_NAMES = {"__attribute__", "__launch_bounds__", "__declspec", "alignas", "noexcept", "throw",
             "decltype"}

OPEN = re.compile(r"^(\s*)\{\s*$")
IDENT_PAREN = re.compile(r"([A-Za-z_][A-Za-z_0-9]*(?:::~?[A-Za-z_][A-Za-z_0-9]*)*)\s*\(")


def header_before(lines, brace):
    """The header of the block whose brace is at index brace: the lines
    before it back to a blank line, a comment's end, a statement or another
    block, joined; preprocessor lines among them (#if around two variants of
    a signature) are passed over. Also the index of its first line."""
    start = brace
    parts = []
    i = brace
    while i > 0:
        s = lines[i - 1].strip()
        if s.startswith("#"):
            i -= 1
            continue
        if (not s or s.startswith("//") or s.startswith("*") or s.startswith("/*")
                or s.endswith("*/") or s.endswith(";") or s.endswith("}") or s.endswith("{")):
            break
        parts.append(s)
        i -= 1
        start = i
    return start, " ".join(reversed(parts))


def function_name(header):
    """The name of the function a header declares, or None when the header
    is not a function's."""
    if "(" not in header or "=" in header.split("(", 1)[0]:
        return None
    for m in IDENT_PAREN.finditer(header):
        # The first name at parenthesis depth 0: a parameter's type such as
        # void (*cb)(int) is not the function, nor is an attribute.
        depth = header.count("(", 0, m.start()) - header.count(")", 0, m.start())
        if depth == 0 and m.group(1).split("::")[-1] not in NOT_NAMES:
            return m.group(1)
    return None


def functions(lines):
    """(name, first line (1-based), length in lines) of each function in a
    file's lines; length -1 when its closing brace was not found."""
    out = []
    i = 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        start, header = header_before(lines, i)
        name = function_name(header)
        if name is None:
            i += 1
            continue
        close = re.compile("^" + re.escape(m.group(1)) + r"\}")
        end = i + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        if end == len(lines):
            out.append((name, start + 1, -1))
            return out
        out.append((name, start + 1, end - start + 1))
        i = end + 1
    return out


def read_lines(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def check(path, lines):
    """The violations in one file, one line each."""
    out = []
    if len(lines) > MAX_FILE_LINES and path not in FILE_EXCEPTIONS:
        out.append(f"{path}: {len(lines)} lines (limit {MAX_FILE_LINES})")
    for name, line, length in functions(lines):
        if length < 0:
            out.append(f"{path}:{line}: {name}: no closing brace at its opening brace's "
                       "indentation (not clang-format's layout?)")
        elif length > MAX_FUNCTION_LINES:
            out.append(f"{path}:{line}: {name}: {length} lines (limit {MAX_FUNCTION_LINES})")
    return out


SELFTEST = """\
#include "x.h"

/* A comment. */
static struct thing *long_one(int a,
                              int b)
{
    if (a) {
        return 0;
    }
    {
        int scoped = 1;
    }
BODY}

static const int table[] = {
    1,
};

enum kind kind_of(void (*cb)(int), int x)
{
    return 0;
}

static const struct s init =
{
};

#ifdef A
int variant(int a)
#else
int variant(long a)
#endif
{
}

namespace
{

template <typename T> __global__ void __launch_bounds__(256) kernel(T *x)
{
}

class Store : public Base
{
  public:
    Store(int x) : x_(x)
    {
    }
    std::vector<char> get(const std::string &key) override
    {
BODY    }
};

} // namespace

static inline int one_line(void) { return 1; }

struct unclosed *broken(void)
{
    return 0;
"""


def selftest():
    body = "    x++;\n" * 150
    lines = SELFTEST.replace("BODY", body).split("\n")
    got = [(n, ln) for n, ln, _ in functions(lines)]
    want = ["long_one", "kind_of", "variant", "kernel", "Store", "get", "broken"]
    names = [n for n, _ in got]
    failed = names != want
    if failed:
        print(f"sizes selftest: found {names}, expected {want}")
    found = dict((n, (ln, le)) for n, ln, le in functions(lines))
    # long_one: signature (2 lines), brace, 6 lines of blocks, 150 of body, brace.
    if found.get("long_one") != (4, 160):
        print(f"sizes selftest: long_one at {found.get('long_one')}, expected (4, 160)")
        failed = True
    report = check("x.c", lines)
    expect = ["x.c:4: long_one: 160 lines (limit 150)", "x.c:", ": get: 153 lines (limit 150)",
              ": broken: no closing brace"]
    joined = "\n".join(report)
    for e in expect:
        if e not in joined:
            print(f"sizes selftest: expected '{e}' in:\n{joined}")
            failed = True
    if len(report) != 3:
        print(f"sizes selftest: expected 3 violations, got:\n{joined}")
        failed = True
    if check("rendezvous/state.c", ["x"] * 1300) or not check("a.c", ["x"] * 1201) \
            or check("a.c", ["x"] * 1200):
        print("sizes selftest: the file limit or its exception is wrong")
        failed = True
    if not failed:
        print("sizes selftest: ok")
    return 1 if failed else 0


def main(argv):
    if argv[:1] == ["--selftest"]:
        return selftest()
    listing = argv[:1] == ["--list"]
    bad = 0
    for path in argv[1:] if listing else argv:
        try:
            lines = read_lines(path)
        except OSError as e:
            print(f"{path}: cannot read: {e.strerror}")
            bad += 1
            continue
        if listing:
            for name, line, length in functions(lines):
                print(f"{path}:{line}: {name}: {length}")
            continue
        for v in check(path, lines):
            print(v)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
