"""Render a ReplayResult: a readable table (default), CSV, or the JSON document.

CSV: in log order the RCCL replayer's CSV (one row per replayed call); in grouped order one row
per configuration (GROUPED_CSV_FIELDS).
"""

import json

from collbench.nccl.replay import csv_text
from collbench import tables
from collbench.tables import Column, format_gb_per_s, format_us, table_lines

TABLE_ROWS = 40
GROUPED_CSV_FIELDS = (
    "status", "op", "count", "datatype", "redop", "nranks", "inplace", "calls", "roots", "collbench_op",
    "engine_datatype", "stand_in", "replay_nranks", "root", "size_bytes", "bytes_per_call", "measured_count",
    "scale", "estimated", "timed", "mean_us", "median_us", "min_us", "max_us", "algbw_bytes_per_s",
    "busbw_bytes_per_s", "total_s", "share", "reason")
MARKS = (("*", "datatype timed as a stand-in of its width (MPI has no such type)"),
         ("~", "capped at --max-bytes: time scaled by the bytes ratio, an estimate"),
         ("!", "replayed at fewer ranks than the log's communicator"))


def fmt_us(us):
    return format_us(us, scaled_digits=3)        # 12.34 us / 5.870 ms / 1.200 s


def fmt_gbps(bps):
    return format_gb_per_s(bps, significant=4)


def _table(headers, rows, left):
    columns = [Column(i, h, align="left" if h in left else "right") for i, h in enumerate(headers)]
    return table_lines(columns, [dict(enumerate(r)) for r in rows], rule=False)


def _cut(rows, verbose, what):
    if verbose or len(rows) <= TABLE_ROWS:
        return rows, []
    return rows[:TABLE_ROWS], [f"... {len(rows) - TABLE_ROWS} more {what} (-v shows all; --format json has them)"]


def _datatype_cell(t):
    c = t.call
    return f"{t.datatype}->{c.datatype}{'*' if c.stand_in else ''}"


def _config_rows(timed):
    rows, failed = [], []
    for t in timed:
        if not t.replayed:
            continue
        c = t.call
        s = t.summary()
        ranks = f"{c.nranks}{'!' if c.nranks != t.nranks else ''}"
        cells = [t.op, str(t.count), _datatype_cell(t), str(t.nranks), ranks, "yes" if t.inplace else "no",
                 str(t.calls)]
        if s:
            algbw, busbw = c.bandwidth(s[0] / c.scale)
            mark = "~" if c.capped else ""
            cells += [fmt_us(v) + mark for v in s] + [fmt_gbps(algbw), fmt_gbps(busbw),
                                                     fmt_us(t.total_us) + mark, f"{100 * t.share:.1f}%"]
        else:
            cells += ["failed"] + ["-"] * 7
            failed.append(t)
        rows.append(cells)
    return rows, failed


CONFIG_HEADERS = ("op", "count", "datatype", "nranks", "ranks", "in-place", "calls", "mean", "median", "min", "max",
                  "algbw GB/s", "busbw GB/s", "est. total", "share")


def _notes(result, timed, extra_marks=()):
    out = []
    used = set()
    for t in timed:
        if t.replayed:
            if t.call.stand_in:
                used.add("*")
            if t.call.capped:
                used.add("~")
            if t.call.nranks != t.nranks:
                used.add("!")
    legend = [f"  {m} {text}" for m, text in MARKS if m in used]
    if legend:
        out += ["", "Marks:"] + legend
    if result.warnings:
        out += ["", "Warnings:"] + [f"  - {w}" for w in result.warnings]
    failed = [t for t in timed if t.replayed and t.failure]
    if failed:
        out += ["", f"Failed ({len(failed)}; their records are in --results):"]
        out += [f"  - {t.op} count={t.count} {t.datatype}: {t.failure}" for t in failed]
    bad = [t for t in timed if t.replayed and "fail" in t.validation]
    if bad:
        out += ["", f"Validation failed ({len(bad)}; --validate checked every result element):"]
        out += [f"  - {t.op} count={t.count} {t.datatype}: {t.validation.count('fail')} of "
                f"{len(t.validation)} timed units had wrong results" for t in bad]
    return out


