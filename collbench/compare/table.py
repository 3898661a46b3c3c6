"""The comparison's rows and how they print: seed 004's table, CSV, JSON, TSV.

A row is one (op, algorithm, size): measured ("ok"), failed (the job said why), or skipped (a
documented constraint says the algorithm cannot run as itself there). Per (op, size) the fastest
measured row (lowest average latency, validation not failed, the rules check left out) is marked
with its speed-up over the library's default; a rules row shows its own gain over default.
"""

import csv
import io
import json

from collbench.engines.algorithms import DEFAULT, RULES
from collbench.ops import get_op
from collbench.sizes import format_size

OK, FAILED, SKIPPED = "ok", "failed", "skipped"

CSV_FIELDS = ("op", "algorithm", "size_bytes", "count", "datatype", "avg_ms", "min_ms", "max_ms",
              "algbw_GBps", "busbw_GBps", "validation", "status", "fastest", "speedup_vs_default",
              "reason")


def make_row(op, algorithm, size_bytes, count, datatype, status, record=None, reason=""):
    row = {"op": op, "algorithm": algorithm, "size_bytes": size_bytes, "count": count,
           "datatype": datatype, "status": status, "reason": reason, "fastest": False,
           "speedup_vs_default": None, "avg_us": None, "min_us": None, "max_us": None,
           "algbw_bytes_per_s": None, "busbw_bytes_per_s": None, "validation": None, "runs": 1}
    if record is not None and status == OK:
        row.update(avg_us=record.get("latency_avg_us"), min_us=record.get("latency_min_us"),
                   max_us=record.get("latency_max_us"), algbw_bytes_per_s=record.get("algbw_bytes_per_s"),
                   busbw_bytes_per_s=record.get("busbw_bytes_per_s"), validation=record.get("validation"))
    return row


def _usable(row):
    return row["status"] == OK and row["avg_us"] and row["validation"] != "fail"


def annotate(rows):
    """Mark the fastest row per (op, size) and every speed-up over default, in place."""
    groups = {}
    for row in rows:
        row["fastest"], row["speedup_vs_default"] = False, None
        groups.setdefault((row["op"], row["size_bytes"]), []).append(row)
    for group in groups.values():
        default = next((r for r in group if r["algorithm"] == DEFAULT and _usable(r)), None)
        candidates = [r for r in group if r["algorithm"] != RULES and _usable(r)]
        if candidates:
            best = min(candidates, key=lambda r: r["avg_us"])
            best["fastest"] = True
        for r in group:
            if default and _usable(r) and (r.get("fastest") or r["algorithm"] == RULES):
                r["speedup_vs_default"] = default["avg_us"] / r["avg_us"]
    return rows


def fastest(rows):
    """[(op, size_bytes, fastest row, default row or None)] in row order."""
    out = []
    seen = set()
    for row in rows:
        key = (row["op"], row["size_bytes"])
        if key in seen:
            continue
        seen.add(key)
        group = [r for r in rows if (r["op"], r["size_bytes"]) == key]
        best = next((r for r in group if r["fastest"]), None)
        default = next((r for r in group if r["algorithm"] == DEFAULT and _usable(r)), None)
        if best is not None:
            out.append((row["op"], row["size_bytes"], best, default))
    return out


def _ms(us):
    return "-" if us is None else f"{us / 1000:.3f}"


def _gbps(bps):
    return "-" if bps is None else f"{bps / 1e9:.3f}"


def _label(row, rules_name=None):
    if row["algorithm"] == RULES and rules_name:
        return f"rules ({rules_name})"
    return row["algorithm"]


HEADER = ("Algorithm", "Size(B)", "Count", "Avg(ms)", "Min(ms)", "Max(ms)", "AlgoBW(GB/s)",
          "BusBW(GB/s)", "Valid", "Fastest")


