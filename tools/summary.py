#!/usr/bin/env python3
"""Adds up meson's testlog.json files and pytest's JUnit XML files into one
closing line, 'N passed, N failed, N skipped', and exits 1 if anything failed.

Usage: summary.py FILE...  (missing files count as one failure each: a
stage that did not produce its report did not pass)."""
import json
import sys
import xml.etree.ElementTree as ET


def meson_counts(path):
    p = f = s = 0
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line).get("result", "")
            if r in ("OK", "EXPECTEDFAIL"):
                p += 1
            elif r == "SKIP":
                s += 1
            else:
                f += 1
    return p, f, s


def junit_counts(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    p = f = s = 0
    for st in suites:
        tests = int(st.get("tests", 0))
        fail = int(st.get("failures", 0)) + int(st.get("errors", 0))
        skip = int(st.get("skipped", 0))
        p += tests - fail - skip
        f += fail
        s += skip
    return p, f, s


def main(paths):
    tp = tf = ts = 0
    for path in paths:
        try:
            c = meson_counts(path) if path.endswith(".json") else junit_counts(path)
        except (OSError, ValueError, ET.ParseError) as e:
            print(f"summary: {path}: no report ({e}); counted as a failure")
            c = (0, 1, 0)
        print(f"summary: {path}: {c[0]} passed, {c[1]} failed, {c[2]} skipped")
        tp, tf, ts = tp + c[0], tf + c[1], ts + c[2]
    print(f"{tp} passed, {tf} failed, {ts} skipped")
    return 1 if tf else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
