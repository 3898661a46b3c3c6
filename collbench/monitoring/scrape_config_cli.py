"""`collbench scrape-config`: the Prometheus target list (file_sd) of the per-host counters
exporters, from the hostfile, or the scrape job that reads it."""

from collbench.atomic_file import write_output
from collbench.cli import add_config_arg
from collbench.config import PORT, check_flag, flag_path, int_flag, load_config, parse_hostfile
from collbench.errors import UserError
from collbench.monitoring import scrape_config


def _hosts(args):
    if args.hostfile is not None:
        return [h.name for h in parse_hostfile(flag_path(args.hostfile))]   # bad file: ConfigError, exit 2
    cfg = load_config(args.config)
    if cfg.implicit_hosts:
        raise UserError(f"{cfg.source}: the config names no hosts: set hosts (a hostfile or a list) "
                        "or give --hostfile")
    return cfg.host_names


def _run(args):
    port = check_flag("--port", PORT, args.port)
    if args.format == "job":
        if not args.targets_path.strip() or "\n" in args.targets_path:
            raise UserError(f"--targets-path: got {args.targets_path!r}, expected a file path")
        text = scrape_config.render_job(args.targets_path, args.job)
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
