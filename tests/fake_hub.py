"""A loopback server that speaks the Hugging Face Hub's download protocol, for hermetic tests.

The real ``huggingface_hub`` client is pointed at it with ``HF_ENDPOINT``. It serves files of
in-memory repositories, answers the Hub's error codes (missing repo or file, gated repo), honours
``Range`` (resumed downloads, reading a GGUF's header alone), and can cut or stall a download to
imitate a bad network.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    commit: str = field(default_factory=lambda: secrets.token_hex(20))


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    def __init__(self, token: str = "hf_test_token") -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.token = token
        self.cut_gets = 0  # this many file GETs send only `cut_after` bytes, then drop
        self.cut_after = 0
        self.stall = threading.Event()  # while set, a file GET stalls after `cut_after` bytes
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # A short poll: shutting the server down waits for one.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo_id: str, files: dict[str, bytes], gated: bool = False) -> Repo:
        self.repos[repo_id] = Repo(files, gated)
        return self.repos[repo_id]

    def file_gets(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + name)]

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stall.clear()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _error(self, status: int, code: str | None = None) -> None:
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                    self.send_header("X-Error-Message", code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _json(self, payload: object) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self, body: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(
                    Request(
                        self.command,
                        path,
                        self.headers.get("Range"),
                        self.headers.get("Authorization"),
                    )
                )
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo = hub.repos.get("/".join(parts[2:4]))
                    if repo is None:
                        return self._error(404, "RepoNotFound")
                    if not self._allowed(repo):
                        return self._error(401, "GatedRepo")
                    if len(parts) > 4 and parts[4] == "tree":
                        return self._json(
                            [
                                {
                                    "type": "file",
                                    "path": n,
                                    "size": len(d),
                                    "oid": hashlib.sha1(d).hexdigest(),
                                }
                                for n, d in sorted(repo.files.items())
                            ]
                        )
                    return self._json(
                        {
                            "id": "/".join(parts[2:4]),
                            "sha": repo.commit,
                            "siblings": [{"rfilename": n} for n in repo.files],
                        }
                    )
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo = hub.repos.get("/".join(parts[:2]))
                    if repo is None:
                        return self._error(404, "RepoNotFound")
                    if not self._allowed(repo):
                        return self._error(401, "GatedRepo")
                    name = "/".join(parts[4:])
                    if name not in repo.files:
                        return self._error(404, "EntryNotFound")
                    return self._file(repo, repo.files[name], body)
                return self._error(404)

            def _allowed(self, repo: Repo) -> bool:
                return not repo.gated or self.headers.get("Authorization") == f"Bearer {hub.token}"

            def _file(self, repo: Repo, data: bytes, body: bool) -> None:
                start, end = 0, len(data) - 1
                header = self.headers.get("Range")
                ranged = bool(body and header and header.startswith("bytes="))
                if ranged:
                    first, _, last = header[6:].partition("-")
                    start = int(first)
                    end = min(int(last), end) if last else end
                self.send_response(206 if ranged else 200)
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(end + 1 - start))
                if ranged:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                payload = data[start : end + 1]
                if hub.stall.is_set():
                    self.wfile.write(payload[: hub.cut_after])
                    self.wfile.flush()
                    while hub.stall.is_set():
                        time.sleep(0.05)
                    self.close_connection = True
                    return
                if hub.cut_gets > 0:
                    hub.cut_gets -= 1
                    self.wfile.write(payload[: hub.cut_after])
                    self.wfile.flush()
                    time.sleep(0.5)  # let the client drain what was sent before the cut
                    self.close_connection = True
                    return
                self.wfile.write(payload)

        return Handler
