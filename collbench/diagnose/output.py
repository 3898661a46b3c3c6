"""The diagnosis as a table (regressions, then ranked suspects with their evidence) or as one
stable JSON document:

    {"format": "collbench-diagnosis", "version": 1, "verdict": "culprit" | "unexplained" | "no regression",
     "method": "baseline" | "shift", "baseline": NAME | null,
     "regressions": [{"op", "size", "size_bytes", "ranks", "nodes", "transport", "engine", "algorithm",
                      "variant", "method", "reference_us", "current_us", "ratio", "bound_us", "steps",
                      "slow_steps", "good_steps", "normal_steps", "first_slow_ts"}],
     "suspects": [{"rank", "host", "link", "port", "priority", "cause", "score", "p_value", "detail",
                   "evidence": {"counters": [...], "paths": [...], "pools": [...], "off_cpu": {...} | null,
                                "lacking": [...]},
                   "regressions": ["allreduce 4MB", ...]}],
     "notes": [...], "input": {"files", "results", "failures", "bad_lines"}}
"""

import json
import math

from collbench.bounded_repr import terminal_safe
from collbench import tables
from collbench.tables import Column, cell_text, format_us, table_lines

FORMAT, VERSION = "collbench-diagnosis", 1


def label(key):
    parts = [key.op, key.size, f"{key.ranks} ranks", key.transport or "-"]
    if key.algorithm:
        parts.append(key.algorithm)
    if key.variant:
        parts.append(key.variant)
    return " ".join(str(p) for p in parts)


def _num(v, digits=4):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return round(v, digits)


def regression_dict(r):
    k = r.key
    return {"op": k.op, "size": k.size, "size_bytes": k.size_bytes, "ranks": k.ranks, "nodes": k.nodes,
            "transport": k.transport, "engine": k.engine, "algorithm": k.algorithm, "variant": k.variant,
            "method": r.method, "reference_us": _num(r.reference_us, 3), "current_us": _num(r.current_us, 3),
            "ratio": _num(r.ratio), "bound_us": _num(r.bound_us, 3), "steps": r.steps,
            "slow_steps": len(r.slow), "good_steps": len(r.good), "normal_steps": len(r.normal_steps),
            "first_slow_ts": r.first_slow_ts}


def suspect_dict(i, s):
    return {"rank": i, "host": s.host, "link": list(s.link) if s.link else None, "port": s.port,
            "priority": s.priority, "cause": s.cause, "score": _num(s.score), "p_value": _p(s.p_value),
            "detail": s.detail,
            "evidence": {"counters": [c.as_dict() for c in s.counters], "paths": [p.as_dict() for p in s.paths],
                         "pools": [q.as_dict() for q in s.pools], "off_cpu": s.off_cpu,
                         "lacking": list(s.lacking)},
            "regressions": list(s.regressions)}


def _p(p):
    return None if p is None else float(f"{p:.3g}")


def _p_text(p):
    if p is None:
        return "-"
    return "<1e-300" if p < 1e-300 else f"{p:.1g}"


def verdict(regressions, suspects):
    if not regressions:
        return "no regression"
    return "culprit" if any(s.cause != "unexplained" for s in suspects) else "unexplained"


def document(d):
    """The JSON document of a Diagnosis (verdict.Diagnosis)."""
    return {"format": FORMAT, "version": VERSION, "verdict": verdict(d.regressions, d.suspects),
            "method": d.method, "baseline": d.baseline_name,
            "regressions": [regression_dict(r) for r in d.regressions],
            "suspects": [suspect_dict(i + 1, s) for i, s in enumerate(d.suspects)],
            "notes": list(d.notes), "input": d.input}


def json_text(d):
    return json.dumps(document(d), indent=1, allow_nan=False) + "\n"


