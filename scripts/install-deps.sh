#!/usr/bin/env bash
# Installs, from Debian 12's archive, what vrdma needs to build, test (clang
# and its libFuzzer runtime: scripts/fuzz.sh; iptables: packet loss in the
# fabric tests where the kernel has no tc netem; iperf3: the baseline of
# scripts/bench-fabric.sh) and run its demo. Only what is missing is
# installed. Needs root.
set -euo pipefail

packages=(
    build-essential cmake pkg-config git
    libibverbs-dev ibverbs-utils rdma-core perftest
    openmpi-bin libopenmpi-dev
    libfmt-dev catch2 libssl-dev
    iproute2 procps iptables iperf3
    clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "vrdma: all build and test dependencies are installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "vrdma: missing packages: ${missing[*]}; run as root to install them" >&2
    exit 1
fi
echo "vrdma: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
