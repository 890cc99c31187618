"""A foreign server for tests: a module written to AReaL's worker command contract that
serves its own small HTTP API (as AReaL's proxy rollout server does) and never registers
with corral. ``GET /health`` answers 200 once it serves; ``GET /args`` answers the
arguments it was started with; it prints one line when it serves (for log capture) and
exits on SIGTERM. ``FOREIGN_SERVER_DELAY`` (seconds) delays serving; the replica whose
``--worker-index`` is ``FOREIGN_SERVER_STALL_INDEX`` never serves (a fork that times out).

    python -m corral.testing.foreign_server --port P --experiment-name E --trial-name T \\
        --role R --worker-index I [--host H] [--name-resolve-type K ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse(argv: list[str]) -> argparse.Namespace:
    """AReaL's arguments; those AReaL always passes are required, as in its servers."""
    parser = argparse.ArgumentParser(prog="foreign_server")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--experiment-name", required=True)
    parser.add_argument("--trial-name", required=True)
    parser.add_argument("--role", required=True)
    parser.add_argument("--worker-index", type=int, required=True)
    for name in ("--name-resolve-type", "--nfs-record-root", "--etcd3-addr", "--fileroot"):
        parser.add_argument(name, default="")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    time.sleep(float(os.environ.get("FOREIGN_SERVER_DELAY", "0")))
    if os.environ.get("FOREIGN_SERVER_STALL_INDEX") == str(args.worker_index):
        print(f"foreign server {args.role}/{args.worker_index} stalls", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)
    seen = json.dumps(vars(args)).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {"/health": b'{"status": "ok"}', "/args": seen}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"foreign server {args.role}/{args.worker_index} serving on {args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
