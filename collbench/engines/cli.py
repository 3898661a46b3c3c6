"""`collbench engine build|path`: build the built-in engine into the cache, or say where it is."""

import sys

from collbench.engines.build import cached_engine_path, check_prebuilt, ensure_engine, find_mpicc


def _cmd_build(args):
    from collbench.config import load_config
    cfg = load_config(args.config)
    print(ensure_engine(cfg, force=args.force))
    return 0


def _cmd_path(args):
    from collbench.config import load_config
    cfg = load_config(args.config)
    if cfg.engine_path:
        print(check_prebuilt(cfg.engine_path))
        return 0
    path = cached_engine_path(find_mpicc(cfg))   # the config's MPI (mpicc, launcher_path)
    print(path)
    if not path.is_file():
        print("collbench: the engine is not built yet (run: collbench engine build)", file=sys.stderr)
        return 1
    return 0


def register(subparsers):
    from collbench.cli import add_config_arg
    p = subparsers.add_parser("engine", help="build or locate the built-in MPI engine",
                              description="Build (with mpicc) or locate the built-in collective engine.")
    sub = p.add_subparsers(dest="engine_command", metavar="ACTION")
    sub.required = True
    b = sub.add_parser("build", help="compile the engine into the cache and print its path")
    add_config_arg(b)
    b.add_argument("--force", action="store_true", help="rebuild even if a cached binary exists")
    b.set_defaults(func=_cmd_build)
    q = sub.add_parser("path", help="print the engine's path (exit 1 if it is not built yet)")
    add_config_arg(q)
    q.set_defaults(func=_cmd_path)
