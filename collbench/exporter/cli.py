"""`collbench exporter`: serve the results log and the host's congestion counters to Prometheus.

Settings come from the config's `exporter` section, overridden by flags. Every bad value
(address, port in use, regex, TLS file, password) is a UserError: one line, exit 2.
"""

import logging
import os
import sys
import threading
from types import SimpleNamespace

from collbench import signals
from collbench.config import EXPORTER_SCHEMA, POS_FLOAT, POS_INT, check_flag, flag_path, load_config
from collbench.errors import ConfigError, UserError
from collbench.results.state_dir import StatePaths

PASSWORD_ENV = "COLLBENCH_EXPORTER_PASSWORD"
# --counters-only: the per-host exporter `ctl deploy --counters-exporter` installs on every host
# (the collectors registered with counters=True, no results log); its own port, so it can run
# beside the master's full exporter on 9105. scrape_config.py writes Prometheus' targets for it.
COUNTERS_LISTEN = "0.0.0.0:9106"
STOP_SECONDS = 0.9     # SIGTERM to exit, at most


def register(subparsers):
    from collbench.cli import add_config_arg
    p = subparsers.add_parser(
        "exporter", help="serve benchmark results and congestion counters to Prometheus",
        description="Prometheus exporter: tails the stress daemon's results log and reads RDMA sysfs, "
                    "ethtool -S and /proc/net/netstat counters at scrape time. Serves /metrics, /health "
                    "and a landing page. Flags override the config's exporter section.")
    add_config_arg(p)
    p.add_argument("--listen", "--web.listen-address", dest="listen", metavar="HOST:PORT",
                   help="address to serve on (default 0.0.0.0:9105; 9105 is also the Mesos exporter's port)")
    p.add_argument("--counters-only", action="store_true",
                   help="serve only this host's congestion counters (RDMA sysfs, ethtool, netstat): no "
                        f"results log, no baseline; default listen {COUNTERS_LISTEN} (the per-host "
                        "exporter of `collbench ctl deploy --counters-exporter`)")
    p.add_argument("--results-log", metavar="PATH",
                   help="results log to tail (default: <state_dir>/results.jsonl, the stress daemon's log)")
    p.add_argument("--state-dir", metavar="DIR", help="the stress daemon's state directory (for stress_running)")
    p.add_argument("--max-age", metavar="SECONDS", type=float,
                   help="drop result series older than this (default 900)")
    p.add_argument("--poll-interval", metavar="SECONDS", type=float, help="results log poll period (default 1)")
    p.add_argument("--max-series", metavar="N", type=int,
                   help="result series kept per metric family; results of more are dropped and counted (default 10000)")
    p.add_argument("--legacy-metrics", action="store_const", const=True, default=None,
                   help="also serve the prototype's mpi_* metric names")
    p.add_argument("--collectors", metavar="LIST",
                   help=f"comma list of collectors (default all: {', '.join(EXPORTER_SCHEMA['collectors'][1])})")
    p.add_argument("--tls-cert", "--web.tls-cert", dest="tls_cert", metavar="PEM", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", "--web.tls-key", dest="tls_key", metavar="PEM", help="private key of --tls-cert")
    p.add_argument("--basic-auth-user", metavar="USER", help="require HTTP basic auth with this user")
    p.add_argument("--basic-auth-password-file", metavar="FILE",
                   help=f"file holding the basic auth password (or set ${PASSWORD_ENV})")
    p.add_argument("--sysfs-root", metavar="DIR", help="sysfs mount (default /sys; tests use fixture trees)")
    p.add_argument("--procfs-root", metavar="DIR", help="procfs mount (default /proc)")
    p.add_argument("--ethtool", metavar="CMD", help="ethtool command (default ethtool)")
    p.add_argument("--netdevs", metavar="LIST", help="comma list of netdevs for ethtool -S (default: the RDMA devices')")
    p.add_argument("--device-include", metavar="REGEX",
                   help="only RDMA devices / netdevs matching this (RE2 syntax, as Prometheus')")
    p.add_argument("--device-exclude", metavar="REGEX", help="skip RDMA devices / netdevs matching this (RE2)")
    p.add_argument("--collector-timeout", metavar="SECONDS", type=float,
                   help="a collector that has not answered within this is left out of the scrape "
                        "(collbench_collector_success 0; default 3)")
    p.add_argument("--baseline", metavar="NAME|PATH",
                   help="serve this baseline (collbench baseline save) as collbench_baseline_* beside the live "
                        "series: a name in the state directory or a path ending in .json")
    p.add_argument("--inspector-dir", metavar="DIR",
                   help="follow a job's NCCL Inspector files in DIR (exporter.inspector_dir; docs/INSPECTOR.md)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def _comma(value):
    return [x.strip() for x in value.split(",") if x.strip()]


def exporter_settings(args):
    """The resolved exporter settings (SimpleNamespace) from config + flags; UserError if bad."""
    cfg = load_config(args.config)
    # Paths in the config come resolved against the config file's directory; on the command
    # line they are relative to the cwd (flag_path).
    ex = vars(cfg.exporter).copy()
    flags = {"listen": args.listen, "results_log": args.results_log, "legacy_metrics": args.legacy_metrics,
             "tls_cert": args.tls_cert, "tls_key": args.tls_key, "basic_auth_user": args.basic_auth_user,
             "basic_auth_password_file": args.basic_auth_password_file, "sysfs_root": args.sysfs_root,
             "procfs_root": args.procfs_root, "ethtool": args.ethtool,
             "device_include": args.device_include, "device_exclude": args.device_exclude,
             "inspector_dir": args.inspector_dir}
    for key, value in flags.items():
        if value is not None:
            ex[key] = flag_path(value) if key in (
                "results_log", "tls_cert", "tls_key", "basic_auth_password_file",
                "sysfs_root", "procfs_root", "inspector_dir") else value
    if args.max_age is not None:
        ex["max_age"] = check_flag("--max-age", POS_FLOAT, args.max_age)
    if args.poll_interval is not None:
        ex["poll_interval"] = check_flag("--poll-interval", POS_FLOAT, args.poll_interval)
    if args.max_series is not None:
        ex["max_series"] = check_flag("--max-series", POS_INT, args.max_series)
    if args.collector_timeout is not None:
        ex["collector_timeout"] = check_flag("--collector-timeout", POS_FLOAT, args.collector_timeout)
    if args.collectors is not None:
        ex["collectors"] = _comma(args.collectors)
    if args.netdevs is not None:
        ex["netdevs"] = _comma(args.netdevs)
    counters_only = bool(getattr(args, "counters_only", False))
    if counters_only:
        _counters_only(ex, args)
    paths = StatePaths.for_config(cfg, args.state_dir)
    ex["state_dir"] = paths.state_dir
    if not ex.get("results_log"):
        ex["results_log"] = paths.results_log
    ex["counters_only"] = counters_only
    ex["shift_ratio"] = cfg.alerts.shift_ratio     # the latency_shift collector's size gate

    if args.baseline is not None:
        ex["baseline"] = args.baseline
    if ex.get("baseline"):
        # a name lives in the state directory; a path (.json) is relative to the config file when
        # it comes from the config, to the cwd on the command line
        from collbench.baselines.baseline_file import resolve_path
        if ex["baseline"].endswith(".json"):
            ex["baseline"] = cfg.resolve_path(ex["baseline"]) if args.baseline is None else flag_path(ex["baseline"])
        try:   # a bad name is exit 2 now; a missing or bad file is the collector's failure at scrape time
            resolve_path(ex["baseline"], paths.state_dir)
        except UserError as e:
            raise UserError(f"{'--baseline' if args.baseline is not None else 'exporter.baseline'}: {e}") from None
    ex["transport"], ex["engine"] = cfg.transport, cfg.engine   # which baseline entry matches the live series

    from collbench.exporter.collectors import compile_device_regex, selectable
    source = cfg.source if args.collectors is None else "--collectors"
    known = selectable()
    for name in ex["collectors"]:
        if name not in known:
            raise ConfigError(source, "exporter.collectors" if args.collectors is None else None,
                              f"unknown collector {name!r} (expected some of: {', '.join(known)})")
    for key in ("device_include", "device_exclude"):
        if ex.get(key):
            try:
                compile_device_regex(ex[key], f"exporter.{key}")
            except ValueError as e:
                raise UserError(str(e)) from None
    if bool(ex.get("tls_cert")) != bool(ex.get("tls_key")):
        raise UserError("exporter.tls_cert and exporter.tls_key: set both (a certificate and its key) or neither")
    if not counters_only and os.path.isdir(ex["results_log"]):
        raise UserError(f"exporter.results_log: {ex['results_log']} is a directory, expected the results log file")
    ex["password"] = _password(ex)
    return SimpleNamespace(**ex)


def _counters_only(ex, args):
    """--counters-only: the congestion collectors only, on their own port; flags that need the
    results log are refused (exit 2) rather than silently ignored."""
    for flag, value in (("--results-log", args.results_log), ("--baseline", args.baseline),
                        ("--legacy-metrics", args.legacy_metrics), ("--max-series", args.max_series),
                        ("--max-age", args.max_age), ("--poll-interval", args.poll_interval)):
        if value is not None:
            raise UserError(f"{flag} reads the results log: it does not go with --counters-only")
    from collbench.exporter.collectors import counters_collectors, selectable
    counters = counters_collectors()
    if args.collectors is None:
        ex["collectors"] = [c for c in ex["collectors"] if c in counters] or counters
    else:
        for name in ex["collectors"]:
            if name in selectable() and name not in counters:
                raise UserError(f"--collectors: {name!r} reads the results log; with --counters-only expected "
                                f"some of: {', '.join(counters)}")
    if args.listen is None:
        ex["listen"] = COUNTERS_LISTEN
    ex["legacy_metrics"] = False
    ex["baseline"] = None


def _password(ex):
    user, path = ex.get("basic_auth_user"), ex.get("basic_auth_password_file")
    password = None
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                password = f.read().rstrip("\r\n")
        except OSError as e:
            raise UserError(f"exporter.basic_auth_password_file: cannot read {path}: {e.strerror}") from None
        if not password:
            raise UserError(f"exporter.basic_auth_password_file: {path} is empty")
        if os.stat(path).st_mode & 0o077:
            logging.getLogger("collbench.exporter").warning(
                "%s is readable by other users: chmod 600 it", path)
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    if user and password is None:
        raise UserError(f"exporter.basic_auth_user is set but there is no password: set "
                        f"exporter.basic_auth_password_file or ${PASSWORD_ENV}")
    if password is not None and path and not user:
        raise UserError("exporter.basic_auth_password_file is set but exporter.basic_auth_user is not")
    return password if user else None


def run(args):
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = exporter_settings(args)
    from collbench.exporter.app import Exporter
    from collbench.exporter.server import BasicAuth, ExporterHTTPServer, parse_listen, tls_context

    address = parse_listen(settings.listen, "--listen" if args.listen else "exporter.listen")
    ctx = tls_context(settings.tls_cert, settings.tls_key) if settings.tls_cert else None
    auth = BasicAuth(settings.basic_auth_user, settings.password) if settings.basic_auth_user else None
    exporter = Exporter(settings)
    server = ExporterHTTPServer(address, exporter, tls_context=ctx, auth=auth)   # binds: fails before start-up work
    exporter.start()
    log = logging.getLogger("collbench.exporter")
    log.info("serving %s://%s:%d/metrics (%s)", "https" if ctx else "http", address[0], server.port,
             "counters only" if settings.counters_only else f"results log {settings.results_log}")

    # SIGTERM / Ctrl-C: stop serving, stop the collectors (a command in flight is killed with its
    # process group), exit 0 within STOP_SECONDS whatever a collector is blocked on: its thread is
    # a daemon, and past the deadline (or at a second signal) the process ends at once.
    def stop(signum, frame):
        if stopping.is_set():
            os._exit(128 + signum)
        stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()
        watchdog = threading.Timer(STOP_SECONDS, os._exit, (0,))
        watchdog.daemon = True
        watchdog.start()

    stopping = threading.Event()
    signals.install(signals.SERVER, stop)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        exporter.stop(join_timeout=0.3)
        server.server_close()
    log.info("stopped")
    return 0
