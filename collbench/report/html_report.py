"""The report page: one self-contained HTML file. No script, no stylesheet or font from
anywhere, plots as inline SVG, and a Content-Security-Policy that forbids every fetch, so the
page looks the same on an air-gapped laptop and can never call out. Every string that came
from a results file is escaped (and "//" defused: no text from a record reads as a URL)."""

import html
import os
import time
from datetime import datetime, timezone

from collbench import __version__
from collbench.ops import get_op
from collbench.report.chart import figure_svg, format_us
from collbench.report.congestion import section as congestion_section
from collbench.report.figures import line_labels
from collbench.sizes import format_size

MAX_FAILURE_GROUPS = 50

CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:#1d2330;font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif}
main{max-width:1180px;margin:0 auto;padding:24px 20px 60px}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:19px;margin:34px 0 10px;padding-bottom:4px;border-bottom:2px solid #d8dce3}
h3{font-size:15px;margin:18px 0 6px}
.sub{color:#5b6475;margin:0 0 16px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:20px}
.card span{color:#5b6475;font-size:12px}
.card.bad b{color:#b42318}
.note{background:#fff;border-left:4px solid #4a7bd0;padding:8px 12px;margin:10px 0;border-radius:4px}
.warn{border-left-color:#d08a1a}
.err{border-left-color:#b42318}
table{border-collapse:collapse;background:#fff;margin:8px 0 14px;width:100%;font-size:13px}
th,td{border:1px solid #e1e4ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.plot{width:100%;height:auto;background:#fff;border:1px solid #dde1e7;border-radius:6px}
.pct-hi{color:#1a7f37;font-weight:600}.pct-over{color:#6b7385;font-style:italic}.nw{white-space:nowrap}.tw{overflow-x:auto}.pct-mid{color:#9a6700}.pct-lo{color:#b42318}
details{margin:4px 0}
pre{white-space:pre-wrap;background:#f6f8fa;border:1px solid #e1e4ea;padding:8px;font-size:12px;margin:4px 0}
code{font-size:12px}
.muted{color:#6b7385}
footer{margin-top:40px;color:#6b7385;font-size:12px}
"""


def esc(text):
    return html.escape("" if text is None else str(text), quote=True).replace("//", "&#47;&#47;")


def iso(ts):
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _gb(bps):
    return "-" if bps is None else f"{bps / 1e9:.3g}"


def _us(v):
    return "-" if v is None else format_us(v)


def _pct(p):
    if p is None:
        return "-"
    if p > 110:   # above the peak: the peak is wrong (see the peak note), not a great result
        return f'<span class="pct-over" title="above the point-to-point peak">{p:.0f}% ?</span>'
    cls = "pct-hi" if p >= 70 else "pct-mid" if p >= 40 else "pct-lo"
    return f'<span class="{cls}">{p:.0f}%</span>'


def _swatch(color):
    return f'<span class="sw" style="background:{color}"></span>'


def _table(headers, rows, numeric=()):
    out = ["<div class=tw><table><thead><tr>", "".join(f"<th>{esc(h)}</th>" for h in headers), "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _hosts(hosts, limit=6):
    """Distinct hosts in rank order with their rank counts: node00 ×8, node01 ×8."""
    if not hosts:
        return "-"
    counts = {}
    for h in hosts:
        counts[h] = counts.get(h, 0) + 1
    items = [f"{h} ×{n}" if n > 1 else h for h, n in counts.items()]
    text = ", ".join(items[:limit])
    return esc(text + (f" … (+{len(items) - limit} hosts)" if len(items) > limit else ""))


def _span(first, last):
    """2026-11-23 19:40:31 → 19:52:10 UTC (the date once when both are on the same day)."""
    if first is None:
        return "-"
    a, b = iso(first), iso(last if last is not None else first)
    if a[:10] == b[:10]:
        return f'<span class=nw>{esc(a[:10])}</span><br><span class=nw>{esc(a[11:19])} → {esc(b[11:19])}</span>'
    return f'<span class=nw>{esc(a[:19])} →</span><br><span class=nw>{esc(b[:19])}</span>'


def _runs_section(data):
    by_setup = data.group_by != "run"
    rows = []
    for s in data.series:
        a = s.attrs
        how = [x for x in (a.get("algorithm") and f"algorithm {a['algorithm']}", a.get("order") and
                           f"order {a['order']}", a.get("pattern") and f"pattern {a['pattern']}") if x]
        row = [f"{_swatch(s.color)}<b>#{s.index + 1}</b> {esc(s.label)}"]
        if by_setup:
            ids = ", ".join(esc(r) for r in s.run_ids[:3])
            row.append(ids + (f" <span class=muted>+{len(s.run_ids) - 3} more</span>" if len(s.run_ids) > 3 else ""))
        files = "<br>".join(f'<span title="{esc(f)}">{esc(os.path.basename(f))}</span>' for f in s.files[:4]) + (
            f" <span class=muted>+{len(s.files) - 4}</span>" if len(s.files) > 4 else "")
        row += [_span(s.first_ts, s.last_ts),
                f"{_hosts(a.get('hosts'))}<br><span class=muted>{esc(a.get('ranks') or '?')} ranks on "
                f"{esc(a.get('nodes') or '?')} node(s)</span>",
                f"{esc(a.get('engine') or '-')} · {esc(a.get('transport') or '-')}"
                f"<br><span class=muted>{esc(a.get('mpi') or '-')}</span>",
                esc(", ".join(how) or "-"), str(s.results), str(s.failures), str(s.events.get("relaunch", 0)),
                f"<span class=muted>{files}</span>"]
        rows.append(row)
    grouping = ("one line per run" if not by_setup else
                "one line per setup (hosts, ranks, transport, engine, MPI, algorithm, order): the runs of a "
                "setup are merged (use --group-by run to split them)")
    headers = ["series"] + (["runs"] if by_setup else []) + [
        "when", "where", "engine · transport / MPI", "algorithm / order", "results", "failures", "relaunches",
        "files"]
    k = 1 if by_setup else 0
    return (f"<h2 id=runs>Runs</h2><p class=sub>{esc(grouping)}; the colour of a series is the same in "
            "every plot.</p>" + _table(headers, rows, numeric=(5 + k, 6 + k, 7 + k)))


def _glance(data, figures_ops):
    rows = []
    for op_name in data.ops():
        op = get_op(op_name)
        pts = [p for p in data.points if p.op == op_name]
        fails = sum(f.count for f in data.failures if f.op == op_name)
        if not pts:
            rows.append([f'<a href="#op-{op_name}">{esc(op.title)}</a>', "-", "-", "-", "-", str(fails)])
            continue
        best = max((p for p in pts if p.busbw), key=lambda p: p.busbw, default=None)
        spread = [(p.latency_max_us / p.latency_min_us, p) for p in pts
                  if p.latency_min_us and p.latency_max_us]
        worst = max(spread, key=lambda x: x[0], default=None)
        rows.append([f'<a href="#op-{op_name}">{esc(op.title)}</a>',
                     (f"{_gb(best.busbw)} GB/s at {esc(format_size(best.size_bytes))} "
                      f"<span class=muted>(#{best.series.index + 1})</span>") if best else "-",
                     _pct(best.pct_of_peak) if best else "-",
                     _us(min(p.latency_avg_us for p in pts)),
                     (f"{worst[0]:.2f}× at {esc(format_size(worst[1].size_bytes) if worst[1].size_bytes else '-')} "
                      f"<span class=muted>(#{worst[1].series.index + 1})</span>") if worst else "-",
                     str(fails)])
    return ("<h2 id=glance>At a glance</h2>" +
            _table(["op", "best busbw", "% of peak", "lowest latency", "widest rank spread (slowest/fastest)",
                    "failures"], rows, numeric=(2, 3, 5)))


STRAGGLER_MIN_RANKS = 4       # with 2 or 3 ranks one of them is "the slowest" half the time by chance
STRAGGLER_SHARE = 0.5


def _straggler_notes(lines):
    """A sentence per straggler rank: one rank the slowest in at least half of a series'
    measurements of the op, with 4 ranks or more (chance would give 1/ranks). Series that share
    the straggler (and its host) share the sentence."""
    found = {}   # (rank, host) -> [(series, times, total)]
    for s, _, pts in lines:
        ranks = s.attrs.get("ranks") or 0
        total, by_rank = 0, {}
        for p in pts:
            total += p.n
            for rank, times in p.stragglers:
                by_rank[rank] = by_rank.get(rank, 0) + times
        if ranks < STRAGGLER_MIN_RANKS or total < 5 or not by_rank:
            continue
        rank, times = max(by_rank.items(), key=lambda kv: kv[1])
        if times / total >= STRAGGLER_SHARE:
            hosts = s.attrs.get("hosts") or ()
            found.setdefault((rank, hosts[rank] if rank < len(hosts) else None), []).append((s, times, total))
    out = []
    for (rank, host), hits in found.items():
        where = f" (on {esc(host)})" if host else ""
        times, total = sum(h[1] for h in hits), sum(h[2] for h in hits)
        ranks = max(h[0].attrs.get("ranks") or 0 for h in hits)
        who = " ".join(f"{_swatch(s.color)}#{s.index + 1}" for s, _, _ in hits)
        out.append(f'<p class="note warn">{who}: rank {rank}{where} was the slowest of {ranks} ranks in {times} of '
                   f"{total} measurements ({times / total:.0%}; chance would be {1 / ranks:.0%}). The slowest "
                   "rank waits longest inside the calls: often for a late peer (a CPU-starved host's rank is "
                   "the one waited for, not the slowest: collbench diagnose), else the op's structure (its "
                   "root) or its own NIC or link.</p>")
    return "".join(out)


def _op_section(data, op_name, fig):
    op = get_op(op_name)
    out = [f'<h2 id="op-{op_name}">{esc(op.title)}</h2>',
           f'<p class=sub>{esc(op.training_use)}. Each point is the median of its n repeated measurements; '
           f"busbw uses nccl-tests' bus factor for {esc(op.title.lower())}.</p>"]
    if fig is not None:
        out.append(figure_svg(fig))
    lines = data.lines(op_name)
    pts_all = [p for _, _, pts in lines for p in pts]
    out.append(_straggler_notes(lines))
    labels = line_labels(lines)
    any_p99 = any(p.p99_us for p in pts_all)
    rows = []
    for (s, dt, pts), label in zip(lines, labels):
        for p in pts:
            ratio = (f"{p.latency_max_us / p.latency_min_us:.2f}×"
                     if p.latency_min_us and p.latency_max_us else "-")
            slow = "-"
            if p.stragglers:
                rank, times = p.stragglers[0]
                slow = f"rank {rank}" + (f" <span class=muted>({times}/{p.n})</span>" if p.n > 1 else "")
            row = [f"{_swatch(s.color)}#{s.index + 1}", esc(format_size(p.size_bytes) if p.size_bytes else "-"),
                   esc(dt or "-"), str(p.n), _us(p.latency_avg_us), _us(p.latency_min_us), _us(p.latency_max_us),
                   ratio]
            if any_p99:
                row.append(_us(p.p99_us))
            row += [_gb(p.busbw), _pct(p.pct_of_peak), slow,
                    f'<span class=pct-lo>{p.validation_fail}</span>' if p.validation_fail else "0"]
            rows.append(row)
    headers = ["series", "size", "datatype", "n", "avg latency", "fastest rank's", "slowest rank's",
               "slowest / fastest"]
    if any_p99:
        headers.append("p99")
    headers += ["busbw GB/s", "% of peak", "slowest rank (times)", "validation failed"]
    num = tuple(range(3, len(headers) - 2)) + (len(headers) - 1,)
    if rows:
        out.append(_table(headers, rows, numeric=num))
    fails = [f for f in data.failures if f.op == op_name]
    if fails:
        out.append(f'<p class="note err">{sum(f.count for f in fails)} failed step(s) for this op: '
                   f'see <a href="#failures">Failures</a>.</p>')
    return "".join(out)


def _failures_section(data):
    if not data.failures:
        return "<h2 id=failures>Failures</h2><p>No failure records.</p>"
    total = sum(f.count for f in data.failures)
    rows = []
    for f in data.failures[:MAX_FAILURE_GROUPS]:
        last = f.last or {}
        tail = last.get("stderr_tail") or ""
        err = esc(last.get("error") or "-")
        if tail:
            err += f"<details><summary>stderr tail of the last one</summary><pre>{esc(tail)}</pre></details>"
        codes = ", ".join(f"{'?' if c is None else c}×{n}" for c, n in sorted(f.exit_codes.items(),
                                                                             key=lambda kv: -kv[1]))
        size = format_size(f.size_bytes) if f.size_bytes else "-"
        rows.append([f"{_swatch(f.series.color)}#{f.series.index + 1}", esc(f.op or "(job)"), esc(size),
                     str(f.count), f"{esc(iso(f.first_ts))}<br>{esc(iso(f.last_ts))}", esc(codes), err])
    more = (f"<p class=muted>{len(data.failures) - MAX_FAILURE_GROUPS} more groups not shown.</p>"
            if len(data.failures) > MAX_FAILURE_GROUPS else "")
    return (f"<h2 id=failures>Failures</h2><p class=sub>{total} failure record(s), grouped by series, op and "
            "size; most frequent first.</p>" +
            _table(["series", "op", "size", "count", "first / last", "exit codes", "last error"], rows,
                   numeric=(3,)) + more)


def _input_section(stats):
    rows, notes = [], []
    for s in stats:
        recs = ", ".join(f"{n} {t}" for t, n in sorted(s.records.items())) or "0"
        reasons = "<br>".join(f"{n}× {esc(r)}" for r, n in s.reasons.most_common(8)) or "-"
        fields = "<br>".join(f"{n}× {esc(r)}" for r, n in s.field_reasons.most_common(5))
        if fields:
            reasons += f"<br><span class=muted>fields dropped:</span><br>{fields}"
        rows.append([esc(s.path), str(s.lines), esc(recs), str(s.bad), reasons, str(s.filtered)])
        if s.examples:
            ex = "\n".join(f"line {n}: {r}" for n, r in s.examples)
            notes.append(f"<details><summary>first problem lines of {esc(s.path)}</summary><pre>{esc(ex)}</pre>"
                         "</details>")
    return ("<h2 id=input>Input</h2><p class=sub>Results files are read as untrusted input: a line that is "
            "not a usable record is skipped and counted here, never fatal.</p>" +
            _table(["file", "lines", "records", "bad lines", "why", "outside --since"], rows,
                   numeric=(1, 3, 5)) + "".join(notes))


def _peak_note(peak, data):
    cls = "note" if peak.bytes_per_s else "note warn"
    text = f"<b>Point-to-point peak:</b> {esc(peak.text)}."
    transports = {s.attrs.get("transport") for s in data.series if s.attrs.get("transport")}
    if peak.source == "measured" and peak.transport and transports and transports != {peak.transport}:
        text += (f" The results ran over {esc(', '.join(sorted(transports)))}: the percentages compare "
                 "against a different transport.")
    if peak.source == "measured" and len(peak.hosts) < 2 and any((s.attrs.get("nodes") or 1) > 1
                                                                  for s in data.series):
        text += (" The results span several nodes but the peak was measured inside one host: give "
                 "--config with two hosts, --peak-from (topo measure) or --peak-gbps for the inter-node peak.")
    over = [p for p in data.points if p.pct_of_peak is not None and p.pct_of_peak > 110]
    if over:
        worst = max(over, key=lambda p: p.pct_of_peak)
        cls = "note warn"
        text += (f" {len(over)} point(s) exceed this peak (up to {worst.pct_of_peak:.0f}%, {esc(worst.op)} "
                 f"{esc(format_size(worst.size_bytes))}): the peak is not the ceiling of these results — "
                 "measured elsewhere, at another time (a loaded machine), or over another path (intra-node "
                 "shared memory beats the fabric); percentages above 100% mean the peak is wrong, not the "
                 "collective.")
    return f'<p class="{cls}">{text}</p>'


def render(data, figures, peak, stats, title, sources, build_seconds=None):
    """The whole page as a str."""
    results = data.types.get("result", 0)
    failures = data.types.get("failure", 0)
    bad = sum(s.bad for s in stats)
    figs = dict(figures)
    cards = [(str(len(data.ops())), "ops"), (str(len(data.series)), "series (lines)"),
             (str(results), "result records"), (str(failures), "failure records"),
             (str(bad), "bad input lines"),
             (f"{peak.bytes_per_s / 1e9:.3g} GB/s" if peak.bytes_per_s else "none", "p2p peak")]
    card_html = "".join(
        f'<div class="card{" bad" if (label in ("failure records", "bad input lines") and value != "0") else ""}">'
        f"<b>{esc(value)}</b><span>{esc(label)}</span></div>" for value, label in cards)
    nav = " · ".join(f'<a href="#op-{op}">{esc(get_op(op).title)}</a>' for op in data.ops())
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        # nothing may be fetched: the page is complete as it is
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "img-src data:; base-uri 'none'; form-action 'none'\">",
        "<meta name=viewport content=\"width=device-width,initial-scale=1\">",
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>",
        f"<h1>{esc(title)}</h1>",
        f"<p class=sub>collbench {esc(__version__)} report, generated {esc(iso(time.time()))} from "
        f"{len(sources)} file(s): {esc(', '.join(sources[:3]))}{' …' if len(sources) > 3 else ''}</p>",
        f"<div class=cards>{card_html}</div>",
        _peak_note(peak, data),
    ]
    if not data.points:
        parts.append('<p class="note err">No result records: only failures (or nothing usable) in the input.</p>')
    parts.append(f"<p>{nav} · <a href=#runs>Runs</a> · <a href=#failures>Failures</a> · <a href=#input>Input</a></p>")
    parts.append(_glance(data, figs))
    parts.append(_runs_section(data))
    for op in data.ops():
        parts.append(_op_section(data, op, figs.get(op)))
    parts.append(congestion_section(data.congestion))   # "" when no record carried the counters
    parts.append(_failures_section(data))
    parts.append(_input_section(stats))
    took = f" in {build_seconds:.1f}s" if build_seconds is not None else ""
    parts.append(f"<footer>How to read: latency is the average time per call over the timed iterations, "
                 f"averaged over ranks (the band spans the fastest and the slowest rank's average); busbw "
                 f"is the algorithm bandwidth times the op's bus factor, comparable to the link speed; "
                 f"% of peak = busbw / point-to-point peak. Built{took}.</footer>")
    parts.append("</main></body></html>\n")
    return "".join(parts)
