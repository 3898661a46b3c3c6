"""The two driver scripts of the prototype this project replaces (mpi_test_controller.py,
mpi_bandwidth_stress.py), kept at the top of the repository and run through `collbench ctl`.

They take the controller's own options anywhere on the line and pass every other argument on to
the command the verb runs, so `./mpi_test_controller.py once --ops allreduce` works as the
prototype's operators expect without the `--` that `collbench ctl` asks for.
"""

import os
import sys

# controller options: name -> takes a value
CTL_OPTIONS = {"--config": True, "-c": True, "--host": True, "--local": False,
               "--accept-new-host-key": False, "--ask-password": False,
               "--upload-config": False, "--no-upload-config": False}
SERVERS_OPTIONS = {"--timeout": True, "--json": False}


def split_args(args, verb):
    """(controller args, args passed on) from the words after the verb."""
    known = dict(CTL_OPTIONS, **(SERVERS_OPTIONS if verb == "servers" else {}))
    ctl, rest = [], []
    i = 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0]
        if a == "--":
            rest += args[i + 1:]
            break
        if name in known:
            ctl.append(a)
            if known[name] and "=" not in a and i + 1 < len(args):
                ctl.append(args[i + 1])
                i += 1
        else:
            rest.append(a)
        i += 1
    return ctl, rest


def default_config(here):
    env = os.environ.get("COLLBENCH_CONFIG")
    if env:
        return env
    path = os.path.join(here, "config", "collbench.yaml")
    return path if os.path.isfile(path) else None


def run(argv, verbs, here):
    from collbench.cli import main
    prog = os.path.basename(argv[0])
    if len(argv) < 2 or argv[1] not in verbs:
        print(f"usage: {prog} {{{'|'.join(verbs)}}} [--config FILE] [options]\n"
              f"(the same as `collbench ctl VERB`; see `collbench ctl --help`)", file=sys.stderr)
        return 2
    verb = argv[1]
    ctl, rest = split_args(argv[2:], verb)
    if not any(a.split("=", 1)[0] in ("--config", "-c") for a in ctl):
        cfg = default_config(here)
        if cfg:
            ctl += ["--config", cfg]
    if verb == "servers":
        if rest:
            print(f"{prog}: servers takes no argument {rest[0]!r}", file=sys.stderr)
            return 2
        return main(["ctl", verb, *ctl])
    return main(["ctl", verb, *ctl, *(["--", *rest] if rest else [])])
