# collbench image: the CLI, the built-in engine built against the image's OpenMPI + UCX, and sshd
# for MPI Operator workers. Used by deploy/kubernetes/ (exporter, MPIJob launcher and workers).
#   docker build -t registry.example.com/hpc/collbench:0.1.0 .
# (Not built in this repository's CI: the test machine has no container runtime.)
FROM debian:bookworm-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      openmpi-bin libopenmpi-dev libucx0 ucx-utils rdma-core ibverbs-providers \
      openssh-server openssh-client python3 python3-venv gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /run/sshd

WORKDIR /opt/collbench
COPY pyproject.toml README.md ./
COPY collbench ./collbench
COPY deploy ./deploy
RUN python3 -m venv .venv \
 && .venv/bin/pip install --no-cache-dir . \
 && .venv/bin/collbench engine build \
 && install -D -m 755 "$(.venv/bin/collbench engine path)" /opt/collbench/bin/collbench-engine

ENV PATH=/opt/collbench/.venv/bin:$PATH
# OpenMPI refuses root without these; MPI Operator workers run sshd as root
ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EXPOSE 9105
CMD ["collbench", "exporter", "--listen", "0.0.0.0:9105"]
