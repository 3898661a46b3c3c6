"""`collbench ctl deploy`: install or update collbench on the master (and hosts), upload the
config over SFTP, build the engine there.

Layout on a node: `<remote_dir>` holds the source tree (pyproject.toml, collbench/, scripts/),
`<remote_dir>/.venv` the virtualenv collbench is pip-installed into. A node whose tree already
hashes the same as ours is left alone: that is also how a host sharing the master's filesystem
(NFS home, a testbed) is recognised, so nothing is copied twice or over itself. Uploads are a
tarball over SFTP, unpacked by the node's own Python beside the old tree and swapped in by rename.
The hosts are reached from the master (its ssh setup, the one mpirun uses), not from the laptop.

`--counters-exporter` also installs and (re)starts the per-host counters exporter as a systemd
unit (counters_unit.py) on every host of the hostfile, the master included when it is one of
them, and waits for each to answer /health; `collbench scrape-config` writes Prometheus' target
list for them.
"""

import hashlib
import inspect
import io
import os
import posixpath
import subprocess
import sys
import tarfile
import time

from collbench.ctl import counters_unit, ssh
from collbench.errors import UserError
from collbench.hosts import is_this_machine

TREE_PARTS = ("pyproject.toml", "README.md", "collbench", "scripts")
SKIP_DIRS = ("__pycache__", ".venv", ".git", "collbench.egg-info", ".pytest_cache")
PIP_TIMEOUT = 900.0
# (distribution, module): what collbench imports at run time (pyproject.toml's dependencies)
DEPENDENCIES = (("PyYAML", "yaml"), ("prometheus_client", "prometheus_client"), ("paramiko", "paramiko"),
                ("google-re2", "re2"))


def dependency_requirements():
    """Requirement strings of collbench's dependencies, from the installed metadata when there is one."""
    try:
        from importlib.metadata import requires
        reqs = [r.split(";")[0].strip() for r in requires("collbench") or () if "extra ==" not in r]
        if reqs:
            return reqs
    except Exception:   # not installed as a distribution (run from a bare checkout)
        pass
    return [d for d, _ in DEPENDENCIES]


