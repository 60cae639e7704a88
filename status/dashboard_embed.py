#!/usr/bin/env python3
"""Turns status/dashboard.html into a C file (the build runs it): the page as
a NUL-terminated char array, status_dashboard_html, and its length. Bytes
are written in hex, so the page needs no C escaping.

Usage: dashboard_embed.py INPUT.html OUTPUT.c
"""
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: dashboard_embed.py INPUT.html OUTPUT.c")
    data = open(sys.argv[1], "rb").read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        sys.exit(f"{sys.argv[1]}: not UTF-8: {e}")
    if b"\0" in data:
        sys.exit(f"{sys.argv[1]}: contains a NUL byte")
    rows = []
    for i in range(0, len(data), 16):
        rows.append("    " + ", ".join(f"0x{b:02x}" for b in data[i:i + 16]) + ",")
    out = [
        "/* Generated from status/dashboard.html by status/dashboard_embed.py: do not edit. */",
        "#include \"status/dashboard.h\"",
        "",
        "const char status_dashboard_html[] = {",
        *rows,
        "    0x00,",
        "};",
        f"const size_t status_dashboard_html_len = {len(data)};",
        "",
    ]
    with open(sys.argv[2], "w") as fh:
        fh.write("\n".join(out))


if __name__ == "__main__":
    main()