def _who(s):
    if s.link:
        return f"link {s.link[0]} -> {s.link[1]}"
    if s.host is None:
        return "-"
    where = f" {s.port}" if s.port else ""
    prio = f" prio {s.priority}" if s.priority is not None else ""
    return f"{s.host}{where}{prio}"


def _evidence_text(s):
    parts = []
    for c in s.counters[:3]:
        good = "-" if c.good_rate is None else f"{c.good_rate:.3g}/s"
        ref = c.test.reference if c.test and c.test.reference else "normal"
        parts.append(f"{c.host} {c.name}@{c.where}: {c.slow_rate:.3g}/s in {c.slow_steps} slow steps "
                     f"({ref} {good}, peers {c.peers_rate:.3g}/s, {c.share:.0%} of hosts')")
    for p in s.paths[:3]:
        parts.append(f"{p.host} > {p.peer} {p.counter}: {p.slow_delta:g} in {p.slow_steps} slow steps "
                     f"(expected {p.test.expected:.3g})")
    for q in s.pools[:1]:
        parts.append(f"{q.host}'s other paths pooled {q.counter}: {q.slow_delta:g} in {q.slow_steps} slow steps "
                     f"(expected {q.test.expected:.3g})")
    if s.off_cpu:
        o = s.off_cpu
        parts.append(f"{o['host']}'s rank waited for (on its CPU {o['on_cpu_share']:.1%}, peers "
                     f"{o['peers_on_cpu_share']:.1%}) in {o['slow_steps_waited_for']}/{o['slow_steps']} slow steps")
    return "; ".join(parts) or "; ".join(s.lacking) or "-"


SUSPECT_COLUMNS = [Column("rank", "#"), Column("suspect", align="left"), Column("cause", align="left"),
                   Column("score"), Column("p", "p (how sure)"), Column("detail", align="left"),
                   Column("evidence", align="left")]


def suspect_rows(d):
    return [{"rank": i + 1, "suspect": terminal_safe(_who(s)), "cause": s.cause, "score": f"{s.score:.2f}",
             "p": _p_text(s.p_value),
             "detail": terminal_safe(s.detail), "evidence": terminal_safe(_evidence_text(s))}
            for i, s in enumerate(d.suspects)]


def table_text(d):
    out = []
    if not d.regressions:
        out.append(f"no regression ({d.method_text()})")
    else:
        cols = [Column("series", align="left"), Column("method", align="left"), Column("reference"),
                Column("current"), Column("ratio"), Column("slow", "slow/steps")]
        rows = [{"series": terminal_safe(label(r.key)), "method": r.method, "reference": format_us(r.reference_us),
                 "current": format_us(r.current_us), "ratio": f"{r.ratio:.2f}x" if r.ratio < 1e6 else f"{r.ratio:.3g}x",
                 "slow": f"{len(r.slow)}/{r.steps}"} for r in d.regressions]
        out.append(f"regressions ({d.method_text()}):")
        out += table_lines(cols, rows, indent="  ")
        out.append("")
        out.append("suspects, most likely first:")
        out += table_lines(SUSPECT_COLUMNS, suspect_rows(d), indent="  ")
    for n in d.notes:
        out.append(f"note: {terminal_safe(n)}")
    return "\n".join(out) + "\n"


CSV_COLUMNS = [Column(k) for k in ("rank", "host", "link", "port", "priority", "cause", "score", "p_value",
                                    "regressions", "detail")]


def csv_text(d):
    rows = [{"rank": i + 1, "host": s.host or "", "link": "->".join(s.link) if s.link else "", "port": s.port or "",
             "priority": "" if s.priority is None else s.priority, "cause": s.cause, "score": f"{s.score:.4f}",
             "p_value": "" if s.p_value is None else f"{s.p_value:.3g}",
             "regressions": cell_text(s.regressions), "detail": cell_text(s.detail)} for i, s in enumerate(d.suspects)]
    return tables.csv_text(CSV_COLUMNS, rows, cell=lambda v: v)
