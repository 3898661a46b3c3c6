"""The per-host counters exporter as a systemd unit: `collbench exporter --counters-only` with the
config's exporter settings as flags, so the unit is the whole deployment (no config file on the
host), and its installation on one host (`ctl deploy --counters-exporter`, deploy.py).

The unit's command line is written in systemd's own syntax (systemd.service(5), "Command lines"):
a word that is not plain is double-quoted with backslash escapes, and `%` / `$` are doubled so
that systemd expands neither specifiers nor variables in it. deploy/collbench-counters.service
is this rendering for the default config (tests keep them equal).
"""

import posixpath
import re

from collbench.config import EXPORTER_SCHEMA
from collbench.config.schema import COUNTERS_COLLECTORS
from collbench.errors import UserError

UNIT = "collbench-counters.service"
UNIT_DIR = "/etc/systemd/system"
PORT = 9106                          # collbench/exporter/cli.py COUNTERS_LISTEN, scrape_config.COUNTERS_PORT
HEALTH_WAIT_S = 20.0
_PLAIN = re.compile(r"^[A-Za-z0-9_./@:+,=-]+$")

UNIT_TEXT = """\
# collbench counters exporter: this host's RDMA / PFC / ECN / netstat counters for Prometheus on
# :{port} (no results log). Installed on every host of the hostfile by
# `collbench ctl deploy --counters-exporter`; scraped through the target list of
# `collbench scrape-config` (docs/SETUP.md, "Counters on every host"). Generated: redeploy, do not edit.
[Unit]
Description=collbench counters exporter (RDMA/PFC/ECN counters of this host)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart={exec_start}
Restart=on-failure
RestartSec=5
# Exit 2 is a configuration error (bad flag, port in use): do not loop on it.
RestartPreventExitStatus=2
# sysfs counters and the ethtool statistics ioctl (ETHTOOL_GSTATS) need no privileges.
DynamicUser=yes
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
ProtectControlGroups=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK
MemoryMax=128M

[Install]
WantedBy=multi-user.target
"""


def systemd_word(word, what):
    """One word of an ExecStart line, as systemd reads it back exactly; UserError for a word no
    unit file can hold (control characters, newlines)."""
    word = str(word)
    if not word or any(ord(c) < 32 or ord(c) == 127 for c in word):
        raise UserError(f"{what}: got {word!r}, expected a non-empty value without control characters "
                        "(it goes into a systemd unit)")
    if _PLAIN.match(word):
        return word
    quoted = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{quoted}"'


def exporter_argv(cfg, python, port=PORT):
    """The counters exporter's argv: the config's exporter settings that select what is read."""
    ex = cfg.exporter
    argv = [python, "-m", "collbench", "exporter", "--counters-only", "--listen", f"0.0.0.0:{port}",
            "--log-level", "warning"]
    collectors = [c for c in ex.collectors if c in COUNTERS_COLLECTORS]
    if collectors and collectors != list(COUNTERS_COLLECTORS):
        argv += ["--collectors", ",".join(collectors)]
    for flag, value in (("--sysfs-root", ex.sysfs_root), ("--procfs-root", ex.procfs_root),
                        ("--ethtool", ex.ethtool), ("--device-include", ex.device_include),
                        ("--device-exclude", ex.device_exclude)):
        if value:
            argv += [flag, value]
    if ex.collector_timeout != EXPORTER_SCHEMA["collector_timeout"][1]:
        argv += ["--collector-timeout", f"{ex.collector_timeout:g}"]
    if ex.netdevs:
        argv += ["--netdevs", ",".join(ex.netdevs)]
    return argv


def render_unit(cfg, python, port=PORT):
    words = [systemd_word(w, "the counters exporter's command line") for w in exporter_argv(cfg, python, port)]
    return UNIT_TEXT.format(port=port, exec_start=" ".join(words))


# run on the host by its own Python: wait (bounded) for the exporter's /health to say ok
HEALTH_PROBE = """import json, sys, time, urllib.request
port, wait = int(sys.argv[1]), float(sys.argv[2])
deadline, last = time.monotonic() + wait, "no answer"
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            if json.loads(r.read().decode()).get("status") == "ok":
                print("ok")
                sys.exit(0)
    except Exception as e:
        last = str(e)
    time.sleep(0.3)
print(last)
sys.exit(1)
"""


def install_unit(conn, host, text, unit_dir=UNIT_DIR, systemctl="systemctl", python="python3",
                 port=PORT, log=print):
    """Write the unit on conn's host, (re)start it with systemctl, and wait for its /health.

    `conn` runs argv lists (ssh.Connection, or deploy.LocalHost for this machine) and uploads
    files atomically (put_text). UserError naming the host and the step that failed."""
    path = posixpath.join(unit_dir, UNIT)
    conn.put_text(path, text, 0o644)
    for step in (["daemon-reload"], ["enable", UNIT], ["restart", UNIT]):
        res = conn.run([systemctl, *step], timeout=120)
        if res.returncode != 0:
            tail = " ".join((res.stderr + res.stdout).split())[-300:]
            raise UserError(f"{host}: `{systemctl} {' '.join(step)}` failed (exit {res.returncode}): {tail}")
    res = conn.run([python, "-", str(port), f"{HEALTH_WAIT_S:g}"], timeout=HEALTH_WAIT_S + 30, input=HEALTH_PROBE)
    if res.returncode != 0:
        status = conn.run([systemctl, "status", UNIT], timeout=60)
        tail = " ".join((status.stdout + status.stderr).split())[-400:]
        raise UserError(f"{host}: the counters exporter does not answer on :{port}/health "
                        f"({res.stdout.strip()[-200:]}); {systemctl} status: {tail}")
    log(f"{host}: counters exporter running ({path}, :{port})")
