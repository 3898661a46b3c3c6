"""The engines: what runs the collectives, and everything that starts them.

The built-in C/MPI engine (`builtin.py`, its source `collbench_engine.c`, built by `build.py`)
and the OSU Micro-Benchmarks (`osu.py`, output read by `osu_parser.py`), the mpirun/srun command
line (`launcher.py`) and the MPI job runner (`mpi_job.py`).
"""
