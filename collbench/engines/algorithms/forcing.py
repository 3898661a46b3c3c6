"""Forcing algorithms: which jobs a plan needs, and the MCA parameters or environment that
force an algorithm (or load a tuning file) in one job.

* Open MPI: `--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_<op>_algorithm <id>`; a
  component that outranks tuned for intra-communicators (han in Open MPI 5.x, priority 35 against
  tuned's 30) would take the call before tuned sees it, so it is excluded (`--mca coll ^han`)
  when ompi_info shows it with the higher priority.
* MPICH: `MPIR_CVAR_<OP>_INTRA_ALGORITHM=<name>`, plus `MPIR_CVAR_DEVICE_COLLECTIVES=none` (the
  ch4 device may otherwise pick its own algorithm over the MPIR-level one) and
  `MPIR_CVAR_COLLECTIVE_FALLBACK=error` (an algorithm that cannot serve the call fails the job
  instead of silently running another one under the forced name).

Forcing applies to a whole MPI job, per op: one job can force allgather and allreduce at once,
never two algorithms of one op (job_algorithms, same_job_prefix).
"""

import os
from dataclasses import dataclass, field

from collbench.bounded_file import read_settings
from collbench.engines import mpi_flavour
from collbench.engines.algorithms.discovery import DEFAULT, MPICH_INFIX, canonical, catalogue, is_default
from collbench.errors import UserError
from collbench.ops import get_op


def job_algorithms(steps):
    """{op: algorithm} that one job running steps must force (default steps force nothing);
    ValueError when two steps of one op ask for different algorithms."""
    chosen = {}
    for s in steps:
        name = None if is_default(getattr(s, "algorithm", None)) else canonical(s.algorithm)
        if s.op in chosen and chosen[s.op] != name:
            raise ValueError(f"{s.op}: steps ask for {chosen[s.op] or DEFAULT} and {name or DEFAULT} "
                             f"in one MPI job (an algorithm is forced per job)")
        chosen[s.op] = name
    return {op: name for op, name in chosen.items() if name is not None}


def same_job_prefix(steps):
    """The longest leading run of steps one MPI job can run (no op with two algorithms)."""
    steps = list(steps)
    chosen = {}
    for i, s in enumerate(steps):
        name = None if is_default(getattr(s, "algorithm", None)) else canonical(s.algorithm)
        if s.op in chosen and chosen[s.op] != name:
            return steps[:i]
        chosen[s.op] = name
    return steps


def needs_separate_jobs(steps):
    try:
        job_algorithms(steps)
        return False
    except ValueError:
        return True


def check_steps(cfg, steps):
    """Every step's algorithm exists in the config's MPI (UserError naming the step and listing
    the available ones); nothing is asked of the MPI when no step forces one."""
    forced = [s for s in steps if not is_default(getattr(s, "algorithm", None))]
    if not forced:
        return
    cat = catalogue(cfg)
    for s in forced:
        try:
            cat.find(s.op, s.algorithm)
        except UserError as e:
            size = f" {s.size_label}" if get_op(s.op).has_size else ""
            raise UserError(f"{cfg.source}: plan step {s.op}{size}: {e}") from None


@dataclass
class LaunchSettings:
    mca: list = field(default_factory=list)    # (name, value) pairs: Open MPI's --mca
    env: dict = field(default_factory=dict)    # variables the ranks need


def launch_settings(cfg, algorithms=None, rules_file=None, mpi=None):
    """What forces algorithms ({op: name}) or loads a tuning file for one job of cfg's MPI (mpi:
    its mpi_flavour.MpiInstall, when the caller holds it). Nothing (and no MPI tool run) when
    neither is asked for."""
    algorithms = {op: name for op, name in (algorithms or {}).items() if not is_default(name)}
    if not algorithms and not rules_file:
        return LaunchSettings()
    return settings_for(catalogue(cfg, mpi), algorithms, rules_file)


def settings_for(cat, algorithms, rules_file=None):
    """launch_settings for a given Catalogue."""
    algorithms = {op: name for op, name in (algorithms or {}).items() if not is_default(name)}
    settings = LaunchSettings()
    if cat.flavour == mpi_flavour.OPENMPI:
        settings.mca.append(("coll_tuned_use_dynamic_rules", "1"))
        for op, name in sorted(algorithms.items()):
            a = cat.find(op, name)
            settings.mca.append((f"coll_tuned_{get_op(op).name}_algorithm", a.value))
        if rules_file:
            settings.mca.append(("coll_tuned_dynamic_rules_filename", os.path.abspath(rules_file)))
        if cat.outranking:
            settings.mca.append(("coll", "^" + ",".join(cat.outranking)))
        return settings
    for op, name in sorted(algorithms.items()):
        a = cat.find(op, name)
        settings.env[f"MPIR_CVAR_{MPICH_INFIX[get_op(op).name]}_INTRA_ALGORITHM"] = a.value
    if algorithms:
        settings.env["MPIR_CVAR_DEVICE_COLLECTIVES"] = "none"
        settings.env["MPIR_CVAR_COLLECTIVE_FALLBACK"] = "error"
    if rules_file:
        settings.env.update(read_env_file(rules_file))
    return settings


def read_env_file(path):
    """MPIR_CVAR_* settings from an env file (`[export ]NAME=value`, # comments); UserError naming
    the file and line for anything else."""
    return read_settings(path, "MPIR_CVAR_[A-Z0-9_]+", path, "MPIR_CVAR_NAME=value (an MPICH settings file)",
                         value="[A-Za-z0-9_./:,+-]*", required=False)
