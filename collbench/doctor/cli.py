"""`collbench doctor`: a verdict per host (healthy, degraded, failed) with its reasons, from each
host's reachability, port state and RoCE settings compared with the config's expectations and
with the other hosts, and from the latest results (docs/DOCTOR.md).

Exit 0 every host healthy; 1 any host degraded or failed; 2 bad config, flag or results file.
"""

import json
import os
import sys

from collbench.bounded_repr import terminal_safe
from collbench.config import load_config
from collbench.doctor import checks, gather, latest_results
from collbench.tables import Column, csv_text

FORMATS = ("table", "csv", "json")
COLUMNS = [Column("host", align="left"), Column("verdict", align="left"), Column("reasons", align="left")]


def register(subparsers):
    from collbench.cli import add_config_arg
    p = subparsers.add_parser(
        "doctor", help="a verdict per host: healthy, degraded or failed, and why",
        description="Check every host of the config: reachable, links and RDMA ports up, and its RoCE "
                    "settings (MTU, link speed and width, PFC priorities, trust mode, ECN per priority at "
                    "the notification and reaction points, CNP priority and DSCP, the RoCE v2 GID and its "
                    "index, the devices and GID index the config's UCX_*/NCCL_IB_* settings name) against "
                    "the config's doctor section and the other hosts; warns on PFC without ECN, ECN without "
                    "PFC and MTUs that differ between hosts; adds, per host, the latest results' failures "
                    "and the steps whose rank the others waited for (kept off its CPU).",
        epilog="Settings are read from doctor.sysfs_root (per host: doctor.hosts) and mlnx_qos, or on each "
               "host over SSH (doctor.remote). Exit code 1 when any host is degraded or failed, 2 on a "
               "bad config, flag or results file.")
    add_config_arg(p)
    p.add_argument("--results", metavar="FILE", action="append",
                   help="results log(s) to take the latest steps from (default: the stress daemon's, "
                        "when there is one; repeatable)")
    p.add_argument("--state-dir", metavar="DIR", help="the stress daemon's state directory (default: the config's)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output (default table)")
    p.set_defaults(func=cmd_doctor)


def _results_paths(args, cfg):
    if args.results:
        return args.results
    from collbench.results.state_dir import StatePaths
    path = StatePaths.for_config(cfg, args.state_dir).results_log
    return [path] if os.path.isfile(path) else []


def cmd_doctor(args):
    cfg = load_config(args.config)
    paths = _results_paths(args, cfg)
    by_host, summary = {}, ""
    if paths:
        records, summary = latest_results.read_latest(paths, cfg.doctor.results_records)
        by_host = latest_results.per_host(records)
    hosts = gather.gather(cfg)
    verdicts = checks.judge(hosts, cfg, by_host)
    if summary:
        print(f"collbench doctor: results: {terminal_safe(summary)}", file=sys.stderr)
    sys.stdout.write(render(verdicts, args.format))
    return 1 if any(v.verdict != checks.HEALTHY for v in verdicts) else 0


def _rows(verdicts):
    return [{"host": terminal_safe(v.host), "verdict": v.verdict,
             "reasons": terminal_safe("; ".join(t for _, t in v.reasons))} for v in verdicts]


def render(verdicts, fmt):
    if fmt == "json":
        counts = {k: sum(v.verdict == k for v in verdicts) for k in (checks.HEALTHY, checks.DEGRADED, checks.FAILED)}
        return json.dumps({"hosts": [v.to_dict() for v in verdicts], "counts": counts}, indent=1) + "\n"
    if fmt == "csv":
        return csv_text(COLUMNS, _rows(verdicts))
    # every value may come from a file of the host's (operstate), the config or a results log:
    # shown, never obeyed by the terminal (JSON escapes control characters itself)
    lines = []
    for v in verdicts:
        lines.append(f"{terminal_safe(v.host)}  {v.verdict.upper()}")
        lines += [f"  {lv}: {terminal_safe(t)}" for lv, t in v.reasons]
        lines += [f"  note: {terminal_safe(t)}" for t in v.notes]
    bad = [v for v in verdicts if v.verdict != checks.HEALTHY]
    lines.append("")
    lines.append(f"{len(verdicts) - len(bad)} of {len(verdicts)} host(s) healthy"
                 + (f"; look at {', '.join(terminal_safe(v.host) for v in bad)}" if bad else ""))
    return "\n".join(lines) + "\n"
