"""Which algorithm really ran: Open MPI's pml monitoring counts every point-to-point message a
collective generates, per peer and size, and each algorithm has its own pattern.

Debian's Open MPI 4.1 is built without debug output, so coll/tuned never says which algorithm it
selected; the messages do. With `--mca pml_monitoring_enable 2 --mca pml_monitoring_enable_output 3
--mca pml_monitoring_filename DIR/prefix` every rank writes DIR/prefix.<rank>.prof at
MPI_Finalize, with lines

    I<TAB>src<TAB>dst<TAB><bytes> bytes<TAB><n> msgs sent<TAB>h0,h1,h2,...

for the messages sent inside collectives: h[0] counts empty messages, h[k] messages of 2^(k-1)
to 2^k - 1 bytes. For allgather of S bytes at 4 ranks, rank 0 sends ring's 3 messages of S to
rank 1 only, recursive doubling's S to rank 1 and 2S to rank 2, bruck's S to rank 3 and 2S to
rank 2: the peers and sizes name the algorithm. The monitoring pml wraps the real one, so it must
be in the pml list (`--mca pml ob1,monitoring`); a preset's plain `pml ob1` would leave it out.
"""

import copy
import os
import re

from collbench.engines import launcher
from collbench.engines.launcher import TRANSPORT_PRESETS

_LINE = re.compile(r"^([EI])\t(\d+)\t(\d+)\t(\d+) bytes\t(\d+) msgs sent\t([\d,]+)\s*$")


def monitored(cfg, directory, prefix="prof"):
    """A copy of cfg whose MPI jobs write pml monitoring profiles to directory/prefix.<rank>.prof.

    The transport preset's MCA settings move into launcher_args with the monitoring pml added
    to its pml list; its environment into env.
    """
    preset = TRANSPORT_PRESETS[cfg.transport]
    mca = [(key, f"{value},monitoring" if key == "pml" else value) for key, value in preset["mca"]]
    if not any(key == "pml" for key, _ in mca):
        mca.append(("pml", "ob1,monitoring"))
    mca += [("pml_monitoring_enable", "2"), ("pml_monitoring_enable_output", "3"),
            ("pml_monitoring_filename", os.path.join(os.path.abspath(directory), prefix))]
    args, mca_env = launcher.mca_arguments(cfg, mca)   # the launcher's own mapping
    out = copy.copy(cfg)
    out.env = dict(preset["env"], **cfg.env, **mca_env)
    out.transport = "none"
    out.launcher_args = args + list(cfg.launcher_args)
    return out


def bucket(size_bytes):
    """The histogram index of a message of size_bytes."""
    return 0 if size_bytes <= 0 else size_bytes.bit_length()


def read_profiles(directory, prefix="prof"):
    """{(src, dst): [counts per size bucket]} of the internal (collective) messages of every rank."""
    sent = {}
    for name in sorted(os.listdir(directory)):
        if not (name.startswith(prefix + ".") and name.endswith(".prof")):
            continue
        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
            for line in f:
                m = _LINE.match(line)
                if not m or m.group(1) != "I":
                    continue
                counts = [int(x) for x in m.group(6).split(",") if x]
                key = (int(m.group(2)), int(m.group(3)))
                old = sent.get(key, [])
                sent[key] = [a + b for a, b in zip(counts + [0] * len(old), old + [0] * len(counts))]
    return sent


def sends_of_size(profiles, src, size_bytes):
    """{dst: messages} that rank src sent of size_bytes's bucket."""
    b = bucket(size_bytes)
    return {dst: counts[b] for (s, dst), counts in sorted(profiles.items())
            if s == src and len(counts) > b and counts[b]}
