"""Render a Census: a readable table (default), CSV of the configuration groups, or the JSON document."""

import json

from collbench.tables import Column, csv_text, format_bytes, table_lines


TABLE_ROWS = 40             # rows per section without -v
GROUP_CSV_FIELDS = ("op", "count", "datatype", "type_size", "redop", "nranks", "inplace", "rank_calls",
                    "calls", "bytes_per_call", "total_bytes", "share", "roots", "op_names", "ranks", "hosts",
                    "algorithms", "collbench_op")


def algorithm_text(algorithms):
    if not algorithms:
        return "-"
    total = sum(a.count for a in algorithms)
    top = algorithms[0]
    text = f"{top.algorithm}/{top.protocol}"
    if len(algorithms) > 1:
        text += f" {100.0 * top.count / total:.0f}% +{len(algorithms) - 1}"
    return text


def _table(headers, rows, right):
    columns = [Column(i, h, align="right" if h in right else "left") for i, h in enumerate(headers)]
    return table_lines(columns, [dict(enumerate(r)) for r in rows], rule=False)


def _cut(rows, verbose, what):
    if verbose or len(rows) <= TABLE_ROWS:
        return rows, []
    return rows[:TABLE_ROWS], [f"... {len(rows) - TABLE_ROWS} more {what} (-v shows all; --format json has them)"]


def render_table(census, verbose=False):
    t = census.totals
    n_in = len(census.inputs)
    out = [f"NCCL census of {n_in} input{'s' if n_in != 1 else ''}: {t['lines']} lines, "
           f"{t['collective_lines']} collective lines, {t['malformed_lines']} malformed"
           + (f", {t['overlong_lines']} over-long" if t["overlong_lines"] else "")
           + (f", {t['untracked_lines']} beyond the census' tables" if t.get("untracked_lines") else "")
           + (f", {t['wrapped_lines_joined']} joined from wrapped lines" if t.get("wrapped_lines_joined") else ""),
           ""]

    rows = []
    for g in census.groups:
        rows.append([g.op, str(g.count), g.datatype, g.redop or "-", str(g.nranks), "yes" if g.inplace else "no",
                     str(g.rank_calls), str(g.calls), format_bytes(g.bytes_per_call), format_bytes(g.total_bytes),
                     f"{100 * g.share:.1f}%", algorithm_text(g.algorithms)])
    rows, more = _cut(rows, verbose, "configurations")
    out.append(f"Configurations ({len(census.groups)}), largest share of bytes first "
               f"(calls = per rank, rank lines = summed over ranks):")
    out += _table(("op", "count", "datatype", "redop", "nranks", "in-place", "rank lines", "calls", "bytes/call",
                   "total bytes", "share", "algorithm"), rows,
                  {"count", "nranks", "rank lines", "calls", "bytes/call", "total bytes", "share"}) + more

    sets = census.sets
    by_commid = sum(1 for s in sets if s["source"] == "commId")
    out += ["", f"Communicators: {len(census.communicators)} rank handles in {len(sets)} communicators "
                f"({by_commid} by commId, {len(sets) - by_commid} inferred):"]
    rows = [[s["key"], s["source"], str(s["nranks"]), str(s["members"]), s["status"], s["note"]] for s in sets]
    rows, more = _cut(rows, verbose, "communicators")
    out += _table(("communicator", "from", "nranks", "ranks in log", "status", "note"), rows,
                  {"nranks", "ranks in log"}) + more
    if verbose:
        out += ["", "Rank handles:"]
        rows = [[f"{c['host'] or '?'}:{c['pid'] if c['pid'] is not None else '?'}", c["comm"],
                 "-" if c["rank"] is None else str(c["rank"]), str(c["nranks"]), c["comm_id"] or "-", c["set"],
                 str(c["collectives"]), str(c["p2p"]), format_bytes(c["bytes"])] for c in census.communicators]
        out += _table(("host:pid", "comm", "rank", "nranks", "commId", "communicator", "collectives", "p2p",
                       "bytes"), rows, {"rank", "nranks", "collectives", "p2p", "bytes"})

    rows = [[h["host"] or "?", str(h["processes"]), str(h["communicators"]), str(h["collective_lines"]),
             format_bytes(h["bytes"])] for h in census.hosts]
    rows, more = _cut(rows, verbose, "hosts")
    out += ["", "Hosts:"] + _table(("host", "processes", "rank handles", "collective lines", "bytes"), rows,
                                   {"processes", "rank handles", "collective lines", "bytes"}) + more

    out.append("")
    if census.desync:
        out.append(f"DESYNC: {len(census.desync)} finding{'s' if len(census.desync) != 1 else ''}:")
        out += [f"  - {f['message']}" for f in census.desync]
    else:
        checked = sum(1 for s in sets if s["status"] != "unchecked")
        out.append(f"Desync: none found ({checked} of {len(sets)} communicators had two or more ranks to compare).")
    if census.inconsistencies:
        n = t.get("inconsistency_count", len(census.inconsistencies))
        shown = "" if n == len(census.inconsistencies) else f", the first {len(census.inconsistencies)}"
        out += ["", f"Inconsistencies ({n}{shown}): lines of one communicator that contradict each other:"]
        out += [f"  - {c['message']}" for c in census.inconsistencies]
    if census.warnings:
        out += ["", "Warnings:"] + [f"  - {w}" for w in census.warnings]
    if census.malformed and verbose:
        out += ["", f"Malformed lines (first {len(census.malformed)}):"]
        out += [f"  {m['source']}:{m['line']}: {m['reason']}: {m['text']}" for m in census.malformed]
    elif t["malformed_lines"]:
        reasons = "; ".join(f"{r} ({n})" for r, n in list(t["malformed_reasons"].items())[:3])
        out += ["", f"{t['malformed_lines']} malformed COLL lines: {reasons} (-v shows them)"]
    return "\n".join(out) + "\n"


def _group_cell(name, v):
    if name == "algorithms":
        return " ".join(f"{a.algorithm}/{a.protocol}:{a.count}" for a in v)
    if name in ("roots", "op_names"):
        return " ".join(str(x) for x in v)
    if name == "share":
        return f"{v:.6f}"
    if name == "redop":
        return v or ""
    if name == "inplace":
        return int(v)
    return v


def render_csv(census):
    rows = [{name: _group_cell(name, getattr(g, name)) for name in GROUP_CSV_FIELDS} for g in census.groups]
    return csv_text([Column(name) for name in GROUP_CSV_FIELDS], rows, cell=lambda v: v)


def render_json(census):
    return json.dumps(census.document(), indent=1, sort_keys=False) + "\n"


def desync_summary(census):
    """Findings as lines for stderr, where CSV output has no place for them."""
    return [f"collbench: desync: {f['message']}" for f in census.desync]
