"""The config and state directory a `stress` verb works on, from its flags."""

import os

from collbench.config import load_config
from collbench.results.state_dir import StatePaths


def resolve(args):
    """(cfg, StatePaths) from --config and --state-dir (paths made absolute: start chdirs to /)."""
    cfg = load_config(args.config)
    if os.path.isfile(cfg.source):
        cfg.source = os.path.abspath(cfg.source)
    return cfg, StatePaths.for_config(cfg, args.state_dir)


def results_path(paths, info):
    """The log the daemon writes: as recorded in its state file, else from the config."""
    return (info or {}).get("results_log") or paths.results_log
