#!/usr/bin/env bash
# Prepare one cluster node for collbench, idempotently: OpenMPI + UCX (+ RDMA userspace when
# the node has RDMA devices), memlock limits for RDMA, and collbench itself in PREFIX with its
# virtualenv and the built-in MPI engine. Run it on every node (or once on shared storage);
# running it again only does what is missing.
#
#   sudo scripts/setup_mpi_cluster.sh [--prefix /opt/collbench] [--no-packages] [--no-engine]
#
# From a laptop, `collbench ctl deploy` installs collbench on the master and hosts over SSH;
# this script is for the packages deploy does not touch.
set -euo pipefail

prefix=/opt/collbench
packages=1
engine=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --no-packages) packages=0; shift ;;
    --no-engine) engine=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "setup_mpi_cluster.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done
case "$prefix" in /*) ;; *) echo "setup_mpi_cluster.sh: --prefix must be an absolute path" >&2; exit 2 ;; esac

src="$(cd "$(dirname "$0")/.." && pwd)"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

if [ "$packages" = 1 ]; then
  if command -v apt-get >/dev/null; then
    pkgs=(openmpi-bin libopenmpi-dev libucx0 ucx-utils openssh-client openssh-server python3 python3-venv
          procps ethtool iproute2)
    [ -d /sys/class/infiniband ] && pkgs+=(rdma-core ibverbs-utils infiniband-diags)
    missing=()
    for p in "${pkgs[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
      echo "installing: ${missing[*]}"
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
  elif command -v dnf >/dev/null; then
    pkgs=(openmpi openmpi-devel ucx openssh-clients openssh-server python3 procps-ng ethtool iproute)
    [ -d /sys/class/infiniband ] && pkgs+=(rdma-core libibverbs-utils infiniband-diags)
    $SUDO dnf install -y -q "${pkgs[@]}"
    # Fedora/RHEL keep OpenMPI out of PATH; mpirun must be found by non-interactive ssh too
    if [ ! -e /etc/profile.d/collbench-openmpi.sh ]; then
      echo 'export PATH=/usr/lib64/openmpi/bin:$PATH' | $SUDO tee /etc/profile.d/collbench-openmpi.sh >/dev/null
    fi
  else
    echo "setup_mpi_cluster.sh: no apt-get or dnf; install OpenMPI 4.x with UCX yourself, then run with --no-packages" >&2
    exit 1
  fi
  # RDMA registers (pins) memory: the default 64 KB memlock limit breaks UCX verbs transports
  limits=/etc/security/limits.d/90-collbench-memlock.conf
  if [ -d /sys/class/infiniband ] && [ ! -e "$limits" ]; then
    printf '* soft memlock unlimited\n* hard memlock unlimited\n' | $SUDO tee "$limits" >/dev/null
    echo "set memlock unlimited in $limits (log in again for it to apply)"
  fi
fi

# collbench in $prefix: copy this checkout's tree when it is not already there
if [ "$(realpath -m "$src")" != "$(realpath -m "$prefix")" ]; then
  $SUDO mkdir -p "$prefix"
  for part in pyproject.toml README.md collbench scripts; do
    [ -e "$src/$part" ] || continue
    $SUDO rm -rf "$prefix/.setup-new-$part"
    $SUDO cp -a "$src/$part" "$prefix/.setup-new-$part"
    $SUDO rm -rf "$prefix/$part"
    $SUDO mv "$prefix/.setup-new-$part" "$prefix/$part"
  done
fi
if [ ! -x "$prefix/.venv/bin/python" ]; then
  $SUDO python3 -m venv "$prefix/.venv"
fi
$SUDO "$prefix/.venv/bin/python" -m pip install -q --disable-pip-version-check "$prefix"
if [ "$engine" = 1 ]; then
  "$prefix/.venv/bin/python" -m collbench engine build
fi
echo "collbench ready: $prefix/.venv/bin/collbench ($(command -v mpirun || echo 'mpirun not on PATH'))"
