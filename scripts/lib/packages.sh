# shellcheck shell=bash
# Sourced by scripts/install-deps.sh and scripts/vm/install-deps.sh:
# install_missing NAME PACKAGE... installs, from Debian's archive, those of
# the packages that are not installed yet. Returns 0 at once (printing
# nothing) when all are there, 1 when some are missing and this is not
# root; NAME prefixes its messages.
install_missing() {
    local name=$1 p
    shift
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "$name: missing packages: ${missing[*]}; run as root to install them" >&2
        return 1
    fi
    echo "$name: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
