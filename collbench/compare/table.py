"""The comparison's rows and how they print: the table (through collbench/tables.py), CSV, JSON, TSV.

A row is one (op, algorithm, size): measured ("ok": every block measured it), failed (a job said
why), or skipped (a documented constraint says the algorithm cannot run as itself there). A
measured row carries its block samples (`samples_us`, one job's average latency per block) and,
against `default` at that size, the speed-up with its 95 % interval (`speedup`, `ci_low`,
`ci_high`: compare/stats.py). `win` marks an interval wholly above 1; `chosen` the row the tuning
file selects for that size (a forced algorithm proven above 1 + margin, else `default`: the file
keeps the library's choice). `fastest` is the lowest median latency, for reference only: a
fastest row that is not proven is noise as far as the file is concerned. A `rules` row (the
tuning file loaded) carries its gain over default from the file's own check.
"""

import json
import math

from collbench import tables
from collbench.compare import stats
from collbench.engines.algorithms import DEFAULT, RULES
from collbench.engines import mpi_flavour
from collbench.ops import get_op
from collbench.sizes import format_size

OK, FAILED, SKIPPED = "ok", "failed", "skipped"

CSV_FIELDS = ("op", "algorithm", "size_bytes", "count", "datatype", "avg_ms", "min_ms", "max_ms",
              "algbw_GBps", "busbw_GBps", "validation", "status", "fastest", "speedup_vs_default",
              "reason", "blocks", "speedup", "ci_low", "ci_high", "win", "chosen")


def make_row(op, algorithm, size_bytes, count, datatype, status, record=None, reason=""):
    row = {"op": op, "algorithm": algorithm, "size_bytes": size_bytes, "count": count,
           "datatype": datatype, "status": status, "reason": reason, "fastest": False,
           "speedup_vs_default": None, "avg_us": None, "min_us": None, "max_us": None,
           "algbw_bytes_per_s": None, "busbw_bytes_per_s": None, "validation": None, "runs": 1,
           "blocks": 0, "samples_us": [], "speedup": None, "ci_low": None, "ci_high": None,
           "win": False, "chosen": False}
    if record is not None and status == OK:
        row.update(avg_us=record.get("latency_avg_us"), min_us=record.get("latency_min_us"),
                   max_us=record.get("latency_max_us"), algbw_bytes_per_s=record.get("algbw_bytes_per_s"),
                   busbw_bytes_per_s=record.get("busbw_bytes_per_s"), validation=record.get("validation"))
        row["samples_us"] = [row["avg_us"]] if row["avg_us"] else []
        row["blocks"] = 1
    return row


def usable(row):
    return row["status"] == OK and bool(row["avg_us"]) and row["validation"] != "fail"


def candidate(row):
    """A forced algorithm's measured row: what the tuning file may select."""
    return row["algorithm"] not in (DEFAULT, RULES) and usable(row)


def annotate(rows, margin=stats.DEFAULT_MARGIN, flavour=mpi_flavour.OPENMPI):
    """Speed-ups with intervals, wins, the fastest and the chosen row per (op, size), in place."""
    groups = {}
    for row in rows:
        row.update(fastest=False, speedup_vs_default=None, speedup=None, ci_low=None, ci_high=None,
                   win=False, chosen=False)
        groups.setdefault((row["op"], row["size_bytes"]), []).append(row)
    for group in groups.values():
        default = next((r for r in group if r["algorithm"] == DEFAULT and usable(r)), None)
        # every forced algorithm at a size is a try at a win: the intervals are simultaneous
        # (Bonferroni), so the chance that any of them lies above 1 by luck stays 5 %
        tries = max(1, sum(1 for r in group if candidate(r)))
        confidence = 1.0 - (1.0 - stats.CONFIDENCE) / tries
        for r in group:
            if not usable(r):
                continue
            if r["algorithm"] == DEFAULT:
                r["speedup"] = 1.0
                continue
            baseline = r.get("baseline_us") or (default["samples_us"] if default else None)
            if baseline:
                r["speedup"], r["ci_low"], r["ci_high"] = stats.speedup_interval(
                    baseline, r["samples_us"], confidence=confidence if r["algorithm"] != RULES else stats.CONFIDENCE)
                r["win"] = stats.win(r)
            r["speedup_vs_default"] = r["speedup"]
        measured = [r for r in group if r["algorithm"] != RULES and usable(r)]
        if measured:
            min(measured, key=lambda r: r["avg_us"])["fastest"] = True
    if flavour == mpi_flavour.MPICH:
        _choose_mpich(rows, groups, margin)
    else:
        for group in groups.values():
            chosen = stats.choose(group, margin, candidate)
            if chosen is not None and (chosen["algorithm"] != DEFAULT or usable(chosen)):
                chosen["chosen"] = True
    return rows


