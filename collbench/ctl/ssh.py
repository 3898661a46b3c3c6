"""SSH to the master (and from it to the hosts) with paramiko, the way OpenSSH would do it.

Who to connect to comes from the config's `master` section and `~/.ssh/config` (Host aliases,
HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump, UserKnownHostsFile); config
values win over ssh_config, as command-line options do for ssh(1). Keys come from the
identity files, the SSH agent and the default `~/.ssh/id_*`. Host keys are checked against
known_hosts: an unknown key is refused with its SHA256 fingerprint unless the caller accepts
it explicitly (`--accept-new-host-key`, then it is appended to known_hosts), and a changed key
is always refused. No password is ever read from a file: `COLLBENCH_SSH_PASSWORD` in the
environment, or an interactive prompt when the caller asks for one.

Every way a connection can fail has its own exception class and exit code (documented in
docs/TROUBLESHOOTING.md), so scripts can tell an unreachable host from a bad key:

| code | class | meaning |
|---|---|---|
| 10 | HostUnreachableError | refused, no route, name does not resolve |
| 11 | SSHTimeoutError | no TCP connection, SSH banner or answer within the timeout |
| 12 | AuthenticationFailedError | the server refused every key (and password) offered |
| 13 | UnknownHostKeyError | the host's key is not in known_hosts (fingerprint shown) |
| 14 | HostKeyMismatchError | known_hosts holds a different key for the host |
| 15 | RemoteCollbenchMissingError | collbench is not installed where master.remote_dir says |
| 16 | SSHError | any other SSH protocol failure |

Remote commands are argv lists; `remote_command()` quotes every word with shlex.quote, so no
value (host name, path, config value) is ever parsed by the remote shell.
"""

import base64
import errno
import getpass
import hashlib
import logging
import os
import re
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field

import paramiko

from collbench.errors import ConfigError, UserError

# paramiko logs every failed handshake at ERROR; our exceptions already say it, once and clearly
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

EXIT_UNREACHABLE = 10
EXIT_TIMEOUT = 11
EXIT_AUTH = 12
EXIT_HOSTKEY_UNKNOWN = 13
EXIT_HOSTKEY_CHANGED = 14
EXIT_REMOTE_MISSING = 15
EXIT_SSH = 16

PASSWORD_ENV = "COLLBENCH_SSH_PASSWORD"
PASSPHRASE_ENV = "COLLBENCH_SSH_KEY_PASSPHRASE"
MAX_JUMPS = 8

# What a host name, user or port may hold before it goes anywhere near ssh_config token expansion
# (%h in ProxyCommand) or a socket: letters, digits and . - _ (plus : [ ] % for IPv6 literals).
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:%\[\]-]+$")
_USER_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")


class SSHError(UserError):
    """An SSH failure that is not one of the specific kinds below."""

    exit_code = EXIT_SSH


class HostUnreachableError(SSHError):
    exit_code = EXIT_UNREACHABLE


class SSHTimeoutError(SSHError):
    exit_code = EXIT_TIMEOUT


class AuthenticationFailedError(SSHError):
    exit_code = EXIT_AUTH


class UnknownHostKeyError(SSHError):
    exit_code = EXIT_HOSTKEY_UNKNOWN

    def __init__(self, host_entry, key, known_hosts):
        self.host_entry = host_entry
        self.key = key
        self.fingerprint = fingerprint(key)
        self.known_hosts = known_hosts
        super().__init__(
            f"host key of {host_entry} is not known: {key.get_name()} {self.fingerprint}. "
            f"Check the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub) and, "
            f"if it matches, run again with --accept-new-host-key to add it to {known_hosts}")


class HostKeyMismatchError(SSHError):
    exit_code = EXIT_HOSTKEY_CHANGED

    def __init__(self, host_entry, key, expected, known_hosts):
        self.host_entry = host_entry
        self.fingerprint = fingerprint(key)
        super().__init__(
            f"HOST KEY CHANGED for {host_entry}: it offers {key.get_name()} {self.fingerprint} but "
            f"{known_hosts} holds {expected.get_name()} {fingerprint(expected)}. This may be an attack "
            f"(or the host was reinstalled); refused. If the change is expected, remove the old key "
            f"with: ssh-keygen -R {shlex.quote(host_entry)} -f {shlex.quote(known_hosts)}")


class RemoteCollbenchMissingError(SSHError):
    exit_code = EXIT_REMOTE_MISSING


