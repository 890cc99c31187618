"""The raw-socket baseline's server: ``python benchmarks/echo_server.py`` prints its port.

Each message is ``struct "<QQ" (n_in, n_out)`` followed by ``n_in`` bytes; the answer is
``n_out`` bytes taken from what was received. Like a corral worker, it reads the whole
message before answering, one thread per connection, and it exits when its parent (the
benchmark) is gone. Only the standard library, so it starts as fast as Python can.
"""

import os
import socket
import struct
import threading
import time

HEADER = struct.Struct("<QQ")


def serve(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(1 << 16)
    view = memoryview(buf)
    try:
        while True:
            got = conn.recv_into(view)
            if not got:
                return
            while got < HEADER.size:
                n = conn.recv_into(view[got:])
                if not n:
                    return
                got += n
            n_in, n_out = HEADER.unpack_from(buf)
            total = HEADER.size + n_in
            need = max(total, HEADER.size + n_out)
            if len(buf) < need:  # grows once to the largest message, then reused
                bigger = bytearray(need)
                bigger[:got] = view[:got]
                view.release()
                buf, view = bigger, memoryview(bigger)
            while got < total:
                n = conn.recv_into(view[got:total], min(total - got, 1 << 24))
                if not n:
                    return
                got += n
            conn.sendall(view[HEADER.size : HEADER.size + n_out])
    except OSError:
        pass
    finally:
        conn.close()


def watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main() -> None:
    server = socket.create_server(("127.0.0.1", 0), backlog=128)
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    print(server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
