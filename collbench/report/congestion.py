"""The report's congestion section: a host x step heat map of the congestion counters that moved
during the steps, with each step's latency beside it (docs/REPORTS.md, "Congestion").

A step is an op at a size. For each step, over its result records that carry a `congestion`
field (docs/LOG_FORMAT.md): how many there were, their mean latency, the mean latency of those
where some host's congestion signals moved and of those where none did; and per host, the share
of the step's records in which that host's signals moved (the cell's colour), how often it was
the host whose counters moved most (collbench/congestion/attribution.py: bold), its leading
counter and the summed delta (the cell's tooltip).

Bounded whatever the log: per step at most MAX_HOSTS_KEPT hosts are kept (the most involved;
the others are counted), and the map shows MAX_COLUMNS hosts and MAX_ROWS steps.
"""

import html

from collbench.congestion import attribution
from collbench.congestion.keys import split
from collbench.ops import OPS, get_op
from collbench.sizes import format_size
from collbench.tables import format_us

MAX_STEPS = 1024          # (op, size) kept; records of further steps are counted in `dropped`
MAX_HOSTS_KEPT = 256      # hosts kept per step (the most involved)
MAX_COLUMNS = 24          # hosts shown in the map
MAX_ROWS = 64             # steps shown


class _HostAcc:
    __slots__ = ("moved", "top", "delta", "counters")

    def __init__(self):
        self.moved = 0        # records of the step in which this host's signals moved
        self.top = 0          # ... in which it was the host whose counters moved most
        self.delta = 0        # summed delta of its leading counter
        self.counters = {}    # leading counter name -> times it led

    def merge(self, o):
        self.moved += o.moved
        self.top += o.top
        self.delta += o.delta
        for k, n in o.counters.items():
            self.counters[k] = self.counters.get(k, 0) + n


class _StepAcc:
    __slots__ = ("records", "lat_sum", "moved", "moved_lat_sum", "hosts", "hosts_dropped")

    def __init__(self):
        self.records = 0
        self.lat_sum = 0.0
        self.moved = 0
        self.moved_lat_sum = 0.0
        self.hosts = {}
        self.hosts_dropped = 0

    def _trim(self):
        if len(self.hosts) > 2 * MAX_HOSTS_KEPT:
            keep = sorted(self.hosts.items(), key=lambda kv: (-kv[1].moved, -kv[1].top, kv[0]))
            self.hosts = dict(keep[:MAX_HOSTS_KEPT])
            self.hosts_dropped += len(keep) - MAX_HOSTS_KEPT

    def merge(self, o):
        self.records += o.records
        self.lat_sum += o.lat_sum
        self.moved += o.moved
        self.moved_lat_sum += o.moved_lat_sum
        self.hosts_dropped += o.hosts_dropped
        for h, acc in o.hosts.items():
            self.hosts.setdefault(h, _HostAcc()).merge(acc)
        self._trim()


class CongestionAcc:
    """Feed result records with add(); merge() another part (a parallel read)."""

    def __init__(self):
        self.steps = {}       # (op, size_bytes) -> _StepAcc
        self.dropped = 0

    def add(self, rec):
        cong = rec.get("congestion")
        if rec.get("type") != "result" or not isinstance(cong, dict) or cong.get("source") != "engine":
            return
        key = (rec["op"], rec["size_bytes"])
        step = self.steps.get(key)
        if step is None:
            if len(self.steps) >= MAX_STEPS:
                self.dropped += 1
                return
            step = self.steps[key] = _StepAcc()
        lat = float(rec["latency_avg_us"])
        step.records += 1
        step.lat_sum += lat
        rows = attribution.ranked(cong)
        if rows:
            step.moved += 1
            step.moved_lat_sum += lat
        for i, row in enumerate(rows):
            h = step.hosts.setdefault(row.host, _HostAcc())
            h.moved += 1
            h.top += i == 0
            h.delta += row.delta
            name = split(row.counter)[0]
            h.counters[name] = h.counters.get(name, 0) + 1
        step._trim()

    def merge(self, other):
        for key, acc in other.steps.items():
            if key in self.steps:
                self.steps[key].merge(acc)
            elif len(self.steps) < MAX_STEPS:
                self.steps[key] = acc
            else:
                self.dropped += acc.records
        self.dropped += other.dropped

    def empty(self):
        return not self.steps