def tree_files(root):
    """Relative paths of the files that make up an install, sorted."""
    out = []
    for part in TREE_PARTS:
        top = os.path.join(root, part)
        if os.path.isfile(top):
            out.append(part)
        for d, dirs, files in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
            for f in sorted(files):
                if not f.endswith((".pyc", ".pyo", ".so")):
                    out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def tree_hash(root):
    """sha256 over the install's file names and contents; '' when root has no collbench tree."""
    if not os.path.isfile(os.path.join(root, "pyproject.toml")):
        return ""
    h = hashlib.sha256()
    for rel in tree_files(root):
        h.update(rel.encode() + b"\0")
        try:
            with open(os.path.join(root, rel), "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        except OSError:
            h.update(b"?")
    return h.hexdigest()


def local_source_root():
    import collbench
    root = os.path.dirname(os.path.dirname(os.path.abspath(collbench.__file__)))
    if not os.path.isfile(os.path.join(root, "pyproject.toml")):
        raise UserError(f"deploy needs a collbench source checkout; {root} has no pyproject.toml")
    return root


def _tarball(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in tree_files(root):
            tar.add(os.path.join(root, rel), arcname=rel, recursive=False)
    return buf.getvalue()


def _unpack(tarball, remote_dir, parts):
    """Run on the node: unpack beside the old tree, swap each top-level part in by rename."""
    import shutil
    import tarfile as _tarfile
    new = os.path.join(remote_dir, ".deploy-new")
    old = os.path.join(remote_dir, ".deploy-old")
    for d in (new, old):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(new)
    with _tarfile.open(tarball) as tar:
        for m in tar.getmembers():
            if m.name.startswith(("/", "..")) or "/../" in m.name or not (m.isfile() or m.isdir()):
                raise SystemExit(f"refusing tarball member {m.name!r}")
        tar.extractall(new)
    os.makedirs(old)
    for part in parts:
        src, dst = os.path.join(new, part), os.path.join(remote_dir, part)
        if os.path.lexists(dst):
            os.rename(dst, os.path.join(old, part))
        if os.path.lexists(src):
            os.rename(src, dst)
    shutil.rmtree(new, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    os.remove(tarball)


def _remote_script(func, call):
    return "\n".join(["import hashlib, os, sys", f"TREE_PARTS = {TREE_PARTS!r}",
                      f"SKIP_DIRS = {SKIP_DIRS!r}", inspect.getsource(tree_files),
                      inspect.getsource(tree_hash), inspect.getsource(func), call])


# prints the venv's site-packages and whether a pip-installed collbench (not our tree) is in it
LINK_PROBE = """import sysconfig
print(sysconfig.get_paths()["purelib"])
try:
    from importlib.metadata import distribution
    d = distribution("collbench")
    print("pip" if d.files and any(str(f).startswith("collbench/") for f in d.files) else "none")
except Exception:
    print("none")
"""


def _put_text(conn, path, text, mode):
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"collbench-deploy-{os.getpid()}-{time.time_ns()}")
    with open(tmp, "w") as f:
        f.write(text)
    try:
        conn.put_file(tmp, path, mode=mode)
    finally:
        os.remove(tmp)


def _check(res, what):
    if res.returncode != 0:
        tail = "\n".join((res.stderr + res.stdout).strip().splitlines()[-15:])
        raise UserError(f"{what} failed (exit {res.returncode}): {tail}")
    return res


def install(conn, remote_dir, python, log=print, force=False):
    """Bring collbench at remote_dir on conn's node up to date with this checkout.

    Returns 'up to date' or 'installed'.
    """
    root = local_source_root()
    want = tree_hash(root)
    venv_py = posixpath.join(remote_dir, ".venv", "bin", "python")
    host = conn.target.hostname
    res = conn.run([python, "-", remote_dir], timeout=120,
                   input=_remote_script(tree_hash, "print(tree_hash(sys.argv[1]) if os.path.isdir(sys.argv[1]) else '')"))
    _check(res, f"hashing {remote_dir} on {host} with {python}")
    have = res.stdout.strip()
    importable = conn.run([venv_py, "-c", "import collbench"], timeout=60).returncode == 0
    if have == want and importable and not force:
        log(f"{host}: collbench at {remote_dir} is up to date ({want[:12]})")
        return "up to date"
    if have != want:
        log(f"{host}: uploading collbench {want[:12]} to {remote_dir}")
        conn.makedirs(remote_dir)
        tarball = posixpath.join(remote_dir, f".deploy-{want[:12]}.tar.gz")
        local_tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"collbench-deploy-{os.getpid()}-{time.time_ns()}.tar.gz")
        with open(local_tmp, "wb") as f:
            f.write(_tarball(root))
        try:
            conn.put_file(local_tmp, tarball, mode=0o600)
        finally:
            os.remove(local_tmp)
        _check(conn.run([python, "-", tarball, remote_dir], timeout=300,
                        input=_remote_script(_unpack, f"_unpack(sys.argv[1], sys.argv[2], {TREE_PARTS!r})")),
               f"unpacking on {host}")
    if conn.run(["test", "-x", venv_py], timeout=30).returncode != 0:
        log(f"{host}: creating {remote_dir}/.venv with {python}")
        _check(conn.run([python, "-m", "venv", posixpath.join(remote_dir, ".venv")], timeout=300),
               f"creating the venv on {host} (install python3-venv there)")
    modules = [m for _, m in DEPENDENCIES]
    if conn.run([venv_py, "-c", f"import {', '.join(modules)}"], timeout=60).returncode != 0:
        reqs = dependency_requirements()
        log(f"{host}: pip install {' '.join(reqs)} (from the node's package index)")
        _check(conn.run([venv_py, "-m", "pip", "install", "--disable-pip-version-check", "-q", *reqs],
                        timeout=PIP_TIMEOUT),
               f"installing collbench's dependencies on {host} (the node needs a package index: "
               "pip.conf / PIP_INDEX_URL, or these packages installed in its venv)")
    # collbench itself is pure Python: the venv imports it from the tree through a .pth file
    # (no build step, nothing from the network; an update is the tree swap above)
    res = _check(conn.run([venv_py, "-c", LINK_PROBE], timeout=60), f"inspecting the venv on {host}")
    site, installed = res.stdout.split("\n")[:2]
    if installed.strip() == "pip":
        log(f"{host}: removing the pip-installed collbench from the venv (the tree replaces it)")
        _check(conn.run([venv_py, "-m", "pip", "uninstall", "-y", "-q", "collbench"], timeout=300),
               f"pip uninstall collbench on {host}")
    _put_text(conn, posixpath.join(site.strip(), "collbench-deploy.pth"), remote_dir + "\n", 0o644)
    _put_text(conn, posixpath.join(remote_dir, ".venv", "bin", "collbench"),
              f"#!{venv_py}\nimport sys\nfrom collbench.cli import main\nsys.exit(main())\n", 0o755)
    res = _check(conn.run([venv_py, "-c", "import collbench; print(collbench.__file__)"], timeout=60),
                 f"importing collbench on {host} after the install")
    log(f"{host}: installed ({res.stdout.strip()})")
    return "installed"


def build_engine(conn, remote_dir, config_path, log=print):
    venv_py = posixpath.join(remote_dir, ".venv", "bin", "python")
    log(f"{conn.target.hostname}: building the engine")
    res = conn.run([venv_py, "-m", "collbench", "engine", "build",
                    *(["--config", config_path] if config_path else [])], timeout=PIP_TIMEOUT)
    _check(res, f"`collbench engine build` on {conn.target.hostname}")
    out = res.stdout.strip().splitlines()
    if out:
        log(f"{conn.target.hostname}: {out[-1]}")


class LocalHost:
    """This machine, with the two operations install_unit needs from an SSH connection."""

    def run(self, argv, timeout=None, input=None):
        try:
            res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            return ssh.Completed(list(argv), 127, "", str(e))
        return ssh.Completed(list(argv), res.returncode, res.stdout, res.stderr)

    def put_text(self, path, text, mode):
        from collbench.atomic_file import write_output
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_output(path, text, flag="--unit-dir")
        os.chmod(path, mode)


class RemoteHost:
    def __init__(self, conn):
        self.conn = conn

    def run(self, argv, timeout=None, input=None):
        return self.conn.run(argv, timeout=timeout, input=input)

    def put_text(self, path, text, mode):
        _put_text(self.conn, path, text, mode)


def add_arguments(p):
    p.add_argument("--force", action="store_true", help="reinstall even when the tree is up to date")
    p.add_argument("--no-build", action="store_true", help="do not build the engine")
    p.add_argument("--no-hosts", action="store_true", help="leave the hosts of the hostfile alone")
    p.add_argument("--counters-exporter", action="store_true",
                   help="also install and start the counters exporter (`collbench exporter --counters-only`) "
                        f"as the systemd unit {counters_unit.UNIT} on every host of the hostfile")
    p.add_argument("--counters-port", type=int, default=counters_unit.PORT, metavar="PORT",
                   help=f"the counters exporters' port (default {counters_unit.PORT})")
    p.add_argument("--unit-dir", default=counters_unit.UNIT_DIR, metavar="DIR",
                   help=f"where the unit goes on each host (default {counters_unit.UNIT_DIR})")
    p.add_argument("--systemctl", default="systemctl", metavar="CMD",
                   help="the systemctl command on the hosts (default systemctl)")


def _counters_flags(args):
    """The --counters-* flags of the master's own `ctl deploy --local`."""
    if not args.counters_exporter:
        return []
    return ["--counters-exporter", "--counters-port", str(args.counters_port), "--unit-dir", args.unit_dir,
            "--systemctl", args.systemctl]


def _check_counters_flags(args):
    if not getattr(args, "counters_exporter", False):
        return
    from collbench.config import PORT, check_flag
    check_flag("--counters-port", PORT, args.counters_port)
    for flag, value in (("--unit-dir", args.unit_dir), ("--systemctl", args.systemctl)):
        if not value or not value.strip() or "\n" in value:
            raise UserError(f"{flag}: got {value!r}, expected a path")
    if not posixpath.isabs(args.unit_dir):
        raise UserError(f"--unit-dir: got {args.unit_dir!r}, expected an absolute path")


def run_cli(args):
    from collbench.ctl import remote
    cfg = remote.load(args)
    _check_counters_flags(args)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    if not remote.is_remote(cfg, args):
        return deploy_hosts(cfg, args, log)
    with remote.open_master(cfg, args) as m:
        conn = m.connect()
        install(conn, cfg.master.remote_dir, cfg.master.python, log, args.force)
        upload = True if args.upload_config is None else args.upload_config
        rc_path = m.upload_config() if upload else m.config_path()
        log(f"{conn.target.hostname}: config at {rc_path}")
        if not args.no_build:
            build_engine(conn, cfg.master.remote_dir, rc_path, log)
        if args.no_hosts:
            return 0
        argv = m.collbench_argv("ctl", "deploy", "--local", "--config", rc_path)
        argv += ["--no-build"] if args.no_build else []
        argv += ["--force"] if args.force else []
        argv += _counters_flags(args)
        return m.stream(argv, timeout=PIP_TIMEOUT * 2)


def deploy_hosts(cfg, args, log):
    """On the master: bring every other host of the hostfile to this tree, in parallel.

    Hosts that already have this exact tree (a shared filesystem) are not copied to; the
    engine is built on every host anyway (a cache hit when its home directory is shared too).
    """
    import concurrent.futures
    root = local_source_root()
    names = list(dict.fromkeys(cfg.host_names))
    hosts = [h for h in names if not is_this_machine(h)]
    counters = bool(getattr(args, "counters_exporter", False))
    venv_py = posixpath.join(root, ".venv", "bin", "python")

    def counters_here(host):
        python = venv_py if os.access(venv_py, os.X_OK) else sys.executable
        text = counters_unit.render_unit(cfg, python, args.counters_port)
        counters_unit.install_unit(LocalHost(), host, text, args.unit_dir, args.systemctl, python,
                                   args.counters_port, log)

    def one(host):
        try:
            target = ssh.resolve_target(host, ssh_config=cfg.master.hosts_ssh_config,
                                        connect_timeout=cfg.master.connect_timeout, what=f"host {host}")
            with ssh.connect(target, args.accept_new_host_key) as conn:
                install(conn, root, cfg.master.python, log, args.force)
                if not args.no_build and not cfg.engine_path:
                    build_engine(conn, root, None, log)
                if counters:
                    text = counters_unit.render_unit(cfg, venv_py, args.counters_port)
                    counters_unit.install_unit(RemoteHost(conn), host, text, args.unit_dir, args.systemctl,
                                               venv_py, args.counters_port, log)
            return True
        except UserError as e:
            log(f"{host}: deploy failed: {e}")
            return False

    def here(host):
        try:
            counters_here(host)
            return True
        except UserError as e:
            log(f"{host}: deploy failed: {e}")
            return False
    _check_counters_flags(args)
    ok = []
    if counters:   # this machine once, however many of its names the hostfile lists
        local = [h for h in names if h not in hosts]
        if local:
            ok.append(here(local[0]))
    if hosts:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            ok += list(pool.map(one, hosts))
    return 0 if all(ok) else 1
