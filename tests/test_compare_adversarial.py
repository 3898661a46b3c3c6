"""`collbench compare` tried as an adversarial operator would (issue 19 items 8 and 10): one table
of cases, each the flags given, the exit code expected, a fragment of the message, and the files
left afterwards. Real mpirun jobs (2 ranks, one small size, one block); the full disk is a 64 KB
tmpfs mounted here (as root) and filled, unmounted afterwards.
"""

import os
import stat
import subprocess
import sys

import pytest
import yaml

from engine_helpers import engine_bin  # noqa: F401

RUN = ["--op", "allgather", "--sizes", "1KB", "--algorithms", "ring", "--blocks", "1", "--iterations", "2",
       "--warmup", "1"]


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 64 KB tmpfs with no space left in it."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"x" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=30)


def _rules(tmp, name, body):
    path = tmp / name
    path.write_text(body, encoding="utf-8")
    return str(path)


def _is_link(path):
    return os.path.islink(path)


def _records(path):
    return os.path.isfile(path) and os.path.getsize(path) > 0 and open(path, encoding="utf-8").read().count('"type"') >= 2


def _chardev(path):
    return stat.S_ISCHR(os.stat(path).st_mode)


# name, args (built from tmp and the full directory), exit, message fragment, table printed,
# files afterwards {path relative to tmp (or an absolute one): True = exists, False = absent, fn = check}
CASES = [
    ("write-rules on a full disk: results, tsv and table kept, the rules file named",
     lambda t, full: RUN + ["--results", str(t / "r.jsonl"), "--tsv", str(t / "r.tsv"),
                            "--write-rules", str(full / "rules.conf")],
     2, "--write-rules {full}/rules.conf: cannot write", True,
     {"r.jsonl": _records, "r.tsv": True, "{full}/rules.conf": False}),
    ("tsv on a full disk: results and table kept, the tsv named",
     lambda t, full: RUN + ["--results", str(t / "r.jsonl"), "--tsv", str(full / "r.tsv")],
     2, "--tsv {full}/r.tsv: cannot write", True,
     {"r.jsonl": _records, "{full}/r.tsv": False}),
    ("check-rules with a 5000-digit size",
     lambda t, full: RUN + ["--results", str(t / "r.jsonl"), "--check-rules",
                            _rules(t, "big.conf", "1\n0\n1\n4\n1\n0 4 0 0\n" + "9" * 5000 + " 4 0 0\n")],
     2, "line 7: 999999999999...(5000 digits) is out of range", False, {"r.jsonl": False}),
    ("check-rules with algorithm 99999",
     lambda t, full: RUN + ["--results", str(t / "r.jsonl"), "--check-rules",
                            _rules(t, "alg.conf", "1\n0\n1\n2\n1\n0 99999 0 0\n")],
     2, "line 6: algorithm 99999 is not one of this MPI's for collective 0", False, {"r.jsonl": False}),
    ("factor above sweep's bound",
     lambda t, full: ["--op", "allgather", "--min-bytes", "1KB", "--max-bytes", "2KB",
                      "--factor", "99999999999999999999", "--results", str(t / "r.jsonl")],
     2, "--factor: got 99999999999999999999, expected a whole number from 2 to 1073741824", False,
     {"r.jsonl": False}),
    ("margin out of range",
     lambda t, full: RUN + ["--margin", "-5"], 2, "--margin: got '-5', expected a percentage", False, {}),
    ("blocks and repeats disagree",
     lambda t, full: RUN + ["--repeats", "3"], 2, "--repeats is the older name of --blocks", False, {}),
    ("write-rules through a symlink: the link stays, its target is the file",
     lambda t, full: RUN + ["--write-rules", str(_link(t))], 0, "tuning file written", True,
     {"link.conf": _is_link, "target.conf": True}),
    ("write-rules to /dev/null as root: written through, still a device",
     lambda t, full: RUN + ["--write-rules", "/dev/null"], 0, "tuning file written to /dev/null", True,
     {"/dev/null": _chardev}),
]


def _link(t):
    link = t / "link.conf"
    if not link.exists():
        (t / "target.conf").write_text("old\n", encoding="utf-8")
        link.symlink_to(t / "target.conf")
    return link


@pytest.mark.parametrize("name,args,code,fragment,table,files", CASES, ids=[c[0] for c in CASES])
def test_compare_adversarial(tmp_path, engine_bin, full_disk, name, args, code, fragment, table, files):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"ranks": 2, "engine_path": engine_bin, "step_timeout": 300}), encoding="utf-8")
    env = dict(os.environ, COLLBENCH_CACHE_DIR=str(tmp_path / "cache"))
    argv = args(tmp_path, full_disk)
    p = subprocess.run([sys.executable, "-m", "collbench", "compare", "-c", str(cfg), *argv],
                       capture_output=True, text=True, timeout=600, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == code, (name, p.returncode, out[-3000:])
    assert fragment.format(full=full_disk) in out, (name, out[-3000:])
    assert "Traceback" not in out
    assert ("Choice per size" in p.stdout) == table, (name, p.stdout[-2000:])
    for rel, want in files.items():
        path = rel.format(full=full_disk)
        path = path if os.path.isabs(path) else str(tmp_path / path)
        if want is True:
            assert os.path.exists(path), (name, path)
        elif want is False:
            assert not os.path.exists(path), (name, path)
        else:
            assert want(path), (name, path)
    # nothing half-written: no temporary file left beside any output
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert sorted(os.listdir(full_disk)) == ["filler"]
