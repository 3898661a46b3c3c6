"""`collbench locate`: when the counters say nothing (a degraded link that neither marks nor
pauses), find the slow host or link with few probes: the collective on halves of the hosts
(bisection), then every pair of the suspect group (docs/LOCATE.md).

Exit 0 nothing slower than its peers beyond the noise; 1 a host or link named, or a probe job
failed; 2 bad config or flag, or the stress daemon holds these hosts (without --force);
130/143 interrupted (no probe job is left behind: the harness stops it).
"""

import dataclasses
import json
import os
import sys

from collbench import cli_values, engines, harness
from collbench.bounded_repr import terminal_safe
from collbench.config import apply_overrides, load_config
from collbench.errors import UserError
from collbench.locate.probes import MpiProber
from collbench.locate.search import DEFAULT_RATIO, PAIR_GROUP, LocateFailed, locate
from collbench.sizes import format_size
from collbench.tables import Column, csv_text

FORMATS = ("table", "csv", "json")
CSV_COLUMNS = [Column("probe"), Column("kind"), Column("hosts"), Column("a"), Column("b"), Column("value_us"),
               Column("failed")]


def register(subparsers):
    from collbench.cli import add_config_arg
    p = subparsers.add_parser(
        "locate", help="find the slow host or link with few probes (bisection, then pairs)",
        description="Run the collective on halves of the config's hosts, keep the slower half while it is "
                    "slower beyond --ratio, then measure every pair of the suspect group beside two "
                    "cleared hosts (topo measure's pair job), until one host or link is named with its "
                    "evidence, or none is slower than its peers beyond the noise. For a degraded link that "
                    "neither marks ECN nor pauses: the counters (diagnose) see nothing.",
        epilog="Refuses to run while the stress daemon holds any of these hosts (its jobs would skew every "
               "probe) unless --force. Exit code 1 when a host or link is named or a probe failed, 0 when "
               "none is, 2 on a bad config or flag.")
    add_config_arg(p)
    p.add_argument("--op", default="allreduce", metavar="OP", help="the collective of the group probes (default allreduce)")
    p.add_argument("--size", default="1MB", metavar="SIZE",
                   help="message size per rank (default 1MB: a degraded link shows in bandwidth)")
    p.add_argument("--iterations", type=_count, default=10, metavar="N",
                   help="timed iterations of each group probe (default 10; the fastest counts)")
    p.add_argument("--pair-iterations", type=_count, default=8, metavar="N",
                   help="ping-pongs of each pair in the pairs probe (default 8; bandwidth: N/4+1)")
    p.add_argument("--ratio", type=_ratio, default=DEFAULT_RATIO, metavar="X",
                   help=f"how much slower a half, host or link must be than its peers (default {DEFAULT_RATIO:g})")
    p.add_argument("--state-dir", metavar="DIR", help="the stress daemon's state directory (default: the config's)")
    p.add_argument("--force", action="store_true", help="run even while the stress daemon holds these hosts")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="output (default table; csv: one row per measurement, the verdict on stderr)")
    p.set_defaults(func=cmd_locate)


_count = cli_values.count_type(1, 100_000)
_ratio = cli_values.ratio_type("2")      # --ratio


def check_daemon(cfg, state_dir, force):
    """UserError when the stress daemon of this state directory runs on any of cfg's hosts."""
    from collbench.results.state_dir import RUNNING, StatePaths, daemon_status
    paths = StatePaths.for_config(cfg, state_dir)
    st = daemon_status(paths, scan=True)
    if st.state != RUNNING or force:
        return
    ours = {h.name for h in cfg.hosts}
    held = ours                               # its config unreadable: assume the same hosts
    source = st.info.get("config") if isinstance(st.info, dict) else None
    if isinstance(source, str) and os.path.isfile(source):
        try:
            held = {h.name for h in load_config(source).hosts}
        except UserError:
            pass
    both = sorted(ours & held)
    if both:
        raise UserError(f"the stress daemon (pid {st.pid}, state directory {paths.state_dir}) runs on "
                        f"{len(both)} of these hosts ({', '.join(both[:8])}{', ...' if len(both) > 8 else ''}): its "
                        "jobs would skew every probe; stop it (`collbench stress stop`) or pass --force")


