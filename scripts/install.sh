#!/usr/bin/env bash
# Install what collbench needs on this machine (Debian/Ubuntu), idempotently:
# OpenMPI + UCX (+ sshd, Prometheus, Alertmanager for the tests), a venv in .venv with
# collbench and its Python deps, and the built-in MPI engine.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(openmpi-bin libopenmpi-dev libucx0 ucx-utils openssh-server openssh-client
              prometheus prometheus-alertmanager iproute2 procps ethtool nftables python3-venv
              mpich libmpich-dev slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins chromium)
# Go builds tools/k8s-validate (below); Debian's golang-go when no Go is installed
command -v go >/dev/null 2>&1 || APT_PACKAGES+=(golang-go)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  # no recommends: we start Prometheus ourselves, we do not want node_exporter etc. as services
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.collbench-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e ".[test]"
  touch "$stamp"
fi
# tools/k8s-validate: the deploy/kubernetes checks of tests/test_kubernetes.py (the Prometheus
# Operator's Go API types, kustomize's library); modules from the Go module proxy, rebuilt only
# when its sources changed
validator=.venv/bin/k8s-validate
if [ ! -x "$validator" ] || [ -n "$(find tools/k8s-validate -type f -newer "$validator")" ]; then
  echo "building $validator"
  (cd tools/k8s-validate && go build -o "../../$validator" .)
fi
.venv/bin/collbench engine build
