#!/usr/bin/env python3
"""Attackers without the fabric key, for test/integration/fabric/attacks.sh.

  fabric_relay.py pair LISTEN
      Accepts connections and joins them two by two (the first with the
      second, ...), forwarding every byte both ways unchanged: two shims that
      both dial this address are each relayed to the other (the relay attack
      of issue 24: both ends hear a peer that knows the key).
  fabric_relay.py forward LISTEN TARGET [--record FILE] [--flip-at N]
      Forwards each accepted connection to TARGET. --record: the first
      connection's bytes from its dialer are written to FILE (the first
      64 KiB). --flip-at: byte N of the first connection's dialer-to-target
      stream is changed (one bit) on the way.
  fabric_relay.py replay TARGET FILE
      Opens a connection to TARGET, writes FILE's bytes, and prints what the
      target answered (bytes) before it closed the connection.
  fabric_relay.py flood TARGET SECONDS [CONNECTIONS]
      Holds CONNECTIONS (default 64) connections to TARGET open for SECONDS,
      opening a new one whenever one is closed; none sends anything (each
      holds a pending handshake until the target gives up on it). Prints how many it opened and how many were closed.

ADDR:PORT everywhere. Logs one line per event on stdout.
"""
import selectors
import socket
import sys
import time


def endpoint(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


def listener(text):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(endpoint(text))
    s.listen(64)
    return s


def log(*words):
    print(*words, flush=True)


class Pump:
    """Forwards between pairs of sockets until both sides closed."""

    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.peer = {}
        self.hooks = {}  # socket -> function(bytes, offset) -> bytes, for what it reads
        self.offset = {}

    def join(self, a, b, hook_a=None):
        for s, o in ((a, b), (b, a)):
            s.setblocking(True)
            self.peer[s] = o
            self.offset[s] = 0
            self.sel.register(s, selectors.EVENT_READ)
        if hook_a:
            self.hooks[a] = hook_a

    def drop(self, s):
        try:
            self.sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()

    def step(self, timeout):
        for key, _ in self.sel.select(timeout):
            s = key.fileobj
            o = self.peer.get(s)
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.drop(s)
                if o is not None:
                    try:
                        o.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                continue
            if s in self.hooks:
                data = self.hooks[s](data, self.offset[s])
            self.offset[s] += len(data)
            try:
                o.sendall(data)
            except OSError:
                self.drop(s)


def pair(listen):
    lst = listener(listen)
    pump = Pump()
    pump.sel.register(lst, selectors.EVENT_READ)
    waiting = None
    while True:
        for key, _ in pump.sel.select(0.5):
            if key.fileobj is not lst:
                continue
            c, addr = lst.accept()
            log("pair: connection from %s:%d" % addr)
            if waiting is None:
                waiting = c
            else:
                log("pair: joined two connections")
                pump.join(waiting, c)
                waiting = None
        pump.step(0)


def forward(listen, target, record=None, flip_at=None):
    lst = listener(listen)
    pump = Pump()
    pump.sel.register(lst, selectors.EVENT_READ)
    first = True
    recorded = bytearray()
    while True:
        for key, _ in pump.sel.select(0.2):
            if key.fileobj is not lst:
                continue
            c, addr = lst.accept()
            t = socket.create_connection(endpoint(target))
            log("forward: connection from %s:%d" % addr)
            hook = None
            if first:
                def hook(data, off):
                    if record is not None and len(recorded) < 65536:
                        recorded.extend(data[: 65536 - len(recorded)])
                        with open(record, "wb") as f:
                            f.write(recorded)
                    if flip_at is not None and off <= flip_at < off + len(data):
                        data = bytearray(data)
                        data[flip_at - off] ^= 0x10
                        log("forward: changed byte %d" % flip_at)
                        data = bytes(data)
                    return data
                first = False
            pump.join(c, t, hook)
        pump.step(0)


def replay(target, path):
    with open(path, "rb") as f:
        data = f.read()
    s = socket.create_connection(endpoint(target))
    s.settimeout(5)
    try:
        s.sendall(data)
    except OSError:
        pass
    got = 0
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += len(b)
    except OSError:
        pass
    log("replay: wrote %d bytes, the target answered %d bytes and closed" % (len(data), got))


def flood(target, seconds, count):
    sel = selectors.DefaultSelector()
    opened = closed = 0
    end = time.monotonic() + seconds
    live = set()
    while time.monotonic() < end:
        while len(live) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(endpoint(target))
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                break
            sel.register(s, selectors.EVENT_READ)
            live.add(s)
            opened += 1
        for key, _ in sel.select(0.05):
            s = key.fileobj
            try:
                b = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                b = b""
            if not b:
                sel.unregister(s)
                s.close()
                live.discard(s)
                closed += 1
    log("flood: opened %d connections, %d were closed by the target" % (opened, closed))


def main(argv):
    if len(argv) >= 2 and argv[0] == "pair":
        pair(argv[1])
    elif len(argv) >= 3 and argv[0] == "forward":
        record = flip = None
        rest = argv[3:]
        while rest:
            if rest[0] == "--record":
                record = rest[1]
            elif rest[0] == "--flip-at":
                flip = int(rest[1])
            else:
                raise SystemExit("unknown option " + rest[0])
            rest = rest[2:]
        forward(argv[1], argv[2], record, flip)
    elif len(argv) == 3 and argv[0] == "replay":
        replay(argv[1], argv[2])
    elif len(argv) >= 3 and argv[0] == "flood":
        flood(argv[1], float(argv[2]), int(argv[3]) if len(argv) > 3 else 64)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