def fingerprint(key):
    """OpenSSH's SHA256 fingerprint of a public key: 'SHA256:<base64 without padding>'."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def remote_command(argv):
    """A remote shell command line that runs exactly argv: every word shlex-quoted."""
    if not argv:
        raise ValueError("empty remote command")
    return " ".join(shlex.quote(str(a)) for a in argv)


# ------------------------------------------------------------------ who to connect to

@dataclass
class Target:
    alias: str                   # the name the user gave (ssh_config Host pattern)
    hostname: str                # what we connect to
    port: int
    user: str
    identity_files: list = field(default_factory=list)
    identities_only: bool = False
    proxy_jump: str = None       # "[user@]host[:port][,...]" or None
    proxy_command: str = None
    known_hosts: list = field(default_factory=list)   # first one is where new keys go
    connect_timeout: float = 10.0
    ssh_config: str = None       # the ssh_config file used, for resolving jump hosts

    @property
    def host_entry(self):
        """The known_hosts name of this host: 'host' on port 22, '[host]:port' otherwise."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self):
        via = f" via {self.proxy_jump}" if self.proxy_jump else ""
        return f"{self.user}@{self.hostname}:{self.port}{via}"


def _check_host(value, what):
    if not value or not _HOST_RE.match(value) or value.startswith("-"):
        raise ConfigError(None, what, f"got {value!r}, expected a host name or address "
                                      "(letters, digits, . - _ or an IPv6 literal)")
    return value


def _check_user(value, what):
    if not _USER_RE.match(value or ""):
        raise ConfigError(None, what, f"got {value!r}, expected a user name (letters, digits, . - _)")
    return value


def _default_ssh_config():
    path = os.path.expanduser("~/.ssh/config")
    return path if os.path.isfile(path) else None


def _load_ssh_config(path):
    if path is None:
        return paramiko.SSHConfig()
    if not os.path.isfile(path):
        raise ConfigError(None, "master.ssh_config", f"ssh config {path} does not exist")
    try:
        return paramiko.SSHConfig.from_path(path)
    except Exception as e:  # paramiko raises plain exceptions for bad syntax
        raise ConfigError(path, None, f"cannot parse ssh config: {e}") from None


def resolve_target(host, user=None, port=None, identity_file=None, ssh_config=None,
                   known_hosts=None, connect_timeout=10.0, what="master.host"):
    """A Target for `host` (an address or an ssh_config alias); explicit arguments win.

    `what` names where the host came from, for the error when it is not a host name.
    """
    host = _check_host(str(host).strip(), what)
    ssh_config = os.path.expanduser(ssh_config) if ssh_config else _default_ssh_config()
    sc = _load_ssh_config(ssh_config).lookup(host)
    hostname = _check_host(sc.get("hostname", host), f"HostName of {host} in {ssh_config}")
    user = user or sc.get("user") or getpass.getuser()
    _check_user(user, "master.user")
    try:
        port = int(port or sc.get("port", 22))
    except ValueError:
        raise ConfigError(ssh_config, f"Host {host}", f"Port {sc.get('port')!r} is not a number") from None
    if not 0 < port < 65536:
        raise ConfigError(None, "master.port", f"got {port}, expected 1-65535")
    identities = [os.path.expanduser(identity_file)] if identity_file else []
    if identities and not os.path.isfile(identities[0]):
        raise ConfigError(None, "master.identity_file", f"key file {identities[0]} does not exist")
    identities += [os.path.expanduser(p) for p in sc.get("identityfile", [])]
    if known_hosts:
        kh = [os.path.expanduser(known_hosts)]
    else:
        kh = [os.path.expanduser(p) for p in sc.get("userknownhostsfile", "").split()] or \
             [os.path.expanduser("~/.ssh/known_hosts")]
    jump = sc.get("proxyjump")
    if jump and jump.lower() == "none":
        jump = None
    proxy_command = sc.get("proxycommand")
    if proxy_command and proxy_command.lower() == "none":
        proxy_command = None
    timeout = connect_timeout
    if "connecttimeout" in sc and connect_timeout is None:
        timeout = float(sc["connecttimeout"])
    return Target(alias=host, hostname=hostname, port=port, user=user, identity_files=identities,
                  identities_only=sc.get("identitiesonly", "no").lower() == "yes",
                  proxy_jump=jump, proxy_command=proxy_command, known_hosts=kh,
                  connect_timeout=float(timeout or 10.0), ssh_config=ssh_config)


def target_from_master(master):
    """The Target for the config's `master` section (master.host must be set)."""
    return resolve_target(master.host, user=master.user, port=master.port,
                          identity_file=master.identity_file, ssh_config=master.ssh_config,
                          known_hosts=master.known_hosts, connect_timeout=master.connect_timeout)


def _parse_jump(spec):
    """'user@host:port' -> (user, host, port); IPv6 as [addr]:port."""
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = rest[1:]
    elif spec.count(":") == 1:
        host, port = spec.split(":")
    else:
        host = spec
    return user, host, int(port) if port else None


# ------------------------------------------------------------------ host keys