def _choose_mpich(rows, groups, margin):
    for op in dict.fromkeys(r["op"] for r in rows):
        by_size = {size: {r["algorithm"]: r for r in g if candidate(r)}
                   for (o, size), g in groups.items() if o == op}
        name = stats.mpich_choice(by_size, margin)
        for (o, size), group in groups.items():
            if o != op:
                continue
            pick = next((r for r in group if r["algorithm"] == (name or DEFAULT) and
                         (name is None or candidate(r))), None)
            if pick is not None:
                pick["chosen"] = True


def per_size(rows):
    """[(op, size_bytes, chosen row or None, default row or None, best other row or None)] in row
    order; the best other row: the forced algorithm with the highest speed-up there."""
    out, seen = [], set()
    for row in rows:
        key = (row["op"], row["size_bytes"])
        if key in seen:
            continue
        seen.add(key)
        group = [r for r in rows if (r["op"], r["size_bytes"]) == key]
        chosen = next((r for r in group if r["chosen"]), None)
        default = next((r for r in group if r["algorithm"] == DEFAULT and usable(r)), None)
        others = [r for r in group if candidate(r) and r["speedup"] is not None]
        best = max(others, key=lambda r: r["speedup"]) if others else None
        out.append((row["op"], row["size_bytes"], chosen, default, best))
    return out


def fastest(rows):
    """[(op, size_bytes, fastest row, default row or None)] in row order (lowest median latency)."""
    return [(op, size, next(r for r in rows if (r["op"], r["size_bytes"]) == (op, size) and r["fastest"]), default)
            for op, size, _, default, _ in per_size(rows)
            if any((r["op"], r["size_bytes"]) == (op, size) and r["fastest"] for r in rows)]


def _ms(us):
    return "-" if us is None else f"{us / 1000:.3f}"


def _gbps(bps):
    return "-" if bps is None else f"{bps / 1e9:.3f}"


def interval_text(row):
    """'1.23x [1.10, 1.35]', '1.23x' without an interval, '' without a speed-up."""
    if row.get("speedup") is None or row["algorithm"] == DEFAULT:
        return ""
    text = f"{row['speedup']:.2f}x"
    if row.get("ci_low") is not None:
        text += f" [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    return text


def mark_text(row):
    if row["algorithm"] == DEFAULT:
        return "keep" if row["chosen"] else ""
    if row["algorithm"] == RULES:
        return "win" if row["win"] else ""
    return "win, rule" if row["chosen"] else "win" if row["win"] else ""


def _label(row, rules_name=None):
    if row["algorithm"] == RULES and rules_name:
        return f"rules ({rules_name})"
    return row["algorithm"]


COLUMNS = (
    tables.Column("label", "Algorithm", "left"),
    tables.Column("size_bytes", "Size(B)"),
    tables.Column("count", "Count"),
    tables.Column("avg_us", "Avg(ms)", fmt=_ms),
    tables.Column("min_us", "Min(ms)", fmt=_ms),
    tables.Column("max_us", "Max(ms)", fmt=_ms),
    tables.Column("algbw_bytes_per_s", "AlgoBW(GB/s)", fmt=_gbps),
    tables.Column("busbw_bytes_per_s", "BusBW(GB/s)", fmt=_gbps),
    tables.Column("validation", "Valid", "left", fmt=lambda v: v or "off"),
    tables.Column("blocks", "Blocks"),
    tables.Column("interval", "vs default [95% CI]", "left"),
    tables.Column("mark", "Mark", "left"),
)


def render_table(rows, title_lines=(), rules_name=None, margin=stats.DEFAULT_MARGIN):
    """One block per op, sizes ascending, one line per algorithm; then the choice per size."""
    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        op_rows = [r for r in rows if r["op"] == op]
        cells = []
        sizes = sorted(dict.fromkeys(r["size_bytes"] for r in op_rows))
        for i, size in enumerate(sizes):
            for r in [r for r in op_rows if r["size_bytes"] == size]:
                values = dict(r, label=_label(r, rules_name), interval=interval_text(r), mark=mark_text(r))
                if r["status"] != OK:
                    cells.append(tables.Span(values, f"{r['status'].upper()}: {r['reason']}", lead=3))
                else:
                    cells.append(values)
            if i < len(sizes) - 1:
                cells.append(tables.Span({}, "", lead=0))   # a blank line between sizes
        datatypes = "/".join(sorted({r["datatype"] for r in op_rows if r["datatype"]}))
        out.append(f"{get_op(op).title} ({datatypes})")
        out += list(title_lines)
        out += tables.table_lines(COLUMNS, cells)
        out.append("")
        out += choice_lines(op_rows, margin)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


# the choice per size: the size, what the file does there, why (no heading: a title line above)
CHOICE_COLUMNS = (tables.Column("size", width=6, fmt=format_size), tables.Column("choice", align="left", width=21),
                  tables.Column("why", align="left"))


