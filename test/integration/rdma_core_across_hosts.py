#!/usr/bin/env python3
"""Makes a copy of rdma-core's test suite (v44) run its tests across hosts.

The suite puts both players of a test (client and server) on the one
device it is given, and each player addresses the other by its own port's
LID and GID, so its traffic never leaves a device. For the run across the
TCP fabric (rdma_core_tests.sh in the two-hosts topology), this patches the
copy's tests/base.py and tests/utils.py so that, when VRDMA_SUITE_DEVICES
names two devices ("vrdma0,vrdma1": guests on two hosts):
  - the players of a test open the two devices in turn (BaseResources'
    create_context; the turn starts anew with each test), and
  - a player's address vector names the other device's LID and GID (RC,
    UC, XRC and UD: the three places the suite builds one).
Tests that open a context themselves (the API tests) stay on the device
given with --dev.

Each edit must find exactly what it replaces, so a suite of another version
fails here rather than running unpatched.

Usage: rdma_core_across_hosts.py SUITE_DIR
"""
import pathlib
import sys

suite = pathlib.Path(sys.argv[1])

HELPER = '''
# --- vrdma (rdma_core_across_hosts.py): the two players of a test on two
# devices, guests of two hosts.
import os as _vrdma_os
_VRDMA_DEVS = [d for d in _vrdma_os.environ.get('VRDMA_SUITE_DEVICES', '').split(',') if d]
_vrdma_turn = [0]
_vrdma_peer = {}


def _vrdma_device(name):
    """The device of the next player of the current test."""
    if len(_VRDMA_DEVS) != 2 or name not in _VRDMA_DEVS:
        return name
    d = _VRDMA_DEVS[_vrdma_turn[0] % 2]
    _vrdma_turn[0] += 1
    return d


def _vrdma_other(res, port, gid_index):
    """The LID and GID of the device the other player of `res` opened."""
    if len(_VRDMA_DEVS) != 2:
        return res.port_attr.lid, res.ctx.query_gid(port, gid_index)
    own = res.ctx.query_device().node_guid
    key = (own, port, gid_index)
    if key not in _vrdma_peer:
        from pyverbs.device import Context as _Context
        for d in _VRDMA_DEVS:
            with _Context(name=d) as c:
                if c.query_device().node_guid != own:
                    _vrdma_peer[key] = (c.query_port(port).lid, c.query_gid(port, gid_index))
    return _vrdma_peer[key]
# --- end vrdma
'''


def patch(path, edits, helper=False):
    p = suite / path
    s = p.read_text()
    for old, new in edits:
        n = s.count(old)
        if n != 1:
            sys.exit(f'rdma_core_across_hosts.py: {path}: expected once, found {n} times: {old!r}')
        s = s.replace(old, new)
    if helper:
        i = s.index('\nclass ')  # after the imports
        s = s[:i] + HELPER + s[i:]
    p.write_text(s)


patch('base.py', [
    ('        self.ctx = Context(name=self.dev_name)\n',
     '        self.ctx = Context(name=_vrdma_device(self.dev_name))\n'),
    ('''        If not provided by the user, the first valid combination will be used.
        """
''', '''        If not provided by the user, the first valid combination will be used.
        """
        _vrdma_turn[0] = 0
'''),
    ('''        gr = GlobalRoute(dgid=self.ctx.query_gid(self.ib_port, self.gid_index),
                         sgid_index=self.gid_index)
        ah_attr = AHAttr(port_num=self.ib_port, is_global=1, gr=gr,
                         dlid=self.port_attr.lid)''',
     '''        _lid, _gid = _vrdma_other(self, self.ib_port, self.gid_index)
        gr = GlobalRoute(dgid=_gid, sgid_index=self.gid_index)
        ah_attr = AHAttr(port_num=self.ib_port, is_global=1, gr=gr,
                         dlid=_lid)'''),
    ('''        gid = self.ctx.query_gid(self.ib_port, self.gid_index)
        gr = GlobalRoute(dgid=gid, sgid_index=self.gid_index)
        ah_attr = AHAttr(port_num=self.ib_port, is_global=True,
                         gr=gr, dlid=self.port_attr.lid)''',
     '''        _lid, gid = _vrdma_other(self, self.ib_port, self.gid_index)
        gr = GlobalRoute(dgid=gid, sgid_index=self.gid_index)
        ah_attr = AHAttr(port_num=self.ib_port, is_global=True,
                         gr=gr, dlid=_lid)'''),
], helper=True)

patch('utils.py', [
    ('''    gr = GlobalRoute(dgid=agr_obj.ctx.query_gid(port, gid_index),
                     sgid_index=gid_index)
    ah_attr = AHAttr(port_num=port, is_global=1, gr=gr,
                     dlid=agr_obj.port_attr.lid)''',
     '''    from tests.base import _vrdma_other
    _lid, _gid = _vrdma_other(agr_obj, port, gid_index)
    gr = GlobalRoute(dgid=_gid, sgid_index=gid_index)
    ah_attr = AHAttr(port_num=port, is_global=1, gr=gr,
                     dlid=_lid)'''),
])
