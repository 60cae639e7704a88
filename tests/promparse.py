"""A strict parser for the Prometheus text exposition format 0.0.4, for tests.

Stricter than Prometheus itself, on purpose: what passes here is accepted by
every scraper. It rejects

  - a sample whose metric has no TYPE line before it;
  - invalid metric or label names, and label names starting with "__";
  - HELP or TYPE given twice, or after the family's first sample;
  - escapes other than \\\\ and \\n in HELP, and \\\\, \\" and \\n in label values;
  - ungrouped samples (a family that reappears after another one started);
  - the same series (name + label set) twice, a label given twice;
  - values that are not Go floats (NaN, +Inf, -Inf, decimal), timestamps
    that are not integers, missing final newline, \\r, invalid UTF-8;
  - negative counters, histogram buckets without le / +Inf / not cumulative,
    summary quantiles without a quantile label.

With conventions=True it also checks our naming rules (docs/status.md):
every family has HELP, names start with "cddp_", counters end in "_total".

    fams = promparse.parse(text)          # {name: Family}
    fams["cddp_agent_ready"].samples[0].value
    promparse.value(fams, "cddp_agent_workers", state="running")
"""
import math
import re

METRIC_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
FLOAT_RE = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|NaN)\Z")
INT_RE = re.compile(r"-?\d+\Z")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


class PromParseError(ValueError):
    def __init__(self, lineno, msg, line=""):
        super().__init__(f"line {lineno}: {msg}" + (f": {line!r}" if line else ""))
        self.lineno = lineno


class Sample:
    def __init__(self, name, labels, value, timestamp):
        self.name = name
        self.labels = labels
        self.value = value
        self.timestamp = timestamp

    def __repr__(self):
        return f"Sample({self.name}, {self.labels}, {self.value})"


class Family:
    def __init__(self, name):
        self.name = name
        self.type = None
        self.help = None
        self.samples = []


