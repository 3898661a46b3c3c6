#!/usr/bin/env bash
# Install the exporter (and, with --with-stress, the stress daemon) as systemd services on the
# master. Idempotent: units and config are rewritten only when they change.
#
#   sudo scripts/deploy_exporter.sh --config FILE [--prefix /opt/collbench] [--user USER]
#                                   [--with-stress] [--no-start] [--root DIR]
#
# --config   the collbench config to serve from (copied to /etc/collbench/collbench.yaml)
# --prefix   where collbench is installed (setup_mpi_cluster.sh or `collbench ctl deploy`)
# --user     the account the services run as (the stress daemon's needs ssh keys to the hosts)
# --root     install below DIR instead of / and do not touch systemctl (packaging, tests)
set -euo pipefail

prefix=/opt/collbench
config=""
user=root
stress=0
start=1
root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="${2:?--config needs a file}"; shift 2 ;;
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --user) user="${2:?--user needs a name}"; shift 2 ;;
    --with-stress) stress=1; shift ;;
    --no-start) start=0; shift ;;
    --root) root="${2:?--root needs a directory}"; start=0; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "deploy_exporter.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done
die() { echo "deploy_exporter.sh: $*" >&2; exit 2; }
[ -n "$config" ] || die "--config FILE is required"
[ -f "$config" ] || die "config $config does not exist"
# these words go into unit files: keep them to characters systemd takes literally
safe='^[A-Za-z0-9_./@:+-]+$'
[[ "$prefix" =~ $safe && "$prefix" = /* ]] || die "--prefix must be an absolute path of letters, digits and ._/@:+-"
[[ "$user" =~ ^[a-z_][a-z0-9_-]*$ ]] || die "--user $user is not a valid user name"
python="$prefix/.venv/bin/python"
if [ -z "$root" ]; then
  [ -x "$python" ] || die "$python not found: run scripts/setup_mpi_cluster.sh --prefix $prefix (or collbench ctl deploy) first"
  "$python" -m collbench exporter --help >/dev/null || die "collbench in $prefix does not run"
  # validate the config with the collbench that will serve it, before anything is installed
  "$python" -c 'import sys; from collbench.config import load_config; load_config(sys.argv[1])' "$config" \
    || die "config $config is invalid (see above)"
fi

etc="$root/etc/collbench"
units="$root/etc/systemd/system"
mkdir -p "$etc" "$units"
changed=0
install_file() {  # install_file SRC DEST MODE: replace DEST only when the content differs
  if ! cmp -s "$1" "$2"; then
    install -m "$3" "$1" "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"
    echo "wrote $2"
    changed=1
  fi
}
install_file "$config" "$etc/collbench.yaml" 0640
pyexe="$python"; [ -x "$pyexe" ] || pyexe=python3   # with --root the prefix may not exist here
hostfile=$("$pyexe" - "$config" <<'PY' 2>/dev/null || true
import os, sys, yaml
d = yaml.safe_load(open(sys.argv[1])) or {}
h = d.get("hosts")
if isinstance(h, str) and not os.path.isabs(os.path.expanduser(h)):
    print(os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), h))
PY
)
if [ -n "$hostfile" ] && [ -f "$hostfile" ]; then
  install_file "$hostfile" "$etc/$(basename "$hostfile")" 0644
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The units are deploy/*.service (the documented ones), with this prefix and user.
units_src="$(cd "$(dirname "$0")/.." && pwd)/deploy"
for unit in collbench-exporter.service collbench-stress.service; do
  [ -f "$units_src/$unit" ] || die "$units_src/$unit not found (run from a collbench checkout)"
  sed -e "s#/opt/collbench#$prefix#g" -e "s#^User=.*#User=$user#" -e '/^Group=/d' \
    "$units_src/$unit" > "$tmp/$unit"
done
install_file "$tmp/collbench-exporter.service" "$units/collbench-exporter.service" 0644
services=(collbench-exporter.service)
if [ "$stress" = 1 ]; then
  install_file "$tmp/collbench-stress.service" "$units/collbench-stress.service" 0644
  services+=(collbench-stress.service)
fi

if [ "$start" = 1 ]; then
  command -v systemctl >/dev/null || die "systemctl not found (use --no-start and run the units yourself)"
  systemctl daemon-reload
  systemctl enable "${services[@]}" >/dev/null
  if [ "$changed" = 1 ]; then
    systemctl restart "${services[@]}"
  else
    systemctl start "${services[@]}"
  fi
  systemctl --no-pager --lines=0 status "${services[@]}" || true
  echo "exporter: curl http://$(hostname -f 2>/dev/null || hostname):9105/metrics"
else
  echo "installed under ${root:-/}; not started (--no-start)"
fi
