"""The SSH controller against a real sshd on loopback (started from a temp dir with generated keys).

Each failure kind must come back as its own exception and exit code within the timeout, and
nothing a host name, path or config value holds may ever be run by a remote shell.
"""

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from collbench.config import load_config
from collbench.ctl import remote, servers, ssh
from collbench.errors import ConfigError
from conftest import REPO, require_tool, unused_port

TIMEOUT = 4.0   # connect timeout used throughout; every failure must come back within it


def _keygen(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path



class Sshd:
    """A real OpenSSH sshd on 127.0.0.1:<port>, root login by key only."""

    def __init__(self, d):
        self.dir = d
        self.port = unused_port()
        self.host_key = _keygen(d / "host_key")
        self.client_key = _keygen(d / "client_key")
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        self.config = d / "sshd_config"
        self.config.write_text("\n".join([
            "ListenAddress 127.0.0.1", f"Port {self.port}", f"HostKey {self.host_key}",
            f"PidFile {d / 'sshd.pid'}", f"AuthorizedKeysFile {d / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "Subsystem sftp internal-sftp", "MaxStartups 50", "LogLevel ERROR", ""]))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.proc = subprocess.Popen([require_tool("sshd"), "-D", "-e",
                                      "-f", str(self.config)], stderr=open(d / "sshd.log", "wb"))
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(4) == b"SSH-":
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
            time.sleep(0.05)
        self.known_hosts = d / "known_hosts"
        kt, kb = (d / "host_key.pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {kt} {kb}\n")
        self.fingerprint = subprocess.run(["ssh-keygen", "-lf", str(d / "host_key.pub")], capture_output=True,
                                          text=True, check=True).stdout.split()[1]

    def target(self, host="127.0.0.1", **kw):
        args = dict(user="root", port=self.port, identity_file=str(self.client_key),
                    known_hosts=str(self.known_hosts), connect_timeout=TIMEOUT, ssh_config=str(self.dir / "none"))
        args.update(kw)
        t = ssh.resolve_target(host, **args)
        t.identities_only = True   # only the key under test, never ~/.ssh/id_* or an agent
        return t

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshd")
    (d / "none").write_text("")
    s = Sshd(d)
    yield s
    s.stop()


@pytest.fixture
def silent_port():
    """A listening socket that accepts and never says a word (not an sshd)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(2)
    for c in conns:
        c.close()
    srv.close()


def _elapsed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:
        return e, time.monotonic() - t0
    return None, time.monotonic() - t0


# ------------------------------------------------------------------ connecting

def test_key_auth_runs_commands_and_uploads(sshd, tmp_path):
    with ssh.connect(sshd.target()) as conn:
        res = conn.run(["sh", "-c", 'echo "out:$1"; echo err >&2; exit 3', "sh", "a b"], timeout=10)
        assert (res.returncode, res.stdout, res.stderr) == (3, "out:a b\n", "err\n")
        local = tmp_path / "up.txt"
        local.write_text("payload\n")
        dest = tmp_path / "deep" / "dir" / "file.yaml"
        conn.put_file(str(local), str(dest), mode=0o600)
        assert dest.read_text() == "payload\n"
        assert oct(dest.stat().st_mode & 0o777) == "0o600"
        assert [p.name for p in dest.parent.iterdir()] == ["file.yaml"]   # no temp file left


def test_wrong_key_is_an_auth_error(sshd, tmp_path):
    other = _keygen(tmp_path / "other_key")
    err, took = _elapsed(lambda: ssh.connect(sshd.target(identity_file=str(other))))
    assert isinstance(err, ssh.AuthenticationFailedError), err
    assert err.exit_code == ssh.EXIT_AUTH == 12
    assert "authentication failed" in str(err) and str(other) in str(err)
    assert took < TIMEOUT + 3


def test_unknown_host_key_is_refused_with_fingerprint_then_accepted(sshd, tmp_path):
    kh = tmp_path / "kh"
    err, took = _elapsed(lambda: ssh.connect(sshd.target(known_hosts=str(kh))))
    assert isinstance(err, ssh.UnknownHostKeyError), err
    assert err.exit_code == 13
    assert err.fingerprint == sshd.fingerprint and sshd.fingerprint in str(err)
    assert "--accept-new-host-key" in str(err)
    assert not kh.exists()                       # refusing writes nothing
    assert took < TIMEOUT + 3
    with ssh.connect(sshd.target(known_hosts=str(kh)), accept_new_host_key=True) as conn:
        assert conn.accepted_key == sshd.fingerprint
    assert kh.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    with ssh.connect(sshd.target(known_hosts=str(kh))) as conn:   # now known: no flag needed
        assert conn.accepted_key is None
        assert conn.run(["true"]).returncode == 0


def test_changed_host_key_is_always_refused(sshd, tmp_path):
    impostor = _keygen(tmp_path / "impostor")
    kh = tmp_path / "kh"
    kt, kb = (tmp_path / "impostor.pub").read_text().split()[:2]
    kh.write_text(f"[127.0.0.1]:{sshd.port} {kt} {kb}\n")
    for accept in (False, True):
        err, took = _elapsed(lambda: ssh.connect(sshd.target(known_hosts=str(kh)), accept_new_host_key=accept))
        assert isinstance(err, ssh.HostKeyMismatchError), err
        assert err.exit_code == 14 and "HOST KEY CHANGED" in str(err)
        assert sshd.fingerprint in str(err)
        assert took < TIMEOUT + 3
    assert kh.read_text() == f"[127.0.0.1]:{sshd.port} {kt} {kb}\n"   # never rewritten
    assert impostor.exists()


def test_closed_port_is_unreachable(sshd):
    port = unused_port()
    err, took = _elapsed(lambda: ssh.connect(sshd.target(port=port)))
    assert isinstance(err, ssh.HostUnreachableError), err
    assert err.exit_code == 10 and "connection refused" in str(err)
    assert took < TIMEOUT


def test_silent_listener_is_a_timeout(sshd, silent_port):
    err, took = _elapsed(lambda: ssh.connect(sshd.target(port=silent_port)))
    assert isinstance(err, ssh.SSHTimeoutError), err
    assert err.exit_code == 11
    assert TIMEOUT * 0.8 <= took < TIMEOUT + 4


def test_command_timeout(sshd):
    with ssh.connect(sshd.target()) as conn:
        err, took = _elapsed(lambda: conn.run(["sleep", "20"], timeout=1.5))
    assert isinstance(err, ssh.SSHTimeoutError), err
    assert took < 6


def test_ssh_config_alias_and_proxyjump(sshd, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("\n".join([
        "Host jumpbox", "  HostName 127.0.0.1", f"  Port {sshd.port}", "  User root",
        f"  IdentityFile {sshd.client_key}", "  IdentitiesOnly yes", f"  UserKnownHostsFile {sshd.known_hosts}",
        "Host behind", "  HostName 127.0.0.1", f"  Port {sshd.port}", "  User root", "  ProxyJump jumpbox",
        f"  IdentityFile {sshd.client_key}", "  IdentitiesOnly yes", f"  UserKnownHostsFile {sshd.known_hosts}", ""]))
    t = ssh.resolve_target("behind", ssh_config=str(cfg), connect_timeout=TIMEOUT)
    assert (t.hostname, t.port, t.user, t.proxy_jump) == ("127.0.0.1", sshd.port, "root", "jumpbox")
    with ssh.connect(t) as conn:
        assert conn._jumps, "the connection went through the jump host"
        assert conn.run(["echo", "via-jump"]).stdout == "via-jump\n"
    # config values beat ssh_config, as ssh(1) options do
    t2 = ssh.resolve_target("behind", ssh_config=str(cfg), port=1, connect_timeout=TIMEOUT)
    assert t2.port == 1


# ------------------------------------------------------------------ injection stays inert

EVIL = ["x; touch {c}", "$(touch {c})", "`touch {c}`", "a' ; touch {c}; '", 'a" ; touch {c}; "', "-rf {c}",
        "x\ntouch {c}", "x && touch {c}", "| touch {c}"]


def test_injection_in_arguments_and_paths_is_inert(sshd, tmp_path):
    canary = tmp_path / "canary"
    words = [e.format(c=canary) for e in EVIL]
    with ssh.connect(sshd.target()) as conn:
        res = conn.run(["printf", "%s\\0"] + words)
        assert res.stdout.split("\0")[:-1] == words          # arrived as exact argv words
        for w in words:
            assert conn.run(["test", "-e", w]).returncode == 1
        # SFTP takes the path literally, no shell: the odd name is just a file name
        src = tmp_path / "src"
        src.write_text("x")
        odd = tmp_path / "$(touch canary);x"
        conn.put_file(str(src), str(odd))
        assert odd.read_text() == "x"
    assert not canary.exists()


def test_injection_in_host_names_is_refused_before_any_connection(sshd, tmp_path):
    canary = tmp_path / "canary"
    for bad in (f"127.0.0.1;touch {canary}", f"$(touch {canary})", "-oProxyCommand=touch " + str(canary),
                f"h`touch {canary}`"):
        with pytest.raises(ConfigError) as ei:
            ssh.resolve_target(bad, ssh_config=str(sshd.dir / "none"))
        assert ei.value.exit_code == 2 and "master.host" in str(ei.value)
    # a ProxyCommand with %h must never see a hostile host name either
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  ProxyCommand sh -c 'echo %h > {tmp_path}/seen'\n")
    with pytest.raises(ConfigError):
        ssh.resolve_target(f"a;touch {canary}", ssh_config=str(cfg))
    with pytest.raises(ConfigError):
        ssh.resolve_target("good", user=f"root;touch {canary}", ssh_config=str(cfg))
    assert not canary.exists()


def _config(tmp_path, sshd, **master):
    m = {"host": "127.0.0.1", "port": sshd.port, "user": "root", "identity_file": str(sshd.client_key),
         "known_hosts": str(sshd.known_hosts), "ssh_config": str(sshd.dir / "none"),
         "connect_timeout": TIMEOUT, "remote_dir": str(REPO), "python": sys.executable}
    m.update(master)
    import yaml
    path = tmp_path / "collbench.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "master": m}))
    return path


def test_injection_in_config_values_is_inert(sshd, tmp_path):
    canary = tmp_path / "canary"
    cfg = load_config(str(_config(tmp_path, sshd, remote_dir=f"{tmp_path}/r; touch {canary} #",
                                  remote_config=f"{tmp_path}/$(touch {canary}).yaml")))
    with remote.Master(cfg) as m:
        with pytest.raises(ssh.RemoteCollbenchMissingError) as ei:
            m.probe()
        assert ei.value.exit_code == 15 and "ctl deploy" in str(ei.value)
        path = m.upload_config()
    assert path == f"{tmp_path}/$(touch {canary}).yaml" and os.path.isfile(path)
    assert not canary.exists()


# ------------------------------------------------------------------ the CLI's exit codes

def _ctl(args, timeout=60):
    return subprocess.run([sys.executable, "-m", "collbench", "ctl", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=dict(os.environ, SSH_AUTH_SOCK=""))


def test_cli_exit_codes_are_distinct(sshd, tmp_path, silent_port):
    other = _keygen(tmp_path / "other")
    cases = {
        10: dict(port=unused_port()),
        11: dict(port=silent_port, connect_timeout=1.5),   # the code, not the bound (test_silent_listener_...)
        12: dict(identity_file=str(other)),
        13: dict(known_hosts=str(tmp_path / "empty_known_hosts")),
        15: dict(remote_dir=str(tmp_path / "nowhere")),
    }
    for code, master in cases.items():
        d = tmp_path / f"c{code}"
        d.mkdir()
        res = _ctl(["status", "--config", str(_config(d, sshd, **master))])
        assert res.returncode == code, (code, res.stderr)
        assert res.stderr.startswith("collbench: error: "), res.stderr
    res = _ctl(["status", "--config", str(_config(tmp_path / "c13", sshd, known_hosts=str(tmp_path / "kh2")))])
    assert sshd.fingerprint in res.stderr


# ------------------------------------------------------------------ remote verbs: streaming, cancel

def _alive_with(marker):
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(d))
            except OSError:
                pass
    return found


class _InterruptOn(io.BytesIO):
    """A stdout that raises KeyboardInterrupt (as Ctrl-C would) once `word` was written."""

    def __init__(self, word):
        super().__init__()
        self.word = word.encode()
        self.fired = False

    def write(self, b):
        n = super().write(b)
        if self.word in self.getvalue() and not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return n


def _job(marker):
    # a job with a child in its own session (escapes the process group) and a grandchild
    script = (f"import subprocess, time; "
              f"subprocess.Popen(['sleep', '300', '{marker}'], start_new_session=True); "
              f"subprocess.Popen(['sh', '-c', 'sleep 301; : {marker}']); "
              f"print('started', flush=True); time.sleep(300)")
    return [sys.executable, "-c", script, marker]


def _wait_gone(marker, timeout=15):
    deadline = time.monotonic() + timeout
    while _alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive_with(marker)


def test_stream_and_ctrl_c_leaves_nothing_running(sshd, tmp_path):
    cfg = load_config(str(_config(tmp_path, sshd)))
    cfg.stress.stop_grace = 2.0
    marker = f"cbtest-{uuid.uuid4().hex}"
    with remote.Master(cfg) as m:
        assert m.probe()["version"]
        out = io.BytesIO()
        assert m.stream([sys.executable, "-c", "import sys; print('a'); print('b', file=sys.stderr); sys.exit(4)"],
                        stdout=out, stderr=io.BytesIO()) == 4
        assert out.getvalue() == b"a\n"
        stdout = _InterruptOn("started")
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            m.stream(_job(marker), stdout=stdout, stderr=io.BytesIO())
        assert stdout.fired and time.monotonic() - t0 < 20
    assert _wait_gone(marker) == []


def test_lost_connection_stops_the_remote_command(sshd, tmp_path):
    cfg = load_config(str(_config(tmp_path, sshd)))
    marker = f"cbtest-{uuid.uuid4().hex}"
    m = remote.Master(cfg)
    conn = m.connect()
    chan = conn.open_channel([m.python, "-m", "collbench.ctl.agent", "--grace", "2", "--", *_job(marker)])
    deadline = time.monotonic() + 20
    buf = b""
    while b"started" not in buf and time.monotonic() < deadline:
        if chan.recv_ready():
            buf += chan.recv(1024)
        time.sleep(0.05)
    assert b"started" in buf
    assert len(_alive_with(marker)) >= 3
    conn.client.get_transport().sock.close()     # the network goes away mid-run
    m.close()
    assert _wait_gone(marker) == []


# ------------------------------------------------------------------ servers

def test_servers_rows_for_up_down_and_silent_hosts(sshd, tmp_path, silent_port):
    cfg_file = tmp_path / "ssh_config"
    common = [f"  IdentityFile {sshd.client_key}", "  IdentitiesOnly yes", "  User root",
              f"  UserKnownHostsFile {sshd.known_hosts}"]
    cfg_file.write_text("\n".join(
        ["Host up1", "  HostName 127.0.0.1", f"  Port {sshd.port}", *common,
         "Host down1", "  HostName 127.0.0.1", f"  Port {unused_port()}", *common,
         "Host silent1", "  HostName 127.0.0.1", f"  Port {silent_port}", *common, ""]))
    cfg = load_config(str(_config(tmp_path, sshd, hosts_ssh_config=str(cfg_file), python=sys.executable)))
    cfg.hosts = [SimpleNamespace(name=n, slots=1) for n in ("up1", "down1", "silent1")]
    log = tmp_path / "results.jsonl"
    now = time.time()
    # a documented result record (ctl servers reads the log through record_parser), then garbage
    record = {"schema": 1, "type": "result", "time": "2026-11-22T15:58:48.134Z", "ts": round(now - 5, 3),
              "run_id": "r1", "hosts": ["up1"], "nodes": 1, "ranks": 2, "engine": "builtin", "mpi": "test",
              "transport": "shm", "op": "allreduce", "datatype": "float", "size": "1MB", "size_bytes": 1 << 20,
              "latency_avg_us": 100.0, "latency_min_us": 99.0, "latency_max_us": 101.0, "iterations": 10,
              "warmup": 1, "algbw_bytes_per_s": 1.0e10, "busbw_bytes_per_s": 1.0e10, "validation": "off",
              "straggler_rank": 1, "verdict": "Good", "status": "ok"}
    log.write_text(json.dumps(record) + "\nnot json\n")
    cfg.stress.results_log = str(log)
    t0 = time.monotonic()
    report = servers.check_all(cfg, timeout=4.0)     # the silent host waits it out
    took = time.monotonic() - t0
    rows = {r["host"]: r for r in report["hosts"]}
    assert rows["up1"]["reachable"] and rows["up1"]["hostname"] == socket.gethostname()
    assert isinstance(rows["up1"]["processes"], list) and rows["up1"]["rdma"] == []
    assert rows["up1"]["last_result"]["op"] == "allreduce" and 4 < rows["up1"]["last_result"]["age_s"] < 60
    assert rows["down1"]["error_kind"] == "unreachable" and not rows["down1"]["reachable"]
    assert rows["silent1"]["error_kind"] == "timeout"
    assert took < 4.0 + 6           # in parallel, each bounded: not 3 x timeout
    table = servers.format_table(report)
    assert "up1" in table and "unreachable" in table and "timeout" in table
    assert servers.exit_status(report) == 1


def test_rdma_ports_from_sysfs_fixture(tmp_path):
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "rate").write_text("25 Gb/sec (1X EDR)\n")
    (port / "link_layer").write_text("Ethernet\n")
    (tmp_path / "class/infiniband/mlx5_0/device/net/ens1f0").mkdir(parents=True)
    assert servers.rdma_ports(str(tmp_path)) == [
        {"device": "mlx5_0", "port": "1", "state": "ACTIVE", "phys_state": "LinkUp",
         "rate": "25 Gb/sec (1X EDR)", "link_layer": "Ethernet", "netdevs": ["ens1f0"]}]


# ------------------------------------------------------------------ deploy

def _venv_with_dependencies(venv):
    """A venv whose site-packages holds collbench's dependencies (as a node's admin would have
    installed them), linked from this test run's venv so no package index is needed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    import sysconfig
    src = sysconfig.get_paths()["purelib"]
    dst = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    for name in os.listdir(src):
        if name.startswith(("__editable__", "collbench", "_pytest", "pytest", "__pycache__")) or name.endswith(".pth"):
            continue
        os.symlink(os.path.join(src, name), os.path.join(dst, name))


def test_deploy_installs_then_is_up_to_date(sshd, tmp_path):
    from collbench.ctl import deploy
    node = tmp_path / "opt" / "collbench"
    _venv_with_dependencies(node / ".venv")
    lines = []
    with ssh.connect(sshd.target()) as conn:
        assert deploy.install(conn, str(node), sys.executable, log=lines.append) == "installed"
        assert deploy.tree_hash(str(node)) == deploy.tree_hash(str(REPO))
        assert deploy.install(conn, str(node), sys.executable, log=lines.append) == "up to date"
    assert not [p for p in os.listdir(node) if p.startswith(".deploy")]     # no leftovers of the swap
    # the node's collbench is the uploaded tree, and its console script works
    res = subprocess.run([str(node / ".venv" / "bin" / "collbench"), "--version"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("collbench "), res.stderr
    where = subprocess.run([str(node / ".venv" / "bin" / "python"), "-c", "import collbench; print(collbench.__file__)"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path).stdout.strip()
    assert where == str(node / "collbench" / "__init__.py")
    assert any("installed" in x for x in lines) and any("up to date" in x for x in lines)


# ------------------------------------------------------------------ the seed's scripts

def test_seed_scripts_pass_options_on_and_keep_exit_codes(sshd, tmp_path):
    from collbench.ctl.prototype_scripts import split_args
    assert split_args(["--config", "c.yaml", "--ops", "allreduce", "--accept-new-host-key", "-n", "5"], "once") == \
        (["--config", "c.yaml", "--accept-new-host-key"], ["--ops", "allreduce", "-n", "5"])
    assert split_args(["--json", "--timeout", "3"], "servers") == (["--json", "--timeout", "3"], [])
    assert split_args(["--json"], "status") == ([], ["--json"])
    cfg = _config(tmp_path, sshd, port=unused_port())
    for script, verb in (("mpi_bandwidth_stress.py", "status"), ("mpi_test_controller.py", "once")):
        res = subprocess.run([sys.executable, str(REPO / script), verb, "--config", str(cfg)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 10 and "connection refused" in res.stderr, res.stderr
    res = subprocess.run([sys.executable, str(REPO / "mpi_test_controller.py"), "servers"], capture_output=True, text=True)
    assert res.returncode == 2 and "once|start|stop|status" in res.stderr


def test_key_from_the_ssh_agent(sshd, tmp_path):
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], env=env, check=True, capture_output=True)
        old = os.environ.get("SSH_AUTH_SOCK")
        os.environ["SSH_AUTH_SOCK"] = str(sock)
        try:
            t = ssh.resolve_target("127.0.0.1", user="root", port=sshd.port, known_hosts=str(sshd.known_hosts),
                                   ssh_config=str(sshd.dir / "none"), connect_timeout=TIMEOUT)
            assert t.identity_files == []
            with ssh.connect(t) as conn:          # no key file named anywhere: the agent's key
                assert conn.run(["echo", "agent"]).stdout == "agent\n"
        finally:
            if old is None:
                os.environ.pop("SSH_AUTH_SOCK")
            else:
                os.environ["SSH_AUTH_SOCK"] = old
    finally:
        agent.terminate()
        agent.wait(10)


def test_deploy_exporter_script_writes_units_idempotently(tmp_path):
    root = tmp_path / "root"
    script = str(REPO / "scripts" / "deploy_exporter.sh")
    cfg = tmp_path / "c.yaml"
    (tmp_path / "hosts.txt").write_text("node1 slots=1\n")
    cfg.write_text("hosts: hosts.txt\n")
    run = lambda *extra: subprocess.run(["bash", script, "--config", str(cfg), "--root", str(root), *extra],  # noqa: E731
                                        capture_output=True, text=True, timeout=60)
    res = run("--with-stress", "--prefix", "/srv/cb", "--user", "bench")
    assert res.returncode == 0, res.stderr
    unit = (root / "etc/systemd/system/collbench-exporter.service").read_text()
    assert "ExecStart=/srv/cb/.venv/bin/collbench exporter --config /etc/collbench/collbench.yaml" in unit
    assert "User=bench" in unit and "Group=" not in unit and "/opt/collbench" not in unit
    assert "stress run" in (root / "etc/systemd/system/collbench-stress.service").read_text()
    assert (root / "etc/collbench/collbench.yaml").read_text() == cfg.read_text()
    assert (root / "etc/collbench/hosts.txt").read_text() == "node1 slots=1\n"
    again = run("--with-stress", "--prefix", "/srv/cb", "--user", "bench")
    assert again.returncode == 0 and "wrote" not in again.stdout          # nothing changed, nothing written
    for bad in (["--prefix", "/x y"], ["--prefix", "/x;touch z"], ["--user", "a b"], ["--prefix", "rel"]):
        res = run(*bad)
        assert res.returncode == 2 and "deploy_exporter.sh:" in res.stderr, bad
    assert not (tmp_path / "z").exists()


def test_without_master_the_verbs_act_locally(tmp_path):
    cfg = tmp_path / "local.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\n")
    res = _ctl(["status", "--config", str(cfg), "--", "--json"])
    assert res.returncode == 3, res.stderr                      # stress status: stopped
    assert json.loads(res.stdout)["state_dir"] == str(tmp_path / "state")
    res = _ctl(["servers", "--json", "--config", str(cfg)])
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)["hosts"]
    assert row["host"] == "localhost" and row["reachable"] and row["hostname"] == socket.gethostname()
    # --local wins over master.host: nothing tries to connect to the (unreachable) master
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nmaster: {{host: 198.18.0.254, connect_timeout: 1}}\n")
    res = _ctl(["status", "--local", "--config", str(cfg)])
    assert res.returncode == 3 and "stopped" in res.stdout, res.stderr


def test_remote_state_dir_reaches_the_stress_verbs(sshd, tmp_path):
    cfg = _config(tmp_path, sshd, remote_state_dir=str(tmp_path / "remote-state"),
                  remote_config=str(tmp_path / "remote.yaml"))
    res = _ctl(["status", "--upload-config", "--config", str(cfg), "--", "--json"])
    assert res.returncode == 3, res.stderr                      # over SSH: stress status, stopped
    assert json.loads(res.stdout)["state_dir"] == str(tmp_path / "remote-state")
    # an explicit --state-dir after -- wins
    res = _ctl(["status", "--upload-config", "--config", str(cfg), "--", "--json", "--state-dir", str(tmp_path / "other")])
    assert json.loads(res.stdout)["state_dir"] == str(tmp_path / "other")
