"""A Hugging Face Hub on 127.0.0.1 for tests, speaking the Hub's own protocol to huggingface_hub's client, and an HTTP
proxy that reaches it under a host name no one else resolves.

`FakeHub` serves repositories from folders, as huggingface_hub downloads them: the model or dataset info
(`/api/models/{repo}`, `/api/datasets/{repo}`, with `/revision/{rev}`), and each file at
`/{repo}/resolve/{revision}/{filename}` (`/datasets/{repo}/...` for a dataset), HEAD and GET, with the `ETag`,
`X-Repo-Commit` and `Content-Length` headers that `huggingface_hub.file_download` reads. What is not there is
answered as the Hub answers it (404 with `X-Error-Code: RepoNotFound`, `EntryNotFound` or `RevisionNotFound`), which
huggingface_hub turns into its own errors. It also takes uploads (`create_repo`, a model card's YAML check, and
`create_commit` with every file sent inline, as `push_to_hub` and `upload_folder` send them), which it serves from
then on. Every request is recorded.

    with FakeHub({"someone/tiny": folder}) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": ...}  # a fresh process: huggingface_hub reads them once

`ForwardingProxy` is a plain HTTP proxy (absolute-form requests, as clients send them for http:// URLs) that
connects the host names it is given to 127.0.0.1: `HF_ENDPOINT=http://hub.invalid:PORT` with `HTTP_PROXY` pointing
at it reaches the hub only through the proxy.

`silent_endpoint` is one that accepts connections and never answers.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import re
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

REPO = r"(?P<repo>[^/]+/[^/]+)"
RESOLVE = re.compile(rf"^/(?P<datasets>datasets/)?{REPO}/resolve/(?P<revision>[^/]+)/(?P<filename>.+)$")
INFO = re.compile(rf"^/api/(?P<kind>models|datasets)/{REPO}(?:/revision/(?P<revision>[^/]+))?$")
PREUPLOAD = re.compile(rf"^/api/(?P<kind>models|datasets)/{REPO}/preupload/(?P<revision>[^/]+)$")
COMMIT = re.compile(rf"^/api/(?P<kind>models|datasets)/{REPO}/commit/(?P<revision>[^/]+)$")
KINDS = {"models": "model", "datasets": "dataset"}


@dataclass
class Repo:
    """One repository: its files (name -> bytes) at one commit, which names them all."""

    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + hashlib.sha1(self.files[name]).digest())
        return digest.hexdigest()


def folder_files(folder: str | Path) -> dict[str, bytes]:
    """Every file under `folder`, by its path relative to it."""
    root = Path(folder)
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


class FakeHub:
    """The Hub on 127.0.0.1 (a thread of this process); `repos` maps repo ids to folders, `datasets` likewise."""

    def __init__(self, repos: Mapping[str, str | Path] = (), datasets: Mapping[str, str | Path] = ()) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        for kind, given in (("model", dict(repos)), ("dataset", dict(datasets))):
            for repo_id, folder in given.items():
                self.repos[kind, repo_id] = Repo(folder_files(folder))
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Host header)
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def paths(self, method: str | None = None) -> list[str]:
        """The paths of the requests about a repository so far (with `method` only): its info, files and uploads, not
        what huggingface_hub asks of the Hub for itself (such as its agent registry)."""
        with self.lock:
            requests = [(verb, path) for verb, path, _ in self.requests if method in (None, verb)]
        return [
            path for _, path in requests if any(pattern.match(path) for pattern in (RESOLVE, INFO, PREUPLOAD, COMMIT))
        ]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args) -> None:  # quiet: the test reads `hub.requests`
                pass

            def reply(self, status: int, body: bytes = b"", headers: Mapping[str, str] = (), head: bool = False):
                self.send_response(status)
                for key, value in dict(headers).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def error(self, status: int, code: str | None, message: str, head: bool = False) -> None:
                headers = {"Content-Type": "application/json", **({"X-Error-Code": code} if code else {})}
                self.reply(
                    status, json.dumps({"error": message}).encode(), {**headers, "X-Error-Message": message}, head
                )

            def find(self, kind: str, repo_id: str, revision: str | None, head: bool = False) -> Repo | None:
                repo = hub.repos.get((kind, repo_id))
                if repo is None:
                    self.error(404, "RepoNotFound", "Repository not found", head)
                elif revision not in (None, "main", repo.commit):
                    self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                    return None
                return repo

            def serve(self, head: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                with hub.lock:
                    hub.requests.append((self.command, path, self.headers.get("Host", "")))
                if match := RESOLVE.match(path):
                    kind = "dataset" if match["datasets"] else "model"
                    repo = self.find(kind, match["repo"], match["revision"], head)
                    if repo is None:
                        return
                    data = repo.files.get(match["filename"])
                    if data is None:
                        self.error(404, "EntryNotFound", f"{match['filename']} does not exist", head)
                        return
                    headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": repo.commit}
                    self.reply(200, data, {**headers, "Content-Type": "application/octet-stream"}, head)
                elif (match := INFO.match(path)) and self.command == "GET":
                    repo = self.find(KINDS[match["kind"]], match["repo"], match["revision"])
                    if repo is not None:
                        info = {"id": match["repo"], "sha": repo.commit, "private": False, "tags": [],
                                "siblings": [{"rfilename": name} for name in sorted(repo.files)]}  # fmt: skip
                        self.reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                else:
                    self.error(404, None, f"no such page: {path}", head)

            def do_HEAD(self) -> None:
                self.serve(head=True)

            def do_GET(self) -> None:
                self.serve(head=False)

            def do_POST(self) -> None:
                path = unquote(urlsplit(self.path).path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hub.lock:
                    hub.requests.append(("POST", path, self.headers.get("Host", "")))
                if path == "/api/repos/create":
                    request = json.loads(body)
                    repo_id = "/".join(filter(None, (request.get("organization"), request["name"])))
                    kind = request.get("type") or "model"
                    created = (kind, repo_id) not in hub.repos
                    hub.repos.setdefault((kind, repo_id), Repo())
                    answer = {"url": f"{hub.endpoint}/{repo_id}", "name": repo_id}
                    if not created:  # as the Hub says it, with the repo's url
                        answer["error"] = "You already created this model repo"
                    self.reply(
                        200 if created else 409, json.dumps(answer).encode(), {"Content-Type": "application/json"}
                    )
                elif path == "/api/validate-yaml":  # a model card's metadata: a YAML mapping, or the Hub's 400
                    content = json.loads(body)["content"]
                    try:
                        header = yaml.safe_load(content.split("---")[1]) if content.startswith("---") else {}
                        problem = None if isinstance(header, dict) else "the metadata is not a mapping"
                    except yaml.YAMLError as error:
                        problem = str(error)
                    errors = [{"message": problem}] if problem else []
                    self.reply(400 if problem else 200, json.dumps({"errors": errors, "warnings": []}).encode())
                elif match := PREUPLOAD.match(path):  # every file sent inline, as git stores small files
                    files = json.loads(body)["files"]
                    modes = [{"path": file["path"], "uploadMode": "regular", "shouldIgnore": False} for file in files]
                    self.reply(200, json.dumps({"files": modes, "commitOid": None}).encode())
                elif match := COMMIT.match(path):
                    repo = self.find(KINDS[match["kind"]], match["repo"], None)
                    if repo is None:
                        return
                    for line in filter(None, body.decode().splitlines()):
                        entry = json.loads(line)
                        if entry["key"] == "file":
                            repo.files[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
                        elif entry["key"] == "deletedFile":
                            repo.files.pop(entry["value"]["path"], None)
                        elif entry["key"] != "header":
                            self.error(400, None, f"this fake Hub takes files sent inline, not {entry['key']!r}")
                            return
                    url = f"{hub.endpoint}/{match['repo']}/commit/{repo.commit}"
                    self.reply(200, json.dumps({"commitUrl": url, "commitOid": repo.commit}).encode())
                else:
                    self.error(404, None, f"no such page: {path}")

        return Handler


class ForwardingProxy:
    """An HTTP proxy on 127.0.0.1 that forwards requests for the host names in `hosts` to 127.0.0.1 (the port as
    requested) and refuses any other; `forwarded` records (method, host, path) of each."""

    def __init__(self, hosts: set[str] | frozenset[str]) -> None:
        self.hosts = set(hosts)
        self.forwarded: list[tuple[str, str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ForwardingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args) -> None:
                pass

            def forward(self) -> None:
                target = urlsplit(self.path)  # absolute form: http://host:port/path?query
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if target.scheme != "http" or target.hostname not in proxy.hosts:
                    message = f"this proxy does not reach {target.hostname}".encode()
                    self.send_response(502)
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                proxy.forwarded.append((self.command, target.hostname, target.path))
                hop_by_hop = {"proxy-connection", "connection", "keep-alive", "proxy-authorization"}
                headers = {key: value for key, value in self.headers.items() if key.lower() not in hop_by_hop}
                upstream = http.client.HTTPConnection("127.0.0.1", target.port or 80, timeout=30)
                try:
                    path = target.path + (f"?{target.query}" if target.query else "")
                    upstream.request(self.command, path, body=body or None, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                finally:
                    upstream.close()
                self.send_response(response.status)
                for key, value in response.getheaders():  # a HEAD's Content-Length is the length of its GET
                    if key.lower() not in hop_by_hop | {"transfer-encoding"}:
                        self.send_header(key, value)
                if response.getheader("Content-Length") is None:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_POST = forward

        return Handler


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """An endpoint (http://127.0.0.1:PORT) whose connections are accepted by the kernel and never answered, as a
    network that drops packets leaves a client waiting."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def closed_endpoint() -> str:
    """An endpoint on 127.0.0.1 where nothing listens: a connection is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def hub_environment(endpoint: str, home: str | Path, proxy: str | None = None, **more: str) -> dict[str, str]:
    """os.environ for a fresh process that reaches the Hub at `endpoint` only (through the HTTP `proxy` when given),
    online, with its own empty cache under `home`: no proxy setting of this environment is kept, and 127.0.0.1 is
    reached without one."""
    kept = {key: value for key, value in os.environ.items() if "proxy" not in key.lower()}
    hub = {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(Path(home) / "hub"),
        "HF_HUB_OFFLINE": "0",
    }
    proxies = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    proxies |= {"HTTP_PROXY": proxy, "http_proxy": proxy} if proxy else {}
    return {**kept, **hub, **proxies, **more}
