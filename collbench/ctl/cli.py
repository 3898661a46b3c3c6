"""`collbench ctl once|start|stop|status|servers|log|deploy`: drive the master from a laptop.

With `master.host` in the config every verb runs on the master over SSH (collbench.ctl.remote);
without it (or with --local) the same verb runs here, by calling the local command. Arguments
after `--` are passed on to the command the verb runs (`collbench ctl once -- --ops allreduce`).
Exit codes: the remote command's own, 2 for a bad config or flag, 130 after Ctrl-C, and for
SSH failures: 10 host unreachable, 11 timeout, 12 authentication failed, 13 unknown host key
(shown with its fingerprint; --accept-new-host-key), 14 host key changed (always refused),
15 collbench missing on the master (`ctl deploy`), 16 other SSH errors.
"""

import argparse
import json
import sys

from collbench import cli as collbench_cli
from collbench.ctl import servers
from collbench.ctl.remote import is_remote, load, open_master
from collbench.errors import UserError

# verb -> (the collbench command it runs, help)
VERBS = {
    "once": (("once",), "run the plan once and print the table (streams progress; Ctrl-C stops it on the master)"),
    "start": (("stress", "start"), "start the stress daemon on the master"),
    "stop": (("stress", "stop"), "stop the stress daemon and everything it started"),
    "status": (("stress", "status"), "the stress daemon's state"),
    "log": (("stress", "log"), "the stress daemon's recent results and events"),
}


def register(subparsers):
    p = subparsers.add_parser(
        "ctl", help="drive collbench on the master over SSH (or locally without master.host)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="ctl_verb", metavar="VERB")
    verbs.required = True
    for verb, (_, help_text) in VERBS.items():
        v = verbs.add_parser(verb, help=help_text, description=help_text)
        _common(v)
        v.add_argument("args", nargs="*", metavar="-- ARGS",
                       help=f"passed on to `collbench {' '.join(VERBS[verb][0])}`")
        v.set_defaults(func=run_verb)
    v = verbs.add_parser("servers", help="check every host of the hostfile in parallel",
                         description=servers.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(v)
    v.add_argument("--timeout", type=float, default=None,
                   help="seconds per host (default master.connect_timeout)")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=run_servers)
    v = verbs.add_parser("deploy", help="install or update collbench on the master (and hosts), "
                                        "upload the config, build the engine")
    _common(v)
    from collbench.ctl import deploy
    deploy.add_arguments(v)
    v.set_defaults(func=deploy.run_cli)


def _common(p):
    collbench_cli.add_config_arg(p)
    p.add_argument("--host", help="master host (overrides master.host)")
    p.add_argument("--local", action="store_true", help="act on this machine even if master.host is set")
    p.add_argument("--accept-new-host-key", action="store_true",
                   help="trust the master's host key if known_hosts does not know it yet (it is "
                        "shown and added); a changed key is always refused")
    p.add_argument("--ask-password", action="store_true",
                   help="prompt for an SSH password, tried after the keys "
                        "(or set COLLBENCH_SSH_PASSWORD)")
    p.add_argument("--upload-config", dest="upload_config", action="store_true", default=None,
                   help="upload the local config even though master.remote_config is set")
    p.add_argument("--no-upload-config", dest="upload_config", action="store_false",
                   help="use the config already on the master")


def local_argv(cfg, command, extra):
    argv = list(command)
    if cfg.source != "<default>":
        argv += ["--config", cfg.source]
    return argv + list(extra)


def run_verb(args):
    cfg = load(args)
    command = VERBS[args.ctl_verb][0]
    if not is_remote(cfg, args):
        return collbench_cli.main(local_argv(cfg, command, args.args))
    timeout = cfg.master.command_timeout if args.ctl_verb == "once" else None
    with open_master(cfg, args) as m:
        m.probe()
        rc_path = m.prepare_config(args.upload_config)
        extra = list(args.args)
        # the daemon's state directory on the master, unless the operator passed one explicitly
        if command[0] == "stress" and cfg.master.remote_state_dir and "--state-dir" not in extra:
            extra = ["--state-dir", cfg.master.remote_state_dir] + extra
        return m.stream(m.collbench_argv(*command, "--config", rc_path, *extra), timeout=timeout)


def run_servers(args):
    cfg = load(args)
    timeout = args.timeout or cfg.master.connect_timeout
    if not is_remote(cfg, args):
        return servers.main_local(cfg, timeout, args.json)
    with open_master(cfg, args) as m:
        m.probe()
        rc_path = m.prepare_config(args.upload_config)
        rc, out = m.capture(m.collbench_argv("ctl", "servers", "--local", "--json", "--config", rc_path,
                                             "--timeout", f"{timeout:g}"), timeout=timeout * 3 + 30)
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UserError(f"`collbench ctl servers` on {cfg.master.host} exited {rc} without a report") from None
    if args.json:
        json.dump(report, sys.stdout)
        print()
    else:
        print(servers.format_table(report))
    return servers.exit_status(report)