def choice_lines(op_rows, margin):
    """Per size: what the tuning file does there and why."""
    rows = []
    for _, size, chosen, default, best in per_size(op_rows):
        if default is None:
            rows.append(tables.Span({"size": size}, "default not measured: no choice"))
        elif chosen is not None and chosen["algorithm"] != DEFAULT:
            rows.append({"size": size, "choice": chosen["algorithm"], "why": interval_text(chosen)})
        elif best is None:
            rows.append({"size": size, "choice": "keep default", "why": "(no other algorithm measured)"})
        elif best["ci_low"] is None:
            rows.append({"size": size, "choice": "keep default", "why": f"best {best['algorithm']} "
                         f"{interval_text(best)}: no interval (at least 2 blocks needed)"})
        elif stats.proven(best, margin):
            rows.append({"size": size, "choice": "keep default", "why": f"{best['algorithm']} {interval_text(best)} "
                         "is proven here but the MPICH file forces one algorithm for all sizes"})
        else:
            rows.append({"size": size, "choice": "keep default", "why": f"best {best['algorithm']} "
                         f"{interval_text(best)}: not proven above {1 + margin:.2f}x"})
    return ([f"Choice per size (forced only where the interval lies above {1 + margin:.2f}x):"]
            + tables.table_lines(CHOICE_COLUMNS, rows, indent="  ", rule=False, heading=False))


def _num(x, spec):
    return "" if x is None else format(x, spec)


def _csv_row(r):
    return {"op": r["op"], "algorithm": r["algorithm"], "size_bytes": r["size_bytes"],
            "count": r["count"], "datatype": r["datatype"],
            "avg_ms": "" if r["avg_us"] is None else f"{r['avg_us'] / 1000:.6g}",
            "min_ms": "" if r["min_us"] is None else f"{r['min_us'] / 1000:.6g}",
            "max_ms": "" if r["max_us"] is None else f"{r['max_us'] / 1000:.6g}",
            "algbw_GBps": "" if r["algbw_bytes_per_s"] is None else f"{r['algbw_bytes_per_s'] / 1e9:.6g}",
            "busbw_GBps": "" if r["busbw_bytes_per_s"] is None else f"{r['busbw_bytes_per_s'] / 1e9:.6g}",
            "validation": r["validation"] or "", "status": r["status"],
            "fastest": "yes" if r["fastest"] else "",
            "speedup_vs_default": _num(r["speedup_vs_default"], ".4g"),
            "reason": " ".join(str(r["reason"]).split()), "blocks": r.get("blocks", 0),
            "speedup": _num(r["speedup"], ".4g"), "ci_low": _num(r["ci_low"], ".4g"),
            "ci_high": _num(r["ci_high"], ".4g"), "win": "yes" if r["win"] else "",
            "chosen": "yes" if r["chosen"] else ""}


def render_csv(rows):
    return tables.csv_text([tables.Column(name) for name in CSV_FIELDS], [_csv_row(r) for r in rows],
                           cell=lambda v: v)


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def render_json(rows, meta):
    doc = dict(meta)
    doc["rows"] = [{k: _finite(v) for k, v in r.items() if k != "baseline_us"} for r in rows]
    doc["fastest"] = [{"op": op, "size_bytes": size, "algorithm": best["algorithm"],
                       "busbw_bytes_per_s": best["busbw_bytes_per_s"],
                       "default_busbw_bytes_per_s": default["busbw_bytes_per_s"] if default else None,
                       "speedup_vs_default": best["speedup_vs_default"]}
                      for op, size, best, default in fastest(rows)]
    doc["chosen"] = [{"op": op, "size_bytes": size, "algorithm": chosen["algorithm"] if chosen else None,
                      "speedup": chosen["speedup"] if chosen else None,
                      "ci_low": chosen["ci_low"] if chosen else None,
                      "ci_high": chosen["ci_high"] if chosen else None}
                     for op, size, chosen, _, _ in per_size([r for r in rows if r["algorithm"] != RULES])]
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


TSV_FIELDS = ("run_id", "op", "algorithm", "size", "size_bytes", "count", "datatype", "ranks",
              "timing", "latency_avg_us", "latency_min_us", "latency_max_us", "algbw_GBps",
              "busbw_GBps", "validation", "status", "fastest", "speedup_vs_default", "reason",
              "blocks", "speedup", "ci_low", "ci_high", "win", "chosen")


def tsv_lines(rows, run_id, ranks, timing):
    yield "\t".join(TSV_FIELDS) + "\n"
    for r in rows:
        c = _csv_row(r)
        values = dict(c, run_id=run_id, size=format_size(r["size_bytes"]) if r["size_bytes"] else "-",
                      ranks=ranks, timing=timing,
                      latency_avg_us="" if r["avg_us"] is None else f"{r['avg_us']:.6g}",
                      latency_min_us="" if r["min_us"] is None else f"{r['min_us']:.6g}",
                      latency_max_us="" if r["max_us"] is None else f"{r['max_us']:.6g}")
        yield "\t".join(" ".join(str(values[k]).split()) for k in TSV_FIELDS) + "\n"
