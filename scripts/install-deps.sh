#!/usr/bin/env bash
# Installs, from Debian 12's archive, what vrdma needs to build, test (clang
# and its libFuzzer runtime: scripts/fuzz.sh; python3-pyverbs: rdma-core's
# own test suite, integration.rdma_core_tests; iptables: packet loss in the
# fabric tests where the kernel has no tc netem; iperf3: the baseline of
# scripts/bench-fabric.sh) and run its demo. Only what is missing is
# installed. Needs root.
set -euo pipefail

packages=(
    build-essential cmake pkg-config git
    libibverbs-dev ibverbs-utils rdma-core perftest python3-pyverbs
    openmpi-bin libopenmpi-dev ucx-utils
    libfmt-dev catch2 libssl-dev libtoml11-dev python3-prometheus-client
    iproute2 procps iptables iperf3
    clang libclang-rt-14-dev
)

# shellcheck source=lib/packages.sh
source "$(dirname "$0")/lib/packages.sh"
install_missing vrdma "${packages[@]}"
echo "vrdma: all build and test dependencies are installed"
