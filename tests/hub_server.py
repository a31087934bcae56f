"""A tiny stand-in for the Hugging Face Hub HTTP API on 127.0.0.1, for upload tests.

It speaks the four endpoints that ``HfApi.create_repo`` and ``HfApi.upload_folder`` use in
huggingface_hub 2.x (read from its ``hf_api.py`` / ``_commit_api.py``):

- ``POST /api/repos/create``                    -> ``{"url": ...}``
- ``POST /api/models/{repo}/preupload/{rev}``   -> every file ``"uploadMode": "regular"`` (no LFS/Xet)
- ``POST /api/validate-yaml``                   README.md front matter must parse as a YAML mapping
- ``POST /api/models/{repo}/commit/{rev}``      NDJSON: header, then ``{"key": "file", "value":
  {"path", "content" (base64), "encoding": "base64"}}`` lines -> ``{"commitUrl", "commitOid", ...}``

``GET /api/agent-harnesses`` (huggingface_hub's best-effort, unauthenticated agent-detection
fetch) answers 404 and is recorded in ``incidental``. Everything else answers 404 and is recorded
in ``unexpected``. Only loopback traffic.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


INCIDENTAL = {"/api/agent-harnesses"}


class FakeHub:
    def __init__(self, token: str):
        self.token = token
        self.repos: dict[str, dict] = {}
        self.commits: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.unexpected: list[tuple[str, str]] = []
        self.unauthorized: list[tuple[str, str]] = []
        self.validated_yaml: list[dict] = []
        self.incidental: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def _reply(self, status: int, payload: dict):
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_HEAD(self):
                self._handle("HEAD")

            def _handle(self, method: str):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                if path in INCIDENTAL:
                    hub.incidental.append((method, path))
                    return self._reply(404, {"error": "not served by FakeHub"})
                hub.requests.append((method, path))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    hub.unauthorized.append((method, path))
                    return self._reply(401, {"error": "Invalid credentials"})
                status, payload = hub.route(method, path, body, f"http://{self.headers['Host']}")
                self._reply(status, payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def route(self, method: str, path: str, body: bytes, base: str):
        parts = path.strip("/").split("/")
        if method == "POST" and path == "/api/repos/create":
            request = json.loads(body)
            repo_id = "/".join(p for p in (request.get("organization"), request["name"]) if p)
            self.repos.setdefault(repo_id, {"files": {}, "request": request})
            return 200, {"url": f"{base}/{repo_id}", "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()}
        if method == "POST" and path == "/api/validate-yaml":
            import yaml

            content = json.loads(body)["content"]
            try:
                assert content.startswith("---\n"), "no front matter"
                meta = yaml.safe_load(content[4 : content.index("\n---\n", 4)])
                assert isinstance(meta, dict), "front matter is not a mapping"
            except (AssertionError, ValueError, yaml.YAMLError) as error:
                return 400, {"errors": [{"message": str(error)}], "warnings": []}
            self.validated_yaml.append(meta)
            return 200, {"errors": [], "warnings": []}
        # /api/models/{ns}/{name}/{preupload|commit}/{revision}
        if method == "POST" and len(parts) == 6 and parts[:2] == ["api", "models"]:
            repo_id, action, revision = f"{parts[2]}/{parts[3]}", parts[4], parts[5]
            if repo_id not in self.repos:
                return 404, {"error": "Repository not found"}
            if action == "preupload":
                files = json.loads(body)["files"]
                return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
            if action == "commit":
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                header = next(line["value"] for line in lines if line["key"] == "header")
                files = {}
                for line in lines:
                    if line["key"] == "file":
                        assert line["value"]["encoding"] == "base64"
                        files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
                    elif line["key"] != "header":
                        self.unexpected.append(("commit-operation", line["key"]))
                self.repos[repo_id]["files"].update(files)
                oid = hashlib.sha1(json.dumps(sorted(files)).encode() + bytes(len(self.commits))).hexdigest()
                self.commits.append({"repo_id": repo_id, "revision": revision, "header": header, "files": files})
                return 200, {"commitUrl": f"{base}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
        self.unexpected.append((method, path))
        return 404, {"error": f"FakeHub does not implement {method} {path}"}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