def render_table(rows, title_lines=(), rules_name=None):
    """Seed 004's table, one block per op, sizes ascending, one line per algorithm."""
    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        op_rows = [r for r in rows if r["op"] == op]
        cells = []
        for size in sorted(dict.fromkeys(r["size_bytes"] for r in op_rows)):
            for r in [r for r in op_rows if r["size_bytes"] == size]:
                head = [_label(r, rules_name), str(r["size_bytes"]), str(r["count"])]
                if r["status"] != OK:
                    cells.append(head + [f"{r['status'].upper()}: {r['reason']}"])
                    continue
                mark = ""
                if r["fastest"]:
                    mark = "*" + (f" {r['speedup_vs_default']:.2f}x"
                                  if r["speedup_vs_default"] and r["algorithm"] != DEFAULT else "")
                elif r["algorithm"] == RULES and r["speedup_vs_default"]:
                    mark = f"  {r['speedup_vs_default']:.2f}x"
                cells.append(head + [_ms(r["avg_us"]), _ms(r["min_us"]), _ms(r["max_us"]),
                                     _gbps(r["algbw_bytes_per_s"]), _gbps(r["busbw_bytes_per_s"]),
                                     r["validation"] or "off", mark])
            cells.append(None)   # a blank line between sizes
        widths = [len(h) for h in HEADER]
        for c in cells:
            if c and len(c) == len(HEADER):
                widths = [max(w, len(v)) for w, v in zip(widths, c)]
            elif c:
                widths[0] = max(widths[0], len(c[0]))

        def fmt(c):
            if len(c) < len(HEADER):      # SKIPPED / FAILED: the reason spans the rest
                return "  ".join([c[0].ljust(widths[0]), c[1].rjust(widths[1]), c[2].rjust(widths[2]), c[3]])
            parts = [c[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(c[1:8], widths[1:8])]
            parts += [c[8].ljust(widths[8]), c[9]]
            return "  ".join(parts).rstrip()

        datatypes = "/".join(sorted({r["datatype"] for r in op_rows if r["datatype"]}))
        out.append(f"{get_op(op).title} ({datatypes})")
        out += list(title_lines)
        out.append(fmt(list(HEADER)))
        out.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
        out += [fmt(c) if c else "" for c in cells[:-1]]
        out.append("")
        summary = [s for s in fastest(op_rows)]
        if summary:
            out.append("Fastest per size (busbw; default's deficit against it):")
            for _, size, best, default in summary:
                line = f"  {format_size(size):>6}  {best['algorithm']:<24} {_gbps(best['busbw_bytes_per_s']):>8} GB/s"
                if default is not None and best is not default:
                    deficit = 1 - best["avg_us"] / default["avg_us"]
                    line += f"   default {_gbps(default['busbw_bytes_per_s'])} GB/s ({deficit * 100:.0f}% below)"
                elif best is default:
                    line += "   (default is the fastest)"
                out.append(line)
            out.append("")
    return "\n".join(out).rstrip() + "\n"


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
            "speedup_vs_default": "" if r["speedup_vs_default"] is None else f"{r['speedup_vs_default']:.4g}",
            "reason": " ".join(str(r["reason"]).split())}


def render_csv(rows):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(_csv_row(r))
    return buf.getvalue()


def render_json(rows, meta):
    doc = dict(meta)
    doc["rows"] = rows
    doc["fastest"] = [{"op": op, "size_bytes": size, "algorithm": best["algorithm"],
                       "busbw_bytes_per_s": best["busbw_bytes_per_s"],
                       "default_busbw_bytes_per_s": default["busbw_bytes_per_s"] if default else None,
                       "speedup_vs_default": best["speedup_vs_default"]}
                      for op, size, best, default in fastest(rows)]
    return json.dumps(doc, indent=2) + "\n"


TSV_FIELDS = ("run_id", "op", "algorithm", "size", "size_bytes", "count", "datatype", "ranks",
              "timing", "latency_avg_us", "latency_min_us", "latency_max_us", "algbw_GBps",
              "busbw_GBps", "validation", "status", "fastest", "speedup_vs_default", "reason")


def tsv_lines(rows, run_id, ranks, timing):
    yield "\t".join(TSV_FIELDS) + "\n"
    for r in rows:
        c = _csv_row(r)
        values = {"run_id": run_id, "op": r["op"], "algorithm": r["algorithm"],
                  "size": format_size(r["size_bytes"]) if r["size_bytes"] else "-",
                  "size_bytes": r["size_bytes"], "count": r["count"], "datatype": r["datatype"],
                  "ranks": ranks, "timing": timing,
                  "latency_avg_us": "" if r["avg_us"] is None else f"{r['avg_us']:.6g}",
                  "latency_min_us": "" if r["min_us"] is None else f"{r['min_us']:.6g}",
                  "latency_max_us": "" if r["max_us"] is None else f"{r['max_us']:.6g}",
                  "algbw_GBps": c["algbw_GBps"], "busbw_GBps": c["busbw_GBps"],
                  "validation": c["validation"], "status": r["status"], "fastest": c["fastest"],
                  "speedup_vs_default": c["speedup_vs_default"], "reason": c["reason"]}
        yield "\t".join(" ".join(str(values[k]).split()) for k in TSV_FIELDS) + "\n"
