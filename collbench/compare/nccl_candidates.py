"""Which NCCL algorithms and protocols a comparison times: read from NCCL itself, not a list.

NCCL's names and what this machine can run depend on its version and hardware (NVLS needs an
NVSwitch, CollNet a SHARP network, NVLSTree more than one node, PAT is 2.23+ and AllGather/
ReduceScatter only). So the op's nccl-tests binary is started once, on the comparison's ranks,
with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING: rank 0 prints ncclTopoTuneModel's table
(src/graph/tuning.cc; 2.19 and later, e.g. 2.21, 2.28.9):

    NCCL INFO   Algorithm   |                 Tree       |                 Ring       | ...
    NCCL INFO   Protocol    |     LL |  LL128 | Simple |     LL |  LL128 | Simple | ...
    NCCL INFO  Max NThreads |    512 |    640 |    512 | ...
    NCCL INFO     AllReduce |  6.8/ 0.0 | ...                     (latency us / bandwidth GB/s)

in blocks of three algorithms (NCCL 2.12 and before: one `Latency/AlgBw |  Tree/    LL | ...`
header of algorithm/protocol pairs, the same function lines). A pair with bandwidth 0 is one NCCL disabled here (by the
hardware or the environment): it is reported, not run. Every other pair is a candidate, run as
NCCL_ALGO=<algo> NCCL_PROTO=<proto> (what NCCL then refuses anyway makes a FAILED row with its
WARN). No table printed (an NCCL that prints none): an error asking for --algorithms.
"""

import copy
import os
import re
from dataclasses import dataclass, field

from collbench.engines import nccl_tests
from collbench.engines.mpi_job import JobRunner
from collbench.errors import UserError

# collbench op -> NCCL's function name (ncclFuncStr, src/init.cc); alltoall is point-to-point in NCCL
FUNCS = {"allreduce": "AllReduce", "bcast": "Broadcast", "reduce": "Reduce", "allgather": "AllGather",
         "reduce_scatter": "ReduceScatter"}
MAX_NAMES = 64
_INFO = re.compile(r"NCCL INFO (.*)$")
_CELL = re.compile(r"^\s*(-?[\d.]+(?:e[+-]?\d+)?)\s*/\s*(-?[\d.]+(?:e[+-]?\d+)?)\s*$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,31}$")


@dataclass(frozen=True)
class Candidate:
    """One forced setting: NCCL_ALGO (and NCCL_PROTO when a protocol is named)."""
    algo: str
    proto: str = None

    @property
    def name(self):
        return f"{self.algo}/{self.proto}" if self.proto else self.algo

    def env(self):
        out = {"NCCL_ALGO": self.algo}
        if self.proto:
            out["NCCL_PROTO"] = self.proto
        return out


@dataclass
class Tuning:
    """NCCL's tuning table: names in its order and {function: {(algo, proto): (latency, bandwidth)}}."""
    algos: list = field(default_factory=list)
    protos: list = field(default_factory=list)
    table: dict = field(default_factory=dict)

    def candidates(self, func):
        """([Candidate] NCCL enables for func, [names it disabled])."""
        on, off = [], []
        for a in self.algos:
            for p in self.protos:
                cell = self.table.get(func, {}).get((a, p))
                if cell is None:
                    continue
                (on if cell[1] > 0 else off).append(Candidate(a, p))
        return on, [c.name for c in off]


def parse_tuning(text):
    """The first complete tuning table in NCCL INFO output (any launcher prefix), or None."""
    tun = Tuning()
    block, protos, flat = None, None, None
    for raw in str(text).splitlines()[:200000]:
        m = _INFO.search(raw)
        if not m:
            continue
        msg = m.group(1)
        head, bar, rest = msg.partition("|")
        if not bar:
            continue
        label = head.strip()
        cells = [c.strip() for c in rest.split("|")]
        if label == "Latency/AlgBw":      # NCCL before 2.13ish: one line of "Algo/Proto" cells
            pairs = [tuple(x.strip() for x in c.split("/")) for c in cells if c]
            if not pairs or not all(len(x) == 2 and all(_NAME.match(n) for n in x) for x in pairs):
                continue
            if tun.table:
                break
            block, protos = None, None
            flat = pairs
            tun.algos = list(dict.fromkeys(a for a, _ in pairs))
            tun.protos = list(dict.fromkeys(p for _, p in pairs))
            continue
        if label == "Algorithm":
            names = [c for c in cells if c]
            if not names or not all(_NAME.match(n) for n in names):
                block = None
                continue
            if names[0] in tun.algos:       # a second communicator's table: the first one is read
                break
            block, protos, flat = names, None, None
            tun.algos += [n for n in names if n not in tun.algos]
        elif label == "Protocol" and block:
            names = [c for c in cells if c]
            if not all(_NAME.match(n) for n in names):
                block = None
                continue
            # NCCL prints the protocols three times per block, even for a last block of fewer algorithms
            protos = list(dict.fromkeys(names))
            tun.protos += [p for p in protos if p not in tun.protos]
        elif _NAME.match(label) and (block and protos or flat):
            keys = ([(block[i // len(protos)], protos[i % len(protos)]) for i in range(len(block) * len(protos))]
                    if block and protos else flat)
            values = [_CELL.match(c) for c in cells if c]
            if len(values) != len(keys) or not all(values):
                continue
            row = tun.table.setdefault(label, {})
            for key, v in zip(keys, values):
                row.setdefault(key, (float(v.group(1)), float(v.group(2))))
    return tun if tun.table and tun.algos and tun.protos else None


def parse_names(text, flag="--algorithms"):
    """[Candidate] from 'Ring/LL128,Tree,NVLS/Simple' (names as NCCL spells them; checked by NCCL)."""
    out = []
    for item in str(text).split(",")[:MAX_NAMES + 1]:
        item = item.strip()
        if not item or item.lower() == "default":
            continue
        algo, _, proto = item.partition("/")
        if not _NAME.match(algo) or (proto and not _NAME.match(proto)):
            raise UserError(f"{flag}: {item[:64]!r} is not ALGO or ALGO/PROTO (NCCL's names, e.g. Ring/LL128)")
        c = Candidate(algo, proto or None)
        if c not in out:
            out.append(c)
    if len(out) > MAX_NAMES:
        raise UserError(f"{flag}: more than {MAX_NAMES} names")
    return out


def discovery_config(cfg):
    out = copy.copy(cfg)
    out.env = dict(cfg.env)
    out.env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING"})
    return out


def discover(cfg, op, binary, args):
    """Tuning of one op's binary run once (args: a tiny job's nccl-tests options); UserError when
    NCCL printed no table (the output's last lines say what it printed)."""
    out = nccl_tests.run_job(discovery_config(cfg), binary, args, JobRunner())
    lines, job = out.lines, out.job
    tun = parse_tuning("\n".join(line.rstrip("\n") for line in lines))
    if tun is None:
        tail = " | ".join(l.strip()[:160] for l in lines[-4:] if l.strip()) or "nothing"
        raise UserError(f"{os.path.basename(binary)} with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING "
                        f"printed no NCCL tuning table (exit {job.returncode}; last output: {tail}); "
                        f"name the candidates with --algorithms ALGO/PROTO,...")
    return tun