def _esc(text):
    return html.escape("" if text is None else str(text), quote=True).replace("//", "&#47;&#47;")


def _op_order(key):
    op, size = key
    return (list(OPS).index(op) if op in OPS else len(OPS), op, size)


def _size(op, size_bytes):
    return format_size(size_bytes) if get_op(op).has_size and size_bytes else "-"


def section(acc):
    """The section's HTML ("" when no result record carried a congestion field)."""
    if acc is None or acc.empty():
        return ""
    steps = sorted(acc.steps.items(), key=lambda kv: _op_order(kv[0]))
    involvement = {}    # host -> (records it moved in, records it was the most moved host in)
    for _, st in steps:
        for h, a in st.hosts.items():
            moved, top = involvement.get(h, (0, 0))
            involvement[h] = (moved + a.moved, top + a.top)
    hosts = sorted(involvement, key=lambda h: (-involvement[h][0], -involvement[h][1], h))
    shown, hidden = hosts[:MAX_COLUMNS], len(hosts) - MAX_COLUMNS
    rows_shown, rows_hidden = steps[:MAX_ROWS], len(steps) - MAX_ROWS
    head = ("<tr><th>step</th><th>records</th><th>latency (mean)</th><th>signals moved</th>"
            "<th>latency, signals moved</th><th>latency, none moved</th>"
            + "".join(f"<th>{_esc(h)}</th>" for h in shown) + "</tr>")
    body = []
    for (op, size), st in rows_shown:
        quiet = st.records - st.moved
        cells = [f"<td>{_esc(get_op(op).title)} {_esc(_size(op, size))}</td>", f'<td class="n">{st.records}</td>',
                 f'<td class="n">{_esc(format_us(st.lat_sum / st.records))}</td>',
                 f'<td class="n">{st.moved}</td>',
                 f'<td class="n">{_esc(format_us(st.moved_lat_sum / st.moved)) if st.moved else "-"}</td>',
                 f'<td class="n">{_esc(format_us((st.lat_sum - st.moved_lat_sum) / quiet)) if quiet else "-"}</td>']
        best = max(st.hosts.items(), key=lambda kv: (kv[1].top, kv[1].moved, kv[0]))[0] if st.hosts else None
        for h in shown:
            a = st.hosts.get(h)
            if a is None:
                cells.append('<td class="n muted">·</td>')
                continue
            frac = a.moved / st.records
            lead = max(a.counters.items(), key=lambda kv: (kv[1], kv[0]))[0]
            tip = (f"{h}: signals moved in {a.moved} of {st.records} records, most moved host in {a.top}; "
                   f"leading counter {lead}, summed delta {a.delta}")
            text = f"{100 * frac:.0f}%"
            if h == best and a.top:
                text = f"<b>{text}</b>"
            cells.append(f'<td class="n" title="{_esc(tip)}" style="background:rgba(180,35,24,{0.08 + 0.72 * frac:.2f})">'
                         f"{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    notes = []
    if hidden > 0:
        notes.append(f"{hidden} more host(s) whose signals moved less are not shown.")
    if rows_hidden > 0:
        notes.append(f"{rows_hidden} more step(s) not shown.")
    if acc.dropped:
        notes.append(f"{acc.dropped} record(s) of further steps not counted (at most {MAX_STEPS} steps).")
    dropped_hosts = sum(st.hosts_dropped for _, st in steps)
    if dropped_hosts:
        notes.append(f"{dropped_hosts} less involved host entries left out (at most {MAX_HOSTS_KEPT} per step).")
    intro = ("<h2 id=congestion>Congestion</h2><p class=sub>The congestion counters read on every host around "
             "each step (docs/CONGESTION.md). A cell is the share of the step's records in which that host's "
             "congestion signals moved (ECN marks, CNPs, PFC pauses, retransmits; not traffic counters); bold: "
             "the host whose counters moved most most often; hover for its leading counter. Beside each step, "
             "its mean latency with and without signals moved.</p>")
    return (intro + "<div class=tw><table><thead>" + head + "</thead><tbody>" + "".join(body)
            + "</tbody></table></div>" + "".join(f'<p class="note">{_esc(n)}</p>' for n in notes))
