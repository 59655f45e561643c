#!/usr/bin/env bash
# Installs, from Debian 12's archive, what vrdma needs to build, test (clang
# and its libFuzzer runtime: scripts/fuzz.sh; librdmacm-dev and rdmacm-utils:
# the rdma_cm tests; python3-pyverbs: rdma-core's
# own test suite, integration.rdma_core_tests; libtoml11-dev: the shim's
# --config; python3-prometheus-client: integration.metrics; lintian:
# integration.package; podman and runc: integration.cdi; iptables: packet loss in the
# fabric tests where the kernel has no tc netem; iperf3: the baseline of
# scripts/bench-fabric.sh) and run its demo. Only what is missing is
# installed. Needs root.
set -euo pipefail

packages=(
    build-essential cmake pkg-config git
    libibverbs-dev ibverbs-utils rdma-core perftest python3-pyverbs
    librdmacm-dev rdmacm-utils
    openmpi-bin libopenmpi-dev ucx-utils
    libfmt-dev catch2 libssl-dev nettle-dev libtoml11-dev python3-prometheus-client
    iproute2 procps iptables iperf3 lintian podman runc
    clang libclang-rt-14-dev
)

# shellcheck source=lib/packages.sh
source "$(dirname "$0")/lib/packages.sh"
install_missing vrdma "${packages[@]}"

# promtool (integration.metrics: `promtool check metrics`) from Debian's
# prometheus package, unpacked into /var/cache/vrdma rather than installed:
# installing the package would also start a Prometheus server.
promtool=/var/cache/vrdma/bin/promtool
if [ ! -x "$promtool" ] && [ "$(id -u)" -eq 0 ]; then
    tmp="$(mktemp -d)"
    if (cd "$tmp" && { apt-get download prometheus >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get download prometheus >/dev/null; }; }); then
        dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
        install -D -m 755 "$tmp/root/usr/bin/promtool" "$promtool"
        echo "vrdma: promtool unpacked into $promtool"
    else
        echo "vrdma: could not download Debian's prometheus package: integration.metrics checks without promtool" >&2
    fi
    rm -rf "$tmp"
fi
echo "vrdma: all build and test dependencies are installed"
