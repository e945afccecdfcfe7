"""A zygote: this process forked before it imports an engine, which becomes the rank pools'
fork server when the first pool starts.

multiprocessing's fork server is a new interpreter that imports torch and the engine again
(vLLM: about 7.7 s of CPU per command, 6 of them torch and the engine's other dependencies).
Forked once those dependencies are imported here, and before the engine is, the zygote starts
with them loaded and nothing of the engine (no module state, no probe's cache, no FlashInfer
release bound at import): what it then imports as the fork server is what an exec'd fork
server would import, and with the environment, directory and ``sys.path`` this process has
when the first pool starts (a source or release chosen after the fork included).

Used once: a fork server that dies is started again the stdlib's way. Where this process runs
threads (a fork may copy a lock some thread holds) there is no zygote, and the fork server
starts the stdlib's way too. A zygote never used exits when this process does (its end of the
socket closes); it never runs this process's exit handlers.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import signal
import socket
import struct
import sys
import threading
from multiprocessing import connection, forkserver, resource_tracker, spawn, util
from typing import Iterable, Optional

_waiting: Optional[tuple[int, socket.socket]] = None  # (its pid, this process's end of its socket)
_LENGTH = struct.Struct("!Q")
ENV = "A2A_ZYGOTE"  # "0": the fork server starts the stdlib's way


def start(imports: Iterable[str]) -> bool:
    """Import ``imports`` (those this host lacks skipped), then fork the zygote; the next
    rank pool to start a worker makes it its fork server. Returns whether one is waiting
    (False where this process runs threads, or ``A2A_ZYGOTE=0``)."""
    global _waiting
    if _waiting is not None:
        return True
    if os.environ.get(ENV) == "0":
        return False
    for module in imports:
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    if threading.active_count() > 1:
        return False
    for stream in (sys.stdout, sys.stderr):  # else a fork's exit would write this process's buffers again
        stream.flush()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the zygote: nothing of this process's but its modules may run here
        try:
            ours.close()
            _become_fork_server(theirs)
        finally:
            os._exit(0)
    theirs.close()
    _waiting = (pid, ours)
    forkserver._forkserver.ensure_running = _ensure_running
    return True


def _ensure_running() -> None:
    """:meth:`multiprocessing.forkserver.ForkServer.ensure_running`, the zygote made the fork
    server where one waits and none runs yet: the same listener, "alive" pipe and preload."""
    global _waiting
    server = forkserver._forkserver
    with server._lock:
        waiting, _waiting = _waiting, None
        server.__dict__.pop("ensure_running", None)  # the stdlib's from now on
        if waiting is not None and server._forkserver_pid is None and not os.waitpid(waiting[0], os.WNOHANG)[0]:
            _hand_over(server, *waiting)
            return
        if waiting is not None:
            waiting[1].close()
    server.ensure_running()


def _hand_over(server, pid: int, ours: socket.socket) -> None:
    """Make the zygote ``pid`` ``server``'s fork server: the listener and "alive" pipe the
    stdlib's would get, its preload, and this process's environment, directory and path."""
    resource_tracker.ensure_running()
    data = {key: value for key, value in spawn.get_preparation_data("ignore").items()
            if key in ("main_path", "sys_path")}
    request = pickle.dumps({"preload": server._preload_modules, "data": data, "env": dict(os.environ),
                            "cwd": os.getcwd()})
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        try:
            socket.send_fds(ours, [_LENGTH.pack(len(request))], [listener.fileno(), alive_r])
            ours.sendall(request)
        except OSError:
            os.close(alive_w)
            raise
        finally:
            os.close(alive_r)
            ours.close()
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


def _become_fork_server(sock: socket.socket) -> None:
    """Wait for the request (or this process's parent to end), then run the stdlib's fork
    server in this process as an exec'd one would run."""
    for sig in signal.valid_signals():  # the parent's handlers are its own; a fresh interpreter has none
        try:
            if callable(signal.getsignal(sig)) and sig != signal.SIGINT:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            continue
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if faulthandler.is_enabled():
        faulthandler.disable()
    try:
        header, fds, _, _ = socket.recv_fds(sock, _LENGTH.size, 2)
    except OSError:
        return
    if len(header) < _LENGTH.size or len(fds) != 2:
        return
    (size,) = _LENGTH.unpack(header)
    chunks = []
    while size > 0:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            return
        chunks.append(chunk)
        size -= len(chunk)
    sock.close()
    request = pickle.loads(b"".join(chunks))
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["data"].get("sys_path") is not None:
        sys.path[:] = request["data"]["sys_path"]
    forkserver.main(fds[0], fds[1], request["preload"], **request["data"])
