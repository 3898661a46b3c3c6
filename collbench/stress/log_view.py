"""`stress log`: recent records of the results log, readable; -f follows it across rotations.
Also how every stress verb shows a record's text on a terminal and counts bad lines."""

import json
import os
import re
import sys
import time

from collbench.congestion import attribution
from collbench.errors import UserError
from collbench.results.follower import LogFollower
from collbench.results.results_log import tail_records
from collbench.results.state_dir import daemon_status
from collbench.stress.resolve import results_path
from collbench.tables import format_us


def show_log(args, cfg, paths):
    """`stress log`: the last --lines records, readable (or --json); -f follows across rotations."""
    if args.lines < 0:
        raise UserError(f"--lines: got {args.lines}, expected a number >= 0")
    st = daemon_status(paths)
    path = results_path(paths, st.info)
    if not os.path.exists(path) and not args.follow:
        print(f"collbench stress: no results log yet at {path}", file=sys.stderr)
        return 1
    show = (lambda r: print(json.dumps(r, separators=(",", ":")))) if args.json else \
        (lambda r: print(format_record(r)))
    bad = BadLines()
    if os.path.exists(path):
        try:
            recs = tail_records(path, args.lines, on_bad=bad)
        except OSError as e:
            raise UserError(f"results log {path}: cannot read: {e.strerror or e}") from None
        for r in recs:
            show(r)
    sys.stdout.flush()
    if bad.count:
        print(bad.summary(), file=sys.stderr, flush=True)
    if args.follow:
        shown = bad.count
        try:
            follow(path, show, on_bad=bad)
        finally:   # Ctrl-C: say how many followed lines were skipped
            if bad.count > shown:
                print(bad.summary(), file=sys.stderr, flush=True)
    return 0


def follow(path, show, poll=0.5, stop=None, on_bad=None):
    """Show records appended to `path`, across rename rotations, until interrupted."""
    follower = LogFollower(path, on_bad=on_bad)
    try:
        while stop is None or not stop():
            recs = follower.poll()
            for r in recs:
                show(r)
            if recs:
                sys.stdout.flush()
            else:
                time.sleep(poll)
    finally:
        follower.close()


def format_record(r):
    t = r.get("type")
    when = r.get("time", "?")
    seq = r.get("seq")
    head = f"{when} #{seq}" if seq is not None else when
    if t == "result":
        bw = format_bandwidth(r.get("busbw_bytes_per_s"))
        return (f"{head} it={r.get('iteration', '-')} {r.get('op', '?'):<14} {r.get('size', '?'):>6} "
                f"avg {format_us(r.get('latency_avg_us')):>10}  max {format_us(r.get('latency_max_us')):>10}  "
                f"busbw {bw:>11}  {r.get('verdict') or '-'}"
                + (f"  validation {r['validation']}" if r.get("validation") not in (None, "off") else "")
                + _congested(r))
    if t == "failure":
        return f"{head} it={r.get('iteration', '-')} FAILED (exit {r.get('exit_code')}): {printable(r.get('error'))}"
    if t == "event":
        return f"{head} event {r.get('event')} pid {r.get('pid')}: {printable(r.get('detail') or '')}"
    return f"{head} {json.dumps(r)}"


def _congested(r):
    """The host whose congestion counters moved most during the step (docs/CONGESTION.md)."""
    text = attribution.label(r.get("congestion"))
    return f"  congested {printable(text)}" if text else ""


class BadLines:
    """on_bad for the results log readers: counts the lines that are not valid records
    (collbench.results.record_parser) and names the first `show` of them on stderr."""

    def __init__(self, show=5):
        self.show = show
        self.count = 0
        self.first = None

    def __call__(self, path, offset, reason):
        self.count += 1
        where = f"{path} byte {offset}: {reason}"
        if self.first is None:
            self.first = where
        if self.count <= self.show:
            print(f"collbench stress: skipped a line that is not a valid record: {where}"
                  + ("; further ones are only counted" if self.count == self.show else ""),
                  file=sys.stderr, flush=True)

    def summary(self):
        return (f"collbench stress: skipped {self.count} line(s) that are not valid records "
                f"(docs/LOG_FORMAT.md, Validation); first: {self.first}")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text):
    """Free text from the log (error, detail) for a terminal: control characters escaped, so
    a record cannot move the cursor or retitle the window."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def format_bandwidth(bps):
    if bps is None:
        return "-"
    return f"{bps / 1e9:.2f} GB/s" if bps >= 1e8 else f"{bps / 1e6:.1f} MB/s"