def cmd_locate(args):
    cfg = load_config(args.config)
    if cfg.implicit_hosts or len(cfg.hosts) < 3:
        raise UserError(f"{cfg.source}: locate needs at least 3 configured hosts (got "
                        f"{0 if cfg.implicit_hosts else len(cfg.hosts)}): it compares hosts with their peers")
    cfg.engine = "builtin"
    apply_overrides(cfg, ops=args.op, sizes=args.size, iterations=args.iterations)
    steps = list(cfg.once_plan())
    if len(steps) != 1:
        raise UserError(f"--op {args.op} --size {args.size}: expected one step, got {len(steps)}")
    # one warm-up call: the fastest of the timed ones counts, and a shaped host's calls are slow
    steps = [dataclasses.replace(steps[0], warmup=1)]
    check_daemon(cfg, args.state_dir, args.force)
    engine = engines.get_engine(cfg.engine)
    engine.preflight(cfg, steps)
    from collbench.engines import launcher
    mpi = launcher.mpi_version(cfg)
    hosts = [h.name for h in cfg.hosts]
    expected = 4 * bisection_levels(len(hosts)) + 2     # each level and the pairs confirmed
    out = sys.stderr

    with harness.Run("locate", total=expected, unit="probes", on_stop="no probe job left, nothing named") as job:
        def on_probe(kind, members):
            job.progress.running(f"{kind} probe of {len(members)} hosts")
        prober = MpiProber(cfg, engine, steps[0], mpi, args.pair_iterations, cfg.step_timeout, on_probe)
        counted = _Counted(prober, job.progress)
        failed = None
        try:
            result = locate(hosts, counted, ratio=args.ratio)
        except LocateFailed as e:
            failed, result = e, e.result
    if job.stopped:
        return job.exit_code
    doc = dict(result.to_dict(), hosts=hosts, op=args.op, size=format_size(steps[0].size_bytes), ratio=args.ratio)
    # a probe's failure quotes what ssh and mpirun printed: shown, never obeyed by the terminal
    # (JSON escapes control characters itself)
    if args.format == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    elif args.format == "csv":
        sys.stdout.write(terminal_safe(csv_text(CSV_COLUMNS, csv_rows(doc)), one_line=False))
        print(f"collbench locate: {terminal_safe(result.verdict)}", file=out)
    else:
        sys.stdout.write(terminal_safe(table_text(doc), one_line=False))
    if failed is not None:
        print(f"collbench locate: {terminal_safe(result.verdict)}", file=out)
        return 1
    return 1 if result.culprit else 0


def bisection_levels(p):
    """How many halvings locate makes at most before the pairs probe."""
    n = 0
    while p > PAIR_GROUP:
        p, n = p - p // 2, n + 1
    return n


class _Counted:
    """The prober, with a progress line as each probe finishes."""

    def __init__(self, prober, progress):
        self.prober, self.progress = prober, progress

    def group(self, hosts):
        v = self.prober.group(hosts)
        self.progress.finished(f"group {','.join(hosts)}: {v:.4g} us")
        return v

    def pairs(self, hosts):
        v = self.prober.pairs(hosts)
        self.progress.finished(f"pairs of {','.join(hosts)}: {len(v)} pairs")
        return v


def csv_rows(doc):
    """One row per measurement: a group's collective (value: its fastest call) or a pair (value:
    microseconds per message); the culprit and verdict go to stderr."""
    rows = []
    for i, p in enumerate(doc["probes"], 1):
        base = {"probe": i, "kind": p["kind"], "hosts": " ".join(p["hosts"]), "failed": p.get("failed")}
        if p["kind"] == "group" or p.get("failed"):
            rows.append(dict(base, value_us=p.get("value")))
        else:
            rows += [dict(base, a=x["a"], b=x["b"], value_us=x["cost"]) for x in p["pairs"]]
    return rows


def table_text(doc):
    lines = [f"locate: {doc['op']} {doc['size']} on {len(doc['hosts'])} hosts, ratio {doc['ratio']:g}"]
    for i, p in enumerate(doc["probes"], 1):
        members = ",".join(p["hosts"])
        if p.get("failed"):
            what = f"FAILED: {p['failed'][:120]}"
        elif p["kind"] == "group":
            what = f"fastest iteration {p['value']:.4g} us"
        else:
            what = "; ".join(f"{x['a']}-{x['b']} {x['cost']:.4g}" for x in p["pairs"]) + " (us per message)"
        lines.append(f"  probe {i} {p['kind']:<5} {members}: {what}")
    c = doc["culprit"]
    named = "nothing named" if c is None else (f"host {c['host']}" if "host" in c else f"link {c['link'][0]}-{c['link'][1]}")
    lines.append(f"culprit: {named}")
    lines.append(f"  {doc['verdict']}")
    lines.append(f"{len(doc['probes'])} probes ({doc['measurements']} measurements: collective runs + pairs; a full "
                 f"matrix measures {len(doc['hosts']) * (len(doc['hosts']) - 1) // 2} pairs) in {doc['seconds']:.1f} s")
    return "\n".join(lines) + "\n"
