"""collbench.tables: the one table renderer and value formatters every --format table uses."""

import csv
import io
import json

from collbench.tables import (Column, Span, format_bytes, format_gb_per_s, format_size, format_us, render,
                              table_lines)

COLS = [Column("size"), Column("avg", fmt=format_us), Column("valid", align="left")]
ROWS = [{"size": "4KB", "avg": 12.345, "valid": "pass"}, {"size": "1MB", "avg": 2500.0, "valid": "off"},
        Span({"size": "64MB"}, "FAILED: boom")]


def test_text_table_aligns_by_column_and_spans_failed_rows():
    lines = table_lines(COLS, ROWS, indent="  ")
    assert lines == ["  size       avg  valid",
                     "  ----  --------  -----",
                     "   4KB  12.35 us  pass",
                     "   1MB   2.50 ms  off",
                     "  64MB  FAILED: boom"]
    assert all(ln == ln.rstrip() for ln in lines)


def test_render_title_and_no_rule():
    text = render(COLS, ROWS[:1], title="Allreduce", rule=False)
    assert text == "Allreduce\nsize       avg  valid\n 4KB  12.35 us  pass\n"


def test_csv_and_json_carry_the_values_not_the_text():
    rows = list(csv.reader(io.StringIO(render(COLS, ROWS, "csv"))))
    assert rows == [["size", "avg", "valid"], ["4KB", "12.345", "pass"], ["1MB", "2500", "off"]]
    doc = json.loads(render(COLS, ROWS, "json"))
    assert doc == [{"size": "4KB", "avg": 12.345, "valid": "pass"}, {"size": "1MB", "avg": 2500.0, "valid": "off"}]


def test_render_writes_to_out_and_markdown_escapes_pipes():
    out = io.StringIO()
    text = render([Column("a", "A|B")], [{"a": "x|y"}], "markdown", out=out)
    assert out.getvalue() == text == "| A\\|B |\n| ---- |\n| x\\|y |\n"


def test_formatters():
    assert [format_us(v) for v in (None, 12.345, 5870.0, 1.2e6)] == ["-", "12.35 us", "5.87 ms", "1.20 s"]
    assert format_us(5870.0, scaled_digits=3) == "5.870 ms"
    assert [format_gb_per_s(v) for v in (None, 12.5e9, 0.05e9)] == ["-", "12.50", "0.0500"]
    assert format_gb_per_s(12.345e9, significant=4) == "12.35"
    assert [format_size(n) for n in (4 << 20, 1000, 1536)] == ["4MB", "1000B", "1536B"]
    assert [format_bytes(n) for n in (512 << 20, int(28.2 * (1 << 20)), 10)] == ["512MB", "28.2MB", "10B"]


def test_chart_ticks_use_the_same_formatters():
    from collbench.report.chart import format_gbps, format_us as tick_us
    assert [tick_us(v) for v in (0.5, 1, 250, 1500, 2e6)] == ["500 ns", "1 µs", "250 µs", "1.5 ms", "2 s"]
    assert tick_us(250) == format_us(250, significant=3, micro="µs")
    assert [format_gbps(v) for v in (0.123456, 12.5)] == ["0.123", "12.5"]
