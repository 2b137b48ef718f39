"""A server that answers like `perfguard serve` and starts in milliseconds (standard
library only), for tests of what a server case does around its server: `python
tiny_http_server.py PORT PIDS_FILE` appends its pid to PIDS_FILE, then serves `/health`
and `/v1/images/generations` (a one-pixel PNG, a fixed stage time) until SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5E"
    "rkJggg=="
)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._send({"id": uuid.uuid4().hex, "data": [{"b64_json": PNG}],
                    "stage_durations": {"DenoisingStage": 1.0}})  # fmt: skip


def main() -> None:
    port, pids = int(sys.argv[1]), sys.argv[2]
    with open(pids, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    main()
