#!/usr/bin/env bash
# Containers through CDI (vrdmactl cdi, the same as vrdma-run --cdi): the
# spec made for guests a and b is applied to "containers" by a stand-in runtime that does what a CDI
# runtime does with it and no more: a mount namespace in which the run
# directory and /dev/infiniband start empty, the spec's mounts, its device
# nodes, and a process that gets only the spec's environment (env -i). Each
# container sees vrdma0 (its guest's, and only that), none of the other
# guest's files, and a checked ibv_rc_pingpong between a container of a and
# one of b passes. A spec without the device node does not give a device.
# Then a real CDI-aware runtime, podman, runs a container with the device
# from a root made of local files: ibv_devinfo, and a checked ping-pong with
# a process of guest b on the host. Needs root (unshare, mount, mknod).
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "needs root"; exit 77; }
command -v unshare >/dev/null || { echo "no unshare"; exit 77; }
start_shim a b
chmod 755 "$RUN_DIR"
spec="$RUN_DIR.cdi.json"
"$VRDMACTL" --run-dir "$RUN_DIR" cdi >"$spec" || fail "vrdmactl cdi failed"
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a --guest b --cdi | cmp -s - "$spec" ||
    fail "vrdma-run --cdi and vrdmactl cdi disagree"

# in_container SPEC DEVICE CMD...: CMD as a CDI runtime would run it with
# device vrdma.dev/guest=DEVICE.
in_container() {
    local spec="$1" device="$2"
    shift 2
    local script
    script="$(/usr/bin/python3 - "$spec" "$device" <<'PY'
import json, re, shlex, sys
spec, name = json.load(open(sys.argv[1])), sys.argv[2]
assert spec['cdiVersion'] == '0.5.0' and re.fullmatch(r'[a-z0-9.-]+/[a-z0-9._-]+', spec['kind']), spec['kind']
dev = next(d for d in spec['devices'] if d['name'] == name)
edits = dev['containerEdits']
env = dict(e.split('=', 1) for e in edits['env'])
q = shlex.quote
lines = ['set -e', 'stage=$(mktemp -d)']
for k, m in enumerate(edits['mounts']):
    lines.append('if [ -d %s ]; then mkdir $stage/%d; else touch $stage/%d; fi' % (q(m['hostPath']), k, k))
    lines.append('mount --bind %s $stage/%d' % (q(m['hostPath']), k))
# The container's view: nothing of the run directory or of /dev/infiniband
# but what the spec puts there.
lines.append('mount -t tmpfs -o mode=755 tmpfs %s' % q(env['VRDMA_RUN_DIR']))
lines.append('mount -t tmpfs -o mode=755 tmpfs /dev/infiniband')
for k, m in enumerate(edits['mounts']):
    p = q(m['containerPath'])
    lines.append('if [ -d $stage/%d ]; then mkdir -p %s; else mkdir -p $(dirname %s); touch %s; fi' % (k, p, p, p))
    lines.append('mount --bind $stage/%d %s' % (k, p))
    if 'ro' in m['options']:
        lines.append('mount -o remount,bind,ro %s' % p)
for n in edits.get('deviceNodes', []):
    lines.append('mkdir -p $(dirname %s); mknod -m 666 %s %s %d %d' % (q(n['path']), q(n['path']), n['type'], n['major'], n['minor']))
lines.append('exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin ' + ' '.join(q(k + '=' + v) for k, v in env.items()) + ' "$@"')
print('\n'.join(lines))
PY
)" || fail "the CDI spec is not as a runtime expects (above)"
    unshare --mount --propagation private -- bash -c "$script" container "$@"
}

note "the spec"
/usr/bin/python3 -c "
import json, sys
s = json.load(open('$spec'))
for d in s['devices']:
    e = d['containerEdits']
    print('  %s=%s: %d env, %d mounts, node %s' % (s['kind'], d['name'], len(e['env']), len(e['mounts']), e['deviceNodes'][0]['path']))
"

note "a container of guest a sees vrdma0, and none of guest b's files"
in_container "$spec" a ibv_devinfo >"$RUN_DIR.c.info" 2>&1 || { cat "$RUN_DIR.c.info"; fail "ibv_devinfo in a container of a"; }
grep -q 'hca_id:.*vrdma0' "$RUN_DIR.c.info" && grep -q PORT_ACTIVE "$RUN_DIR.c.info" ||
    { cat "$RUN_DIR.c.info"; fail "the container of a has no active vrdma0"; }
