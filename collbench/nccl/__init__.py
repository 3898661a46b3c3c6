"""NCCL/RCCL debug logs: the collectives a training job ran (census) and whether its ranks agreed (desync)."""
