"""The listening sockets, kept by the supervisor for the server's whole life, and which
of them get new connections (SO_REUSEPORT, steered by a BPF program)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable

from webhook.serving import logs
from webhook.serving.options import BACKLOG, ServeOptions

log = logging.getLogger(logs.SERVER_LOGGER)


def reuse_port(options: ServeOptions) -> bool:
    """Whether each worker listens on a socket of its own, bound with SO_REUSEPORT.

    With one shared listening socket, the workers race to accept, and a batch of new
    connections tends to go to whichever worker wakes first (the API server keeps its
    connections, so such a split lasts). With a socket per worker the kernel spreads
    connections over the workers by their addresses.
    """
    return options.reuse_port and hasattr(socket, "SO_REUSEPORT")


class Listeners:
    """The listening sockets, and which of them get new connections.

    Two *bands* of sockets, all bound to the port with SO_REUSEPORT and kept open here for
    the server's whole life: one per worker slot in each band (or one per band, shared by
    the slots, with ``--no-reuse-port``). The workers of a generation accept from one
    band, and a small classic BPF program on the sockets (``SO_ATTACH_REUSEPORT_CBPF``)
    makes the kernel hand new connections only to that band's sockets, spread at random
    over its slots. When a new generation is ready, the program is switched to the other
    band: from then on the old workers get no new connection, so by the time they stop
    none of them is half-way through a TLS handshake, and their queues are empty.

    Where the program cannot be attached (not Linux), there is one band, shared by the
    generations; a connection the old worker had just accepted when it stopped (at most
    its handshakes in progress at that moment) then fails.
    """

    def __init__(self, options: ServeOptions):
        self.options = options
        self.per_slot = reuse_port(options)
        width = options.workers if self.per_slot else 1
        self.bands: list[list[socket.socket]] = [self._band(width)]
        self.steered = False
        if hasattr(socket, "SO_REUSEPORT"):
            self.bands.append(self._band(width))
            try:
                _steer(self.bands[0][0], 0, width)
                self.steered = True
            except OSError as err:
                log.info(
                    "connections cannot be steered to one generation of workers; a "
                    "new generation shares the old one's sockets",
                    extra={"error": str(err)},
                )
                for sock in self.bands.pop():
                    sock.close()

    def _band(self, width: int) -> list[socket.socket]:
        options = self.options
        family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
        band = []
        for _ in range(width):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.bind((options.host, options.port))
            except OSError as err:
                sock.close()
                raise OSError(
                    f"cannot listen on {options.host}:{options.port}: {err.strerror}"
                ) from None
            sock.listen(BACKLOG)  # (listening order is the kernel's index of the socket)
            band.append(sock)
        return band

    def _band_of(self, generation: int) -> list[socket.socket]:
        return self.bands[(generation - 1) % len(self.bands)]

    def socket_for(self, generation: int, slot: int) -> socket.socket:
        band = self._band_of(generation)
        return band[slot] if self.per_slot else band[0]

    def free_for(self, generation: int, running: Iterable[int]) -> bool:
        """Whether ``generation`` may start: no worker of an older generation (``running``:
        the generation of each worker still running) is still on the sockets it would use
        (two generations back, and still stopping)."""
        if not self.steered:
            return True  # one band: generations share it (see the class docstring)
        band = self._band_of(generation)
        return not any(self._band_of(older) is band and older < generation for older in running)

    def route_to(self, generation: int) -> None:
        """New connections go to ``generation``'s sockets from now on."""
        if self.steered:
            band = (generation - 1) % len(self.bands)
            width = len(self.bands[0])
            _steer(self.bands[0][0], band * width, width)

    def close(self) -> None:
        for band in self.bands:
            for sock in band:
                sock.close()


#: ``SO_ATTACH_REUSEPORT_CBPF`` (Linux 4.5+), and the classic BPF opcodes used below.
_SO_ATTACH_REUSEPORT_CBPF = 51
_LD_W_ABS, _ALU_MOD_K, _ALU_ADD_K, _RET_A = 0x20, 0x94, 0x04, 0x16
_SKF_AD_RANDOM = 0xFFFFF000 + 56  # the ancillary "random" word


def _steer(sock: socket.socket, first: int, count: int) -> None:
    """Make the kernel hand each new connection of ``sock``'s reuseport group to the
    socket at index ``first + random % count`` (indices in listening order)."""
    import ctypes

    class Instruction(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_uint16),
            ("jt", ctypes.c_uint8),
            ("jf", ctypes.c_uint8),
            ("k", ctypes.c_uint32),
        ]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    code = (Instruction * 4)(
        Instruction(_LD_W_ABS, 0, 0, _SKF_AD_RANDOM),
        Instruction(_ALU_MOD_K, 0, 0, count),
        Instruction(_ALU_ADD_K, 0, 0, first),
        Instruction(_RET_A, 0, 0, 0),
    )
    program = Program(len(code), code)
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_REUSEPORT_CBPF, bytes(program))


def check_port_free(host: str, port: int) -> None:
    """Fail the start clearly when the port is taken. Workers' sockets are bound with
    SO_REUSEPORT, which would share a port another such server holds: bind once without
    it first, so a second server on the same port refuses to start instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise OSError(f"cannot listen on {host}:{port}: {err.strerror}") from None