class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse with its fingerprint, or (accept_new) append it to known_hosts."""

    def __init__(self, target, accept_new):
        self.target = target
        self.accept_new = accept_new
        self.accepted = None

    def missing_host_key(self, client, hostname, key):
        path = self.target.known_hosts[0]
        if not self.accept_new:
            raise UnknownHostKeyError(self.target.host_entry, key, path)
        _append_known_host(path, self.target.host_entry, key)
        self.accepted = fingerprint(key)


def _append_known_host(path, host_entry, key):
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    line = f"{host_entry} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        # a file that does not end in a newline would glue our entry to its last line
        if f.tell() > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write("\n")
        f.write(line)


def _load_known_hosts(client, target):
    keys = client.get_host_keys()
    for path in list(target.known_hosts) + ["/etc/ssh/ssh_known_hosts"]:
        if os.path.isfile(path):
            try:
                keys.load(path)
            except (OSError, paramiko.SSHException) as e:
                raise SSHError(f"cannot read known_hosts file {path}: {e}") from None


# ------------------------------------------------------------------ connecting

def _tcp_connect(target):
    """A connected socket to target, with failures classified (unreachable vs timeout)."""
    what = f"{target.hostname}:{target.port}"
    try:
        return socket.create_connection((target.hostname, target.port), timeout=target.connect_timeout)
    except socket.timeout:
        raise SSHTimeoutError(f"cannot connect to {what}: no answer within {target.connect_timeout:g}s "
                              "(host down, or a firewall drops the packets)") from None
    except socket.gaierror as e:
        raise HostUnreachableError(f"cannot resolve host name {target.hostname!r}: {e.strerror}") from None
    except ConnectionRefusedError:
        raise HostUnreachableError(f"cannot connect to {what}: connection refused "
                                   "(no sshd listening on that port)") from None
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ECONNRESET,
                       errno.EADDRNOTAVAIL):
            raise HostUnreachableError(f"cannot connect to {what}: {e.strerror}") from None
        raise HostUnreachableError(f"cannot connect to {what}: {e}") from None


def _classify_ssh_exception(e, target, started):
    what = target.describe()
    msg = str(e) or type(e).__name__
    elapsed = time.monotonic() - started
    if isinstance(e, paramiko.BadHostKeyException):
        return HostKeyMismatchError(target.host_entry, e.key, e.expected_key, target.known_hosts[0])
    if isinstance(e, paramiko.AuthenticationException):
        offered = ", ".join(target.identity_files) or "the agent's and the default keys"
        return AuthenticationFailedError(
            f"authentication failed for {what}: the server refused every key offered ({offered}). "
            f"Add your public key to ~{target.user}/.ssh/authorized_keys there, or set "
            f"master.identity_file / IdentityFile to the right key")
    if isinstance(e, (socket.timeout, TimeoutError)) or "banner" in msg.lower() or \
            (elapsed >= target.connect_timeout * 0.95 and ("timeout" in msg.lower() or "session" in msg.lower())):
        return SSHTimeoutError(f"no SSH answer from {what} within {target.connect_timeout:g}s "
                               f"({msg}): is an sshd listening there?")
    if isinstance(e, (EOFError, ConnectionResetError)):
        return HostUnreachableError(f"{what} closed the connection during the SSH handshake ({msg})")
    return SSHError(f"SSH to {what} failed: {msg}")


def _password():
    return os.environ.get(PASSWORD_ENV) or None


def connect(target, accept_new_host_key=False, ask_password=False, _depth=0):
    """An open Connection to target (through its ProxyJump chain), or a specific SSHError."""
    jumps = []
    sock = None
    started = time.monotonic()
    try:
        if target.proxy_jump:
            if _depth >= MAX_JUMPS:
                raise SSHError(f"ProxyJump chain to {target.alias} is longer than {MAX_JUMPS} hops")
            specs = [s.strip() for s in target.proxy_jump.split(",") if s.strip()]
            try:
                juser, jhost, jport = _parse_jump(specs[-1])
            except ValueError:
                raise ConfigError(target.ssh_config, f"Host {target.alias}",
                                  f"ProxyJump {specs[-1]!r}: expected [user@]host[:port]") from None
            jt = resolve_target(jhost, user=juser, port=jport, ssh_config=target.ssh_config,
                                known_hosts=None, connect_timeout=target.connect_timeout,
                                what=f"ProxyJump of {target.alias}")
            if len(specs) > 1:
                jt.proxy_jump = ",".join(specs[:-1])
            jump = connect(jt, accept_new_host_key, ask_password, _depth + 1)
            jumps.append(jump)
            try:
                sock = jump.client.get_transport().open_channel(
                    "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0),
                    timeout=target.connect_timeout)
            except paramiko.ChannelException as e:
                raise HostUnreachableError(f"jump host {jt.describe()} cannot reach "
                                           f"{target.hostname}:{target.port}: {e}") from None
            except (socket.timeout, paramiko.SSHException) as e:
                raise SSHTimeoutError(f"jump host {jt.describe()} did not open a channel to "
                                      f"{target.hostname}:{target.port}: {e}") from None
        elif target.proxy_command:
            sock = paramiko.ProxyCommand(target.proxy_command)
        else:
            sock = _tcp_connect(target)

        client = paramiko.SSHClient()
        _load_known_hosts(client, target)
        policy = _HostKeyPolicy(target, accept_new_host_key)
        client.set_missing_host_key_policy(policy)
        password = _password()
        if password is None and ask_password:
            password = getpass.getpass(f"password for {target.describe()}: ")
        keys = [p for p in target.identity_files if os.path.isfile(p)]
        look_for_keys = not target.identities_only and not keys
        try:
            client.connect(
                target.hostname, port=target.port, username=target.user, sock=sock,
                key_filename=keys or None, passphrase=os.environ.get(PASSPHRASE_ENV),
                password=password, allow_agent=not target.identities_only,
                # start_client's own wait must outlast banner_timeout, or a silent peer
                # surfaces as "No existing session" instead of the banner timeout
                look_for_keys=look_for_keys, timeout=target.connect_timeout + 2,
                banner_timeout=target.connect_timeout, auth_timeout=target.connect_timeout,
                channel_timeout=target.connect_timeout)
        except SSHError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise _classify_ssh_exception(e, target, started) from None
        client.get_transport().set_keepalive(15)
        return Connection(client, target, jumps, accepted_key=policy.accepted)
    except BaseException:
        if sock is not None and not isinstance(sock, paramiko.Channel):
            try:
                sock.close()
            except OSError:
                pass
        for j in jumps:
            j.close()
        raise


@dataclass
class Completed:
    argv: list
    returncode: int
    stdout: str
    stderr: str


class Connection:
    """One SSH connection: run argv lists, stream them, SFTP files. Close it (or use `with`)."""

    def __init__(self, client, target, jumps=(), accepted_key=None):
        self.client = client
        self.target = target
        self._jumps = list(jumps)
        self.accepted_key = accepted_key   # fingerprint added to known_hosts on this connect
        self._sftp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        self.client.close()
        for j in self._jumps:
            j.close()

    def open_channel(self, argv, timeout=None):
        """A session channel running argv (quoted), stdin left open for the caller."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachableError(f"the SSH connection to {self.target.describe()} is closed")
        try:
            chan = transport.open_session(timeout=self.target.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(remote_command(argv))
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise _classify_ssh_exception(e, self.target, time.monotonic()) from None
        return chan

    def run(self, argv, timeout=None, input=None):
        """Run argv to completion (at most `timeout` seconds) and return a Completed."""
        chan = self.open_channel(argv)
        out, err = bytearray(), bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if input is not None:
                chan.sendall(input if isinstance(input, bytes) else input.encode())
            chan.shutdown_write()
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not got:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise SSHTimeoutError(f"remote command on {self.target.describe()} did not finish "
                                          f"within {timeout:g}s: {remote_command(argv)[:200]}")
                if not got:
                    time.sleep(0.01)
            rc = chan.recv_exit_status()
        finally:
            chan.close()
        return Completed(list(argv), rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    @property
    def sftp(self):
        if self._sftp is None:
            try:
                self._sftp = self.client.open_sftp()
            except (paramiko.SSHException, OSError) as e:
                raise SSHError(f"SFTP to {self.target.describe()} is not available: {e} "
                               "(the sshd needs a 'Subsystem sftp' line)") from None
        return self._sftp

    def put_file(self, local_path, remote_path, mode=0o644):
        """Upload atomically: write a temporary file beside remote_path, then rename over it."""
        sftp = self.sftp
        remote_dir = os.path.dirname(remote_path) or "."
        self.makedirs(remote_dir)
        tmp = f"{remote_dir}/.{os.path.basename(remote_path)}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            sftp.put(local_path, tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, remote_path)
        except (OSError, paramiko.SSHException) as e:
            try:
                sftp.remove(tmp)
            except OSError:
                pass
            raise SSHError(f"cannot upload {local_path} to {self.target.hostname}:{remote_path}: {e}") from None

    def makedirs(self, remote_dir):
        """mkdir -p over SFTP (no shell involved)."""
        sftp = self.sftp
        parts = []
        d = remote_dir
        while d not in ("", "/", "."):
            try:
                sftp.stat(d)
                break
            except FileNotFoundError:
                parts.append(d)
                d = os.path.dirname(d)
        for p in reversed(parts):
            try:
                sftp.mkdir(p)
            except OSError as e:
                raise SSHError(f"cannot create {self.target.hostname}:{p}: {e}") from None