def _unescape(s, allowed, lineno, what):
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            if i + 1 >= len(s) or s[i + 1] not in allowed:
                raise PromParseError(lineno, f"invalid escape in {what}", s)
            out.append(allowed[s[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _parse_labels(s, lineno):
    """s starts after '{'; returns (labels, rest after '}')."""
    labels = {}
    i = 0
    while True:
        if i < len(s) and s[i] == "}":
            return labels, s[i + 1:]
        m = re.match(r"([^=\s{}\",]*)=\"", s[i:])
        if not m:
            raise PromParseError(lineno, "expected label=\"value\"", s)
        name = m.group(1)
        if not LABEL_RE.match(name) or name.startswith("__"):
            raise PromParseError(lineno, f"invalid label name {name!r}")
        if name in labels:
            raise PromParseError(lineno, f"label {name!r} given twice")
        i += m.end()
        raw = []
        while True:
            if i >= len(s):
                raise PromParseError(lineno, "unterminated label value", s)
            c = s[i]
            if c == "\\":
                if i + 1 >= len(s) or s[i + 1] not in ('\\', '"', 'n'):
                    raise PromParseError(lineno, "invalid escape in label value", s)
                raw.append({"\\": "\\", '"': '"', "n": "\n"}[s[i + 1]])
                i += 2
                continue
            if c == '"':
                i += 1
                break
            if c == "\n":
                raise PromParseError(lineno, "newline in label value", s)
            raw.append(c)
            i += 1
        labels[name] = "".join(raw)
        if i < len(s) and s[i] == ",":
            i += 1
        elif i < len(s) and s[i] == "}":
            pass
        else:
            raise PromParseError(lineno, "expected , or } after a label", s)


def _float(tok, lineno):
    if not FLOAT_RE.match(tok):
        raise PromParseError(lineno, f"invalid value {tok!r}")
    return float(tok.replace("Inf", "inf").replace("NaN", "nan"))


def _family_of(name, families):
    """The TYPEd family a sample name belongs to, or None."""
    f = families.get(name)
    if f is not None and f.type is not None and f.type not in ("histogram",):
        return f
    for suffix, types in (("_bucket", ("histogram",)), ("_sum", ("histogram", "summary")),
                          ("_count", ("histogram", "summary"))):
        if name.endswith(suffix):
            base = families.get(name[: -len(suffix)])
            if base is not None and base.type in types:
                return base
    if f is not None and f.type == "histogram":
        return None  # a bare histogram name is not a sample
    return None


def parse(text, conventions=False, prefix="cddp_"):
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise PromParseError(0, f"not UTF-8: {e}")
    if text and not text.endswith("\n"):
        raise PromParseError(text.count("\n") + 1, "the last line does not end with a newline")
    if "\r" in text:
        raise PromParseError(text[: text.index("\r")].count("\n") + 1, "carriage return")
    families = {}
    order = []  # families in the order their group started
    closed = set()
    current = None
    seen_series = set()

    def group(fam, lineno, line):
        nonlocal current
        if current is fam:
            return
        if fam.name in closed:
            raise PromParseError(lineno, f"{fam.name} is not grouped (it appeared before)", line)
        if current is not None:
            closed.add(current.name)
        current = fam
        order.append(fam.name)

    for lineno, line in enumerate(text.split("\n")[:-1] if text else [], 1):
        if line.strip() == "":
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] in ("HELP", "TYPE"):
                if len(parts) < 3:
                    raise PromParseError(lineno, f"{parts[1]} without a metric name", line)
                name = parts[2]
                if not METRIC_RE.match(name):
                    raise PromParseError(lineno, f"invalid metric name {name!r}", line)
                fam = families.setdefault(name, Family(name))
                if fam.samples:
                    raise PromParseError(lineno, f"{parts[1]} for {name} after its samples", line)
                group(fam, lineno, line)
                if parts[1] == "HELP":
                    if fam.help is not None:
                        raise PromParseError(lineno, f"second HELP for {name}", line)
                    m = re.match(r"# HELP \S+(?: (.*))?\Z", line)
                    if not m:
                        raise PromParseError(lineno, "malformed HELP line", line)
                    fam.help = _unescape(m.group(1) or "", {"\\": "\\", "n": "\n"}, lineno, "HELP")
                else:
                    if fam.type is not None:
                        raise PromParseError(lineno, f"second TYPE for {name}", line)
                    if len(parts) != 4 or parts[3] not in TYPES:
                        raise PromParseError(lineno, "TYPE must be one of " + ", ".join(TYPES), line)
                    if not re.match(r"# TYPE \S+ \S+\Z", line):
                        raise PromParseError(lineno, "malformed TYPE line", line)
                    fam.type = parts[3]
            continue  # any other comment

        m = re.match(r"([^{\s]+)", line)
        name = m.group(1) if m else ""
        if not METRIC_RE.match(name):
            raise PromParseError(lineno, f"invalid metric name {name!r}", line)
        rest = line[len(name):]
        labels = {}
        if rest.startswith("{"):
            labels, rest = _parse_labels(rest[1:], lineno)
        if not rest or rest[0] not in " \t":
            raise PromParseError(lineno, "expected whitespace before the value", line)
        toks = rest.split()
        if len(toks) not in (1, 2):
            raise PromParseError(lineno, "expected a value and an optional timestamp", line)
        value = _float(toks[0], lineno)
        ts = None
        if len(toks) == 2:
            if not INT_RE.match(toks[1]):
                raise PromParseError(lineno, f"invalid timestamp {toks[1]!r}", line)
            ts = int(toks[1])
        fam = _family_of(name, families)
        if fam is None:
            raise PromParseError(lineno, f"sample {name} has no TYPE", line)
        group(fam, lineno, line)
        key = (name, tuple(sorted(labels.items())))
        if key in seen_series:
            raise PromParseError(lineno, "the same series twice", line)
        seen_series.add(key)
        if fam.type == "counter" and not (value >= 0 or math.isnan(value)):
            raise PromParseError(lineno, "negative counter", line)
        if name.endswith("_bucket") and fam.type == "histogram" and "le" not in labels:
            raise PromParseError(lineno, "histogram bucket without le", line)
        if fam.type == "summary" and name == fam.name and "quantile" not in labels:
            raise PromParseError(lineno, "summary sample without quantile", line)
        fam.samples.append(Sample(name, labels, value, ts))

    for fam in families.values():
        if fam.type == "histogram":
            _check_histogram(fam)
        if conventions:
            if fam.help is None:
                raise PromParseError(0, f"{fam.name} has no HELP")
            if fam.type is None:
                raise PromParseError(0, f"{fam.name} has no TYPE")
            if not fam.name.startswith(prefix):
                raise PromParseError(0, f"{fam.name} does not start with {prefix}")
            if fam.type == "counter" and not fam.name.endswith("_total"):
                raise PromParseError(0, f"counter {fam.name} does not end in _total")
            if fam.type != "counter" and fam.name.endswith("_total"):
                raise PromParseError(0, f"{fam.name} ends in _total but is a {fam.type}")
    return families


def _check_histogram(fam):
    series = {}
    for s in fam.samples:
        if s.name.endswith("_bucket"):
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            series.setdefault(rest, []).append((_float(s.labels["le"], 0), s.value))
    for rest, buckets in series.items():
        buckets.sort()
        if not buckets or buckets[-1][0] != math.inf:
            raise PromParseError(0, f"{fam.name}{dict(rest)} has no le=\"+Inf\" bucket")
        counts = [c for _, c in buckets]
        if counts != sorted(counts):
            raise PromParseError(0, f"{fam.name}{dict(rest)} buckets are not cumulative")


def value(families, name, **labels):
    """The value of the one sample of `name` whose labels include `labels`."""
    for fam in families.values():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(f"no sample {name}{labels}")
