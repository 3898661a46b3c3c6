"""The MPI library's own collective algorithms: which the installed MPI offers, and how to force one.

The list comes from the MPI at run time, never from a table here (names and ids differ between
releases). One module per job:

    discovery.py     what the MPI offers (ompi_info, mpivars), cached per install
    forcing.py       which jobs a plan needs, and the settings forcing an algorithm in one job
    constraints.py   why an algorithm cannot run as itself at a rank count or size
    diagnosis.py     what a failed forced run's stderr says about the algorithm

This package's interface is the names below; callers import the package, not its modules.
"""

from collbench.engines.algorithms.discovery import (DEFAULT, MPICH_4_0_DOCUMENTED, MPICH_INFIX,
                                                    OUTRANKING_CANDIDATES, RULES, Algorithm, Catalogue,
                                                    canonical, catalogue, is_default,
                                                    mpich_names_from_description, outranking_components,
                                                    parse_mpivars, parse_ompi_info)
from collbench.engines.algorithms.constraints import known_constraint
from collbench.engines.algorithms.diagnosis import failure_reason
from collbench.engines.algorithms.forcing import (LaunchSettings, check_steps, job_algorithms,
                                                  launch_settings, needs_separate_jobs, read_env_file,
                                                  same_job_prefix, settings_for)

__all__ = ["DEFAULT", "MPICH_4_0_DOCUMENTED", "MPICH_INFIX", "OUTRANKING_CANDIDATES", "RULES", "Algorithm",
           "Catalogue", "canonical", "catalogue", "is_default", "mpich_names_from_description",
           "outranking_components", "parse_mpivars", "parse_ompi_info", "known_constraint", "failure_reason",
           "LaunchSettings", "check_steps", "job_algorithms", "launch_settings", "needs_separate_jobs",
           "read_env_file", "same_job_prefix", "settings_for"]
