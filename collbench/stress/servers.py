"""`stress servers`: the benchmark processes and their CPU on the configured hosts that are
this machine (`ctl servers` asks every host over SSH)."""

import json

from collbench.hosts import is_this_machine
from collbench.results.state_dir import read_state
from collbench import bench_processes as processes


def show_servers(args, cfg, paths):
    """`stress servers`: benchmark processes and their CPU on the configured hosts that are this machine."""
    info = read_state(paths) or {}
    token = info.get("token")
    data, out, shown = None, [], None
    for host in cfg.host_names:
        if is_this_machine(host):
            if data is None:
                data = processes.collect(interval=args.interval, token=token)
                shown = host
                out.append({"host": host, "local": True, "data": data})
            else:
                out.append({"host": host, "local": True, "same_as": shown})
        else:
            out.append({"host": host, "local": False})
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for item in out:
        if item.get("data"):
            print("\n".join(processes.format_host(item["host"], item["data"])))
        elif item.get("same_as"):
            print(f"{item['host']}: this machine (shown under {item['same_as']})")
        else:
            print(f"{item['host']}: remote host; `collbench ctl` queries it over SSH")
    return 0
