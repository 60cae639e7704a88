"""The strict Prometheus text parser (tests/promparse.py) must accept what the
format allows and reject what it does not, or the /metrics tests prove nothing."""
import math

import pytest

import promparse

GOOD = (
    "# HELP cddp_a_total Things, with a \\\\ and a\\nnewline.\n"
    "# TYPE cddp_a_total counter\n"
    'cddp_a_total{reason="x"} 1\n'
    'cddp_a_total{reason="y \\"q\\" \\\\ \\n",b="",} 2 1712345678000\n'
    "# random comment\n"
    "\n"
    "# TYPE cddp_b gauge\n"
    "# HELP cddp_b B.\n"
    "cddp_b NaN\n"
    "# HELP cddp_h H.\n"
    "# TYPE cddp_h histogram\n"
    'cddp_h_bucket{le="0.5"} 1\n'
    'cddp_h_bucket{le="+Inf"} 3\n'
    "cddp_h_sum 2.5\n"
    "cddp_h_count 3\n"
    "# HELP cddp_c C.\n"
    "# TYPE cddp_c gauge\n"
    "cddp_c -Inf\n"
    "cddp_c{x=\"1\"} +1.5e3\n"
)


def test_accepts_valid_text():
    fams = promparse.parse(GOOD, conventions=True)
    assert fams["cddp_a_total"].type == "counter"
    assert fams["cddp_a_total"].help == "Things, with a \\ and a\nnewline."
    s = fams["cddp_a_total"].samples[1]
    assert s.labels == {"reason": 'y "q" \\ \n', "b": ""}
    assert s.timestamp == 1712345678000
    assert math.isnan(fams["cddp_b"].samples[0].value)
    assert promparse.value(fams, "cddp_c", x="1") == 1500.0
    assert promparse.value(fams, "cddp_h_count") == 3
    assert list(fams) == ["cddp_a_total", "cddp_b", "cddp_h", "cddp_c"]


BAD = {
    "no TYPE": "cddp_x 1\n",
    "no TYPE, HELP only": "# HELP cddp_x X.\ncddp_x 1\n",
    "bad metric name": "# TYPE cddp-x gauge\ncddp-x 1\n",
    "name starts with digit": "# TYPE 1x gauge\n1x 1\n",
    "bad label name": '# TYPE x gauge\nx{a-b="1"} 1\n',
    "reserved label name": '# TYPE x gauge\nx{__name__="1"} 1\n',
    "label twice": '# TYPE x gauge\nx{a="1",a="2"} 1\n',
    "bad label escape": '# TYPE x gauge\nx{a="\\t"} 1\n',
    "unterminated label": '# TYPE x gauge\nx{a="1} 1\n',
    "unquoted label": "# TYPE x gauge\nx{a=1} 1\n",
    "bad HELP escape": "# HELP x a \\t b\n# TYPE x gauge\nx 1\n",
    "second HELP": "# HELP x a\n# HELP x b\n# TYPE x gauge\nx 1\n",
    "second TYPE": "# TYPE x gauge\n# TYPE x gauge\nx 1\n",
    "TYPE after samples": "# TYPE x gauge\nx 1\n# TYPE x gauge\n",
    "HELP after samples": "# TYPE x gauge\nx 1\n# HELP x late\n",
    "unknown type": "# TYPE x meter\nx 1\n",
    "ungrouped": "# TYPE x gauge\n# TYPE y gauge\nx 1\ny 1\nx{a=\"1\"} 2\n",
    "ungrouped after TYPE": "# TYPE x gauge\nx 1\n# TYPE y gauge\ny 1\n# HELP x again\n",
    "same series twice": "# TYPE x gauge\nx 1\nx 2\n",
    "same series, labels reordered": '# TYPE x gauge\nx{a="1",b="2"} 1\nx{b="2",a="1"} 2\n',
    "bad value": "# TYPE x gauge\nx one\n",
    "hex value": "# TYPE x gauge\nx 0x10\n",
    "lowercase inf": "# TYPE x gauge\nx inf\n",
    "bad timestamp": "# TYPE x gauge\nx 1 1.5\n",
    "extra token": "# TYPE x gauge\nx 1 2 3\n",
    "no value": "# TYPE x gauge\nx\n",
    "no final newline": "# TYPE x gauge\nx 1",
    "carriage return": "# TYPE x gauge\r\nx 1\r\n",
    "negative counter": "# TYPE x_total counter\nx_total -1\n",
    "bucket without le": "# TYPE h histogram\nh_bucket 1\nh_sum 1\nh_count 1\n",
    "no +Inf bucket": '# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n',
    "not cumulative": '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\n',
    "bare histogram sample": "# TYPE h histogram\nh 1\n",
    "summary without quantile": "# TYPE s summary\ns 1\n",
}


@pytest.mark.parametrize("why", sorted(BAD))
def test_rejects(why):
    with pytest.raises(promparse.PromParseError):
        promparse.parse(BAD[why])


def test_rejects_invalid_utf8():
    with pytest.raises(promparse.PromParseError):
        promparse.parse(b"# TYPE x gauge\nx{a=\"\xff\"} 1\n")


CONVENTIONS = {
    "no HELP": "# TYPE cddp_x gauge\ncddp_x 1\n",
    "no prefix": "# HELP x X.\n# TYPE x gauge\nx 1\n",
    "counter without _total": "# HELP cddp_x X.\n# TYPE cddp_x counter\ncddp_x 1\n",
    "gauge with _total": "# HELP cddp_x_total X.\n# TYPE cddp_x_total gauge\ncddp_x_total 1\n",
}


@pytest.mark.parametrize("why", sorted(CONVENTIONS))
def test_conventions(why):
    promparse.parse(CONVENTIONS[why])  # valid format...
    with pytest.raises(promparse.PromParseError):
        promparse.parse(CONVENTIONS[why], conventions=True)  # ...but not our naming
