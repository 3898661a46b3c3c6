"""The YAML configuration: load, validate, and the embedded local default.

Every top-level key and section is declared once in SCHEMA; validation walks it, so an unknown
key, a wrong type or a bad value is reported with the file, the dotted key and what was
expected, before anything runs (exit code 2). Paths come out resolved (Config.resolve_path:
relative to the config file); command-line flags narrow a config through apply_overrides (one
override_* function per flag) and check_flag. One module per job:

    kinds.py       value checkers (STR, PATH, SECONDS, MESSAGE_SIZE, ...) and the limits they hold
    schema.py      SCHEMA: every key and section, its kind and default
    model.py       Host, Step, Config, and the defaults (plans, state directory, rank count)
    loader.py      load_config / build_config: files read bounded, SCHEMA walked, errors named
    overrides.py   command-line flags applied to a loaded config

This package's interface is the names below (`from collbench.config import load_config`).
"""

from collbench.config.kinds import (ALGORITHM, BOOL, CRITICAL_LATENCY, FRACTION, INT_MAX, ITERATIONS,
                                    MAX_CONFIG_BYTES, MAX_HOSTFILE_BYTES, MAX_ITERATIONS, MAX_SECONDS,
                                    MESSAGE_SIZE, NONNEG_FLOAT, NONNEG_INT, NONNEG_SECONDS, PATH, PORT,
                                    POS_FLOAT, POS_INT, POS_SECONDS, RANKS, ROTATE_KEEP, SECONDS, SIZE, STR,
                                    STR_LIST, STR_MAP, WARMUP, WARNING_LATENCY, Kind, choice)
from collbench.config.loader import (InputFileError, build_config, config_error, load_config, parse_hostfile,
                                     read_input_file)
from collbench.config.model import (ONCE_EXTRA_PLAN, PROTOTYPE_PLAN, Config, Host, Step, default_plan,
                                    default_state_dir, flag_path, local_default_ranks, osu_default_iterations,
                                    resolve_path)
from collbench.config.overrides import (apply_overrides, check_flag, check_plan_sizes, int_flag,
                                        override_datatype, override_iterations, override_np, override_ops,
                                        override_sizes, override_validate)
from collbench.config.schema import (ALERTS_SCHEMA, ENGINES, EXPORTER_SCHEMA, LAUNCHERS, MASTER_SCHEMA,
                                     PLAN_STEP_KEYS, SCHEMA, SLURM_SCHEMA, STRESS_SCHEMA, TOP_KEYS, TRANSPORTS)

__all__ = [
    "ALGORITHM", "BOOL", "CRITICAL_LATENCY", "FRACTION", "INT_MAX", "ITERATIONS", "MAX_CONFIG_BYTES",
    "MAX_HOSTFILE_BYTES", "MAX_ITERATIONS", "MAX_SECONDS", "MESSAGE_SIZE", "NONNEG_FLOAT", "NONNEG_INT",
    "NONNEG_SECONDS", "PATH", "PORT", "POS_FLOAT", "POS_INT", "POS_SECONDS", "RANKS", "ROTATE_KEEP", "SECONDS",
    "SIZE", "STR", "STR_LIST", "STR_MAP", "WARMUP", "WARNING_LATENCY", "Kind", "choice",
    "InputFileError", "build_config", "config_error", "load_config", "parse_hostfile", "read_input_file",
    "ONCE_EXTRA_PLAN", "PROTOTYPE_PLAN", "Config", "Host", "Step", "default_plan", "default_state_dir",
    "flag_path", "local_default_ranks", "osu_default_iterations", "resolve_path",
    "apply_overrides", "check_flag", "check_plan_sizes", "int_flag", "override_datatype", "override_iterations",
    "override_np", "override_ops", "override_sizes", "override_validate",
    "ALERTS_SCHEMA", "ENGINES", "EXPORTER_SCHEMA", "LAUNCHERS", "MASTER_SCHEMA", "PLAN_STEP_KEYS", "SCHEMA",
    "SLURM_SCHEMA", "STRESS_SCHEMA", "TOP_KEYS", "TRANSPORTS",
]
