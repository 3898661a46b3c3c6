"""`collbench scrape-config`: the Prometheus target list (file_sd) of the per-host counters
exporters, from the hostfile, or the scrape job that reads it."""

import unicodedata

from collbench.atomic_file import write_output
from collbench.bounded_repr import bounded_repr, bounded_text
from collbench.cli import add_config_arg
from collbench.config import PORT, check_flag, flag_path, int_flag, load_config, parse_hostfile
from collbench.errors import UserError
from collbench.monitoring import scrape_config
from collbench.names import dns_name_problem


def _hosts(args):
    if args.hostfile is not None:
        where = f"hostfile {flag_path(args.hostfile)}"
        names = [h.name for h in parse_hostfile(flag_path(args.hostfile))]   # bad file: ConfigError, exit 2
    else:
        cfg = load_config(args.config)
        if cfg.implicit_hosts:
            raise UserError(f"{cfg.source}: the config names no hosts: set hosts (a hostfile or a list) "
                            "or give --hostfile")
        where, names = f"{cfg.source}: hosts", cfg.host_names
    # each becomes a scrape target Prometheus resolves: a DNS name or an address, nothing else
    for name in names:
        problem = dns_name_problem(name)
        if problem:
            raise UserError(f"{bounded_text(where, 200)}: host {bounded_repr(name)}: {problem}")
    return names


def _no_line_break(flag, value, expected):
    """A flag's value that becomes one YAML scalar: no control characters, line or paragraph
    separators (\\r, U+0085, U+2028 end a line for YAML readers and editors alike)."""
    if not value.strip() or value != value.strip() or len(value) > 4096 or any(
            unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value):
        raise UserError(f"{flag}: got {bounded_repr(value)}, expected {expected} (no surrounding spaces, no "
                        "control characters or line breaks)")
    return value


def _run(args):
    port = check_flag("--port", PORT, args.port)
    if args.format == "job":
        path = _no_line_break("--targets-path", args.targets_path, "a file path")
        job = _no_line_break("--job", args.job, "a scrape job name")
        text = scrape_config.render_job(path, job)
    else:
        text = scrape_config.render_targets(_hosts(args), port)
    # atomically: Prometheus re-reads the file when it changes and must never see half of it
    write_output(args.output, text)
    return 0


def register(subparsers):
    p = subparsers.add_parser(
        "scrape-config", help="write Prometheus' target list of the per-host counters exporters",
        description="Write the Prometheus file_sd target list of the per-host counters exporters "
                    "(`collbench ctl deploy --counters-exporter`): one target HOST:PORT per host of the "
                    "hostfile, labelled host=HOST. --format job writes the scrape_configs entry that "
                    "reads it.")
    add_config_arg(p)
    p.add_argument("--hostfile", metavar="FILE", help="take the hosts from this hostfile instead of the config")
    p.add_argument("--port", type=int_flag, default=scrape_config.COUNTERS_PORT,
                   help=f"the counters exporters' port (default {scrape_config.COUNTERS_PORT})")
    p.add_argument("--format", choices=("file_sd", "job"), default="file_sd",
                   help="file_sd: the target list, JSON (default); job: the scrape_configs entry, YAML")
    p.add_argument("--targets-path", default=scrape_config.DEFAULT_TARGETS_PATH, metavar="PATH",
                   help=f"job: where Prometheus finds the target list (default {scrape_config.DEFAULT_TARGETS_PATH})")
    p.add_argument("--job", default=scrape_config.COUNTERS_JOB,
                   help=f"job: the scrape job's name (default {scrape_config.COUNTERS_JOB})")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    p.set_defaults(func=_run)