[ "$(grep -c 'hca_id:' "$RUN_DIR.c.info")" -eq 1 ] || fail "the container of a sees more than one device"
seen="$(in_container "$spec" a ls "$RUN_DIR" | tr '\n' ' ')"
echo "  the run directory in the container: $seen"
[ "$seen" = "a " ] || fail "the container of a sees '$seen' in the run directory, not only a"

note "a checked ping-pong between a container of a and one of b"
in_container "$spec" a ibv_rc_pingpong -d vrdma0 -g 0 -c -p 29615 -n 500 >"$RUN_DIR.c.server" 2>&1 &
server=$!
wait_port 29615
in_container "$spec" b ibv_rc_pingpong -d vrdma0 -g 0 -c -p 29615 -n 500 127.0.0.1 >"$RUN_DIR.c.client" 2>&1 ||
    { cat "$RUN_DIR.c.client"; fail "the ping-pong client in the container of b failed"; }
wait "$server" || { cat "$RUN_DIR.c.server"; fail "the ping-pong server in the container of a failed"; }
grep -m1 'bytes in' "$RUN_DIR.c.client" | sed 's/^/  /'

note "without the spec's device node there is no device"
/usr/bin/python3 -c "
import json
s = json.load(open('$spec'))
for d in s['devices']: d['containerEdits']['deviceNodes'] = []
json.dump(s, open('$spec.nonode', 'w'))
"
in_container "$spec.nonode" a ibv_devinfo >"$RUN_DIR.c.info" 2>&1 || true
grep -q PORT_ACTIVE "$RUN_DIR.c.info" && fail "a container without the device node still has vrdma0"
note "a real CDI runtime: podman (Debian's 4.3, with runc) runs a container with --device vrdma.dev/guest=a"
# crun, podman's default here, refuses this machine's hybrid cgroups; runc
# takes them. The container's root is made of local files (this machine's
# /usr and /etc, read-only binds), so no image and no registry are needed.
if command -v podman >/dev/null && command -v runc >/dev/null; then
    ctr="$RUN_DIR.rootfs"
    mkdir -p "$ctr"/{usr,etc,tmp,run,proc,sys,dev,var}
    for l in bin lib lib64 sbin; do [ -L "/$l" ] && ln -sfn "$(readlink "/$l")" "$ctr/$l"; done
    mount --bind -o ro /usr "$ctr/usr"
    mount --bind -o ro /etc "$ctr/etc"
    mkdir -p /var/run/cdi
    cdi_file="/var/run/cdi/vrdma-test-$$.json"
    cp "$spec" "$cdi_file"
    podman_run() {
        timeout 120 podman --log-level=error --runtime runc --cgroup-manager=cgroupfs run --rm --network=host \
            --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --device vrdma.dev/guest=a --rootfs "$ctr" "$@"
    }
    unmount_rootfs() { umount "$ctr/usr" "$ctr/etc" 2>/dev/null || true; rm -f "$cdi_file"; }
    trap 'rc=$?; unmount_rootfs; (exit $rc); stop_shim' EXIT
    podman_run ibv_devinfo >"$RUN_DIR.c.info" 2>&1 || true
    grep -q 'hca_id:.*vrdma0' "$RUN_DIR.c.info" && grep -q PORT_ACTIVE "$RUN_DIR.c.info" ||
        { cat "$RUN_DIR.c.info"; fail "ibv_devinfo in a podman container with the CDI device failed"; }
    echo "  ibv_devinfo in the container: vrdma0, PORT_ACTIVE"
    podman_run ibv_rc_pingpong -d vrdma0 -g 0 -c -p 29616 -n 200 >"$RUN_DIR.c.server" 2>&1 &
    server=$!
    wait_port 29616
    in_guest b ibv_rc_pingpong -d vrdma0 -g 0 -c -p 29616 -n 200 127.0.0.1 >"$RUN_DIR.c.client" 2>&1 ||
        { cat "$RUN_DIR.c.client" "$RUN_DIR.c.server"; fail "a ping-pong between the container and guest b failed"; }
    wait "$server" || { cat "$RUN_DIR.c.server"; fail "the ping-pong server in the container failed"; }
    echo "  container (guest a) <-> host process in guest b: $(grep -m1 'bytes in' "$RUN_DIR.c.client")"
    unmount_rootfs
    rm -rf "$ctr"
else
    echo "  (no podman or runc here: scripts/install-deps.sh installs them)"
fi
rm -f "$spec" "$spec.nonode" "$RUN_DIR".c.*
echo "cdi: ok"
