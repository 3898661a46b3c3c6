"""collbench: MPI collective benchmarks, stress daemon and exporter for RDMA AI clusters."""

__version__ = "0.1.0"