def _header(result):
    r = result.runner
    it, wu = result.settings.counts()
    n_in = len(result.inputs)
    head = (f"engine builtin, transport {r.cfg.transport}, {r.mpi}; run {r.run_id}; "
            f"{n_in} input{'s' if n_in != 1 else ''}")
    if result.order == "grouped":
        how = f"each configuration: {wu} warm-up + {it} timed calls, each timed on its own"
    else:
        how = f"each call: {wu} warm-up + {it} timed iterations (its time is their mean)"
    return head, how + "; a call's time is the ranks' average (nccl-tests' convention)"


def _not_replayed(timed, verbose):
    rows = [[t.op, str(t.count), t.datatype, str(t.nranks), str(t.calls), t.call.reason]
            for t in timed if not t.replayed]
    if not rows:
        return []
    total = len(rows)
    rows, more = _cut(rows, verbose, "configurations")
    return (["", f"Not replayed ({total} configuration{'s' if total != 1 else ''}):"]
            + _table(("op", "count", "datatype", "nranks", "calls", "reason"), rows, {"op", "datatype", "reason"})
            + more)


def render_table(result, verbose=False):
    head, how = _header(result)
    timed = result.configurations
    replayed = [t for t in timed if t.replayed]
    if result.order == "grouped":
        out = [f"NCCL replay, grouped: {len(replayed)} of {len(timed)} configurations of the log timed on this "
               f"fabric", head, how, ""]
    else:
        c = result.communicator
        out = [f"NCCL replay, log order: communicator {c['key']} ({c['nranks']} ranks), rank "
               f"{'?' if c['rank'] is None else c['rank']} at {c['host']}:{c['pid']} comm {c['comm']}: "
               f"{c['calls_read']} calls, {c['replayed']} replayed at {c['replay_nranks']} "
               f"rank{'s' if c['replay_nranks'] != 1 else ''}", head, how, "",
               "Per configuration (the calls of the sequence, grouped):"]
    rows, _failed = _config_rows(timed)
    rows, more = _cut(rows, verbose, "configurations")
    out += _table(CONFIG_HEADERS, rows, {"op", "datatype", "in-place"}) + more
    total = result.total_us
    if result.order == "grouped":
        out += ["", f"Estimated time of the log's collectives on this fabric: {fmt_us(total)} per rank "
                    f"(sum of calls x mean over {len(replayed)} configurations; shares of it above)"]
    else:
        out += ["", f"Time of the sequence on this fabric: {fmt_us(total)} (the sum of its calls' times)"]
        calls = [c for c in result.calls if c.time_us is not None or c.failure]
        crow = []
        for c in calls:
            bw = c.call.bandwidth(c.time_us)[1] if c.time_us is not None else None
            mark = "~" if c.call.capped else ""
            crow.append([str(c.position), c.op, str(c.count), c.datatype, "yes" if c.inplace else "no", str(c.root),
                         (fmt_us(c.estimated_us) + mark) if c.time_us is not None else "failed", fmt_gbps(bw)])
        crow, cmore = _cut(crow, verbose, "calls")
        out += ["", "Calls (position in the rank's sequence; --format csv gives the RCCL replayer's CSV):"]
        out += _table(("#", "op", "count", "datatype", "in-place", "root", "time", "busbw GB/s"), crow,
                      {"op", "datatype", "in-place"}) + cmore
    out += _not_replayed(timed, verbose)
    out += _notes(result, timed)
    return "\n".join(out) + "\n"


def render_csv(result):
    if result.order == "log":
        return csv_text(result.calls)
    return tables.csv_text([tables.Column(name) for name in GROUPED_CSV_FIELDS],
                           [t.row() for t in result.configurations], cell=_grouped_cell)


def _grouped_cell(v):
    """A grouped CSV cell: booleans 0/1, lists space-joined, floats to 9 digits, None empty."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, list):
        return " ".join(map(str, v))
    if isinstance(v, float):
        return f"{v:.9g}"
    return "" if v is None else v


def render_json(result):
    return json.dumps(result.document(), indent=1) + "\n"
