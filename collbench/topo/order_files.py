"""A rank order in the forms users launch with (topo.md §3), written as one set: all or none.

`labels` is the list of matrix labels in new rank order: rank r runs on labels[r] (`host`, or
`host:N` for the N-th rank on a host; pair_matrix.py). The launch forms' text is
engines/rank_order.py's, the one writer the launcher uses too. Files, for pattern PAT in the
output directory:

| file                      | use                                                                 |
|---------------------------|---------------------------------------------------------------------|
| PAT.rankfile              | Open MPI 4: `mpirun -np P --rankfile PAT.rankfile ...`              |
|                           | (Open MPI 5: `--map-by rankfile:file=PAT.rankfile`)                 |
| PAT.hostfile              | Open MPI sequential mapper, one line per rank:                      |
|                           | `mpirun -np P --hostfile PAT.hostfile --mca rmaps seq ...` (5: `--map-by seq`) |
| PAT.machinefile           | MPICH Hydra: `mpiexec -f PAT.machinefile -n P ...`                  |
| PAT.slurm_hostfile        | Slurm: `SLURM_HOSTFILE=PAT.slurm_hostfile srun --distribution=arbitrary -n P ...` |
| PAT.hosts_order.yaml      | `hosts_order:` for collbench's config (rank r on entry r)           |
| PAT.mapping.json          | the whole result: every method's order and predicted cost           |
"""

import json
import os

import yaml

from collbench.atomic_file import FileSet
from collbench.engines import rank_order
from collbench.errors import UserError
from collbench.pair_matrix import split_label

SUFFIXES = ("rankfile", "hostfile", "machinefile", "slurm_hostfile", "hosts_order.yaml", "mapping.json")


def _hosts(labels):
    return [split_label(lb)[0] for lb in labels]


def rankfile_text(labels, comment=None):
    """Open MPI rankfile: `rank r=host slot=N` per rank (N = the label's slot, 0 for a bare host)."""
    return rank_order.rankfile_text(_hosts(labels), [split_label(lb)[1] for lb in labels], comment)


def hostfile_text(labels, comment=None):
    """Open MPI hostfile for the sequential mapper: one line per rank, in rank order."""
    return rank_order.hostfile_text(_hosts(labels), comment)


def machinefile_text(labels, comment=None):
    """MPICH Hydra machinefile: `host:k` places k consecutive ranks; runs of one host merged."""
    return rank_order.machinefile_text(_hosts(labels), comment)


def slurm_hostfile_text(labels):
    """SLURM_HOSTFILE for --distribution=arbitrary: one host per task, in task order."""
    return rank_order.slurm_hostfile_text(_hosts(labels))


def hosts_order_text(labels, comment=None):
    """The config snippet: `hosts_order:` listing the host of each rank, rank 0 first."""
    head = f"# {comment}\n" if comment else ""
    return head + yaml.safe_dump({"hosts_order": [split_label(lb)[0] for lb in labels]},
                                 default_flow_style=False, sort_keys=False)


def file_paths(out_dir, pattern):
    return {s: os.path.join(out_dir, f"{pattern}.{s}") for s in SUFFIXES}


def check_out_dir(path):
    """--out-dir created if missing, as an absolute path; UserError (exit 2) naming it when it
    cannot be created or is not a writable directory (topo map and topo measure)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out-dir {path}: cannot create: {e.strerror}") from None
    if not os.path.isdir(path):
        raise UserError(f"--out-dir {path}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"--out-dir {path}: not writable")
    return os.path.abspath(path)


def write_order_files(out_dir, pattern, labels, result_dict, comment=None):
    """Write every form into out_dir (created if missing); {suffix: absolute path}.

    All or nothing (atomic_file.FileSet). UserError (exit 2) naming the directory or the file when
    it cannot be created or written."""
    check_out_dir(out_dir)
    texts = {
        "rankfile": rankfile_text(labels, comment),
        "hostfile": hostfile_text(labels, comment),
        "machinefile": machinefile_text(labels, comment),
        "slurm_hostfile": slurm_hostfile_text(labels),
        "hosts_order.yaml": hosts_order_text(labels, comment),
        "mapping.json": json.dumps(result_dict, indent=1) + "\n",
    }
    # one set: all six are written or none is (a full disk keeps the old set whole, never a mix
    # of the new order's rankfile with the old order's mapping.json)
    files = FileSet("--out-dir")
    paths = file_paths(out_dir, pattern)
    for suffix, path in paths.items():
        files.add(path, texts[suffix])
    written = files.commit()
    return {suffix: os.path.abspath(written[path]) for suffix, path in paths.items()}
