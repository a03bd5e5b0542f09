"""Loopback servers for remote-shard tests and benchmarks.

Every server binds 127.0.0.1 only, on a free port, runs on daemon threads (or as a child
process), puts timeouts on its sockets and stops promptly in ``__exit__``/``close()``:

- ``RangeHTTPServer``: a threaded static file server with byte ranges, ETag and If-Match (over
  TLS with ``tls=self_signed_cert(folder)``);
- ``NginxServer``: Debian's nginx-light serving a folder (needs ``/usr/sbin/nginx``);
- ``FaultProxy``: an HTTP/1.1 reverse proxy that injects latency, 5xx, resets, short bodies,
  stalls and redirects on a schedule;
- ``LatencyProxy``: a fast asyncio HTTP/1.1 reverse proxy that only adds latency per request
  (for benchmarks: raw byte relay, pooled keep-alive upstream connections);
- ``MotoS3``: moto's S3 server (needs ``moto[server]`` and ``boto3``).

``python remote_servers.py`` runs a self-check of all of them (``... latency``: of LatencyProxy only).
"""
from __future__ import annotations

import asyncio
import email.utils
import http.client
import os
import posixpath
import re
import shutil
import socket
import socketserver
import ssl
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable

__all__ = ["free_port", "self_signed_cert", "RangeHTTPServer", "NginxServer", "FaultProxy", "LatencyProxy", "MotoS3"]

HOST = "127.0.0.1"
_CHUNK = 256 * 1024


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout_s: float, alive=lambda: True) -> bool:
    """True once 127.0.0.1:port accepts a connection within timeout_s (and alive() holds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class _Closing:
    """A context manager whose exit is close()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _LockedList(list):
    """A list whose mutations hold a lock; ``snapshot()`` returns a consistent copy."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()

    def append(self, item):
        with self._lock:
            super().append(item)

    def clear(self):
        with self._lock:
            super().clear()

    def snapshot(self) -> list:
        with self._lock:
            return list(self)


class _LoopbackHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer on 127.0.0.1:0 that is quiet and closes its live connections on stop."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops the SYNs of a client opening dozens of connections
    # at once, which then wait out TCP's 1, 3, 7 s retransmits; nginx's default is 511.
    request_queue_size = 512

    def __init__(self, handler, owner):
        self.owner = owner
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        super().__init__((HOST, 0), handler)

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)  # skips getfqdn() (a DNS lookup)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        pass

    def track(self, sock: socket.socket, add: bool):
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(sock)

    def start(self):
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name=f"{type(self.owner).__name__}:{self.server_port}")
        self._thread.start()

    def stop(self):
        if self._thread is not None:
            self.shutdown()
            self._thread.join(2)
            self._thread = None
        with self._conns_lock:
            conns = list(self._conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.server_close()


class _QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler with an idle timeout, TCP_NODELAY and no logging."""

    protocol_version = "HTTP/1.1"
    timeout = 30

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, True)

    def finish(self):
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format, *args):
        pass

    def _simple(self, status: int, body: bytes = b"", headers: Iterable[tuple[str, str]] = (),
                head: bool = False, close: bool = False):
        """Send a complete response with Content-Length."""
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if body and not head:
            self.wfile.write(body)


# --------------------------------------------------------------------------------------------
# RangeHTTPServer

_RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")


def _etag_list_matches(header: str, etag: str) -> bool:
    """If-Match semantics: '*' or any listed entity tag (strong comparison) equals etag."""
    header = header.strip()
    if header == "*":
        return True
    return any(tag.strip() == etag for tag in header.split(","))


def _parse_range(header: str, size: int):
    """(start, end) inclusive, 'unsatisfiable', or None when the header is to be ignored."""
    m = _RANGE_RE.match(header)
    if not m:
        return None  # multi-range or malformed: serve the whole file
    a, b = m.group(1), m.group(2)
    if a:
        start = int(a)
        end = int(b) if b else size - 1
        if b and end < start:
            return None
        if start >= size:
            return "unsatisfiable"
        return start, min(end, size - 1)
    if b:
        n = int(b)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    return None


class _RangeHandler(_QuietHandler):
    server_version = "gpufeed-test-range/1"

    def do_GET(self):
        self._serve(head=False)

    def do_HEAD(self):
        self._serve(head=True)

    def _reject(self):
        self._record(405)  # the body is left unread, so the connection is closed
        self._simple(405, b"405 Method Not Allowed\n", [("Allow", "GET, HEAD")], close=True)

    do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _reject

    def _record(self, status: int):
        self.server.owner.requests.append((self.command, self.path, self.headers.get("Range"), status))

    def _error(self, status: int, head: bool, headers=()):
        self._record(status)
        phrase = http.HTTPStatus(status).phrase
        self._simple(status, f"{status} {phrase}\n".encode(), headers, head=head)

    def _serve(self, head: bool):
        owner: RangeHTTPServer = self.server.owner
        if owner.latency_s > 0:
            time.sleep(owner.latency_s)
        rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        rel = posixpath.normpath(rel) if rel else ""
        if rel in owner.forbidden:
            return self._error(403, head)
        full = os.path.realpath(os.path.join(owner.root, rel))
        if not full.startswith(owner.root + os.sep) or not os.path.isfile(full):
            return self._error(404, head)
        try:
            st = os.stat(full)
        except OSError:
            return self._error(404, head)
        size = st.st_size
        etag = RangeHTTPServer.etag_for(st)
        meta = [("ETag", etag), ("Accept-Ranges", "bytes"),
                ("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))]
        if_match = self.headers.get("If-Match")
        if if_match is not None and not _etag_list_matches(if_match, etag):
            return self._error(412, head, meta)
        rng_header = self.headers.get("Range")
        rng = _parse_range(rng_header, size) if rng_header else None
        if_range = self.headers.get("If-Range")
        if rng is not None and if_range is not None and if_range.strip() != etag:
            rng = None
        if rng == "unsatisfiable":
            return self._error(416, head, meta + [("Content-Range", f"bytes */{size}")])
        if rng is None:
            status, start, length = 200, 0, size
        else:
            status, start, length = 206, rng[0], rng[1] - rng[0] + 1
            meta.append(("Content-Range", f"bytes {rng[0]}-{rng[1]}/{size}"))
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for k, v in meta:
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        try:
            with open(full, "rb") as f:
                f.seek(start)
                left = length
                while left > 0:
                    buf = f.read(min(_CHUNK, left))
                    if not buf:
                        break
                    self.wfile.write(buf)
                    left -= len(buf)
            if left:
                self.close_connection = True  # file shrank meanwhile: the body is short
        except OSError:
            self.close_connection = True


def self_signed_cert(folder) -> tuple[str, str]:
    """(certificate, key) PEM files written into ``folder`` by the openssl command: a self-signed
    certificate for 127.0.0.1 (its own CA bundle), valid two days."""
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", f"/CN={HOST}", "-addext", f"subjectAltName=IP:{HOST}"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class RangeHTTPServer(_Closing):
    """Threaded static file server over ``root`` with single byte ranges, ETag and If-Match.

    ``requests`` lists (method, path, range_header_or_None, status) per request; paths in
    ``forbidden`` (relative to root) answer 403; ``latency_s`` is slept before each request;
    ``tls`` = (certificate, key) PEM files serves https (``url`` then starts with https://).
    """

    def __init__(self, root, forbidden: Iterable[str] = (), latency_s: float = 0.0,
                 tls: tuple[str, str] | None = None):
        self.root = os.path.realpath(os.fspath(root))
        self.forbidden = frozenset(posixpath.normpath(str(p).lstrip("/")) for p in forbidden)
        self.latency_s = latency_s
        self.requests = _LockedList()
        self._server = _LoopbackHTTPServer(_RangeHandler, self)
        self.port: int = self._server.server_port
        self.url = f"http://{HOST}:{self.port}"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            # The handshake happens in the connection's thread (a client refusing the certificate
            # fails only its own connection).
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True,
                                                  do_handshake_on_connect=False)
            self.url = f"https://{HOST}:{self.port}"
        self._server.start()

    @staticmethod
    def etag_for(st: os.stat_result) -> str:
        """The ETag served for a file with this stat: size and mtime_ns."""
        return f'"{st.st_size:x}-{st.st_mtime_ns:x}"'

    def close(self):
        if self._server is not None:
            self._server.stop()
            self._server = None


# --------------------------------------------------------------------------------------------
# NginxServer

NGINX = "/usr/sbin/nginx"


class NginxServer(_Closing):
    """Debian's nginx-light serving ``root`` as static files on 127.0.0.1 (ranges, ETag and
    If-Match are nginx's own), with config, pid, logs and temp dirs in a private prefix.

    nginx 1.22 closes the connection after a 412 even though that response says keep-alive.
    """

    def __init__(self, root, start_timeout_s: float = 10.0):
        self.root = os.path.realpath(os.fspath(root))
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.prefix = tempfile.mkdtemp(prefix="gpufeed-nginx-")
        self.error_log = os.path.join(self.prefix, "error.log")
        self._proc: subprocess.Popen | None = None
        conf = os.path.join(self.prefix, "nginx.conf")
        with open(conf, "w") as f:
            f.write(self._config())
        stderr_path = os.path.join(self.prefix, "stderr.log")
        try:
            with open(stderr_path, "wb") as err:
                self._proc = subprocess.Popen(
                    [NGINX, "-p", self.prefix + "/", "-c", conf, "-e", self.error_log],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    cwd=self.prefix)
            if not _wait_port(self.port, start_timeout_s, lambda: self._proc.poll() is None):
                tail = self._log_tail(stderr_path) + self._log_tail(self.error_log)
                raise RuntimeError(f"nginx did not start on port {self.port} "
                                   f"(exit code {self._proc.poll()}):\n{tail}")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def available() -> bool:
        """True when /usr/sbin/nginx exists and is executable."""
        return os.path.isfile(NGINX) and os.access(NGINX, os.X_OK)

    def _config(self) -> str:
        p = self.prefix
        user = "user root;\n" if os.geteuid() == 0 else ""
        temps = "".join(f'    {name}_temp_path "{p}/{name}_temp";\n'
                        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        return (
            f"{user}daemon off;\nmaster_process off;\nworker_processes 1;\n"
            f'pid "{p}/nginx.pid";\nerror_log "{self.error_log}" warn;\n'
            "events { worker_connections 512; }\n"
            "http {\n"
            f'    access_log "{p}/access.log";\n{temps}'
            "    default_type application/octet-stream;\n"
            "    sendfile on;\n    tcp_nodelay on;\n"
            "    keepalive_timeout 30s;\n    keepalive_requests 100000;\n"
            "    server {\n"
            f"        listen {HOST}:{self.port};\n"
            "        server_name _;\n"
            f'        root "{self.root}";\n'
            "        location / { autoindex off; }\n"
            "    }\n"
            "}\n")

    @staticmethod
    def _log_tail(path: str, n: int = 20) -> str:
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def close(self):
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self.prefix:
            shutil.rmtree(self.prefix, ignore_errors=True)
            self.prefix = ""


# --------------------------------------------------------------------------------------------
# FaultProxy

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection"}
_S3_503 = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
_S3_500 = b"<Error><Code>InternalError</Code></Error>"


class _ProxyHandler(_QuietHandler):
    server_version = "gpufeed-test-proxy/1"

    def _read_body(self) -> bytes:
        """The request body as received (chunked framing kept verbatim)."""
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            raw = bytearray()
            while True:
                line = self.rfile.readline(65537)
                raw += line
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers up to the blank line
                        t = self.rfile.readline(65537)
                        raw += t
                        if t in (b"\r\n", b"\n", b""):
                            return bytes(raw)
                raw += self.rfile.read(size + 2)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _handle(self):
        proxy: FaultProxy = self.server.owner
        body = self._read_body()
        entry = {"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                 "status": None, "fault": None}
        fault = proxy._take_fault(self.command, self.path)
        entry["fault"] = fault
        proxy.log.append(entry)
        if proxy.latency_s > 0:
            proxy._sleep(proxy.latency_s)
        head = self.command == "HEAD"
        if fault == "503":
            entry["status"] = 503
            self._simple(503, _S3_503, [("Retry-After", "0"), ("Content-Type", "application/xml")],
                         head=head)
        elif fault == "500":
            entry["status"] = 500
            self._simple(500, _S3_500, [("Content-Type", "application/xml")], head=head)
        elif fault == "redirect":
            entry["status"] = 302
            self._simple(302, b"", [("Location", "http://example.invalid/elsewhere")], head=head)
        elif fault == "reset":
            self._reset()
        elif fault == "stall":
            proxy._sleep(proxy.stall_s)
            self.close_connection = True
        else:
            self._forward(proxy, body, entry, short=fault == "short")

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _handle

    def _reset(self):
        """Close abruptly: SO_LINGER 0 makes the kernel send RST."""
        self.close_connection = True
        sock = self.connection
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()
            self.wfile.close()
            sock.close()
        except OSError:
            pass

    def _forward(self, proxy: FaultProxy, body: bytes, entry: dict, short: bool):
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port,
                                          timeout=proxy.upstream_timeout_s)
        proxy._track_upstream(conn, True)
        try:
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    conn.putheader(k, v)
                conn.endheaders(body or None)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                entry["status"] = 502
                self._simple(502, f"upstream error: {e!r}\n".encode(), close=True)
                return
            entry["status"] = resp.status
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            no_body = (self.command == "HEAD" or resp.status in (204, 304)
                       or 100 <= resp.status < 200)
            length = resp.getheader("Content-Length")
            if no_body:
                self._send_head(resp, headers)
                return
            if length is None or resp.getheader("Transfer-Encoding"):
                data = resp.read()  # chunked or close-delimited upstream: re-frame with a length
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                headers.append(("Content-Length", str(len(data))))
                self._send_head(resp, headers)
                self.wfile.write(data[:len(data) // 2] if short else data)
            else:
                total = int(length)
                left = total // 2 if short else total
                self._send_head(resp, headers)
                while left > 0:
                    buf = resp.read(min(_CHUNK, left))
                    if not buf:
                        break
                    self.wfile.write(buf)
                    left -= len(buf)
                if left:
                    self.close_connection = True
            if short:
                self.wfile.flush()
                self.close_connection = True
        except OSError:
            self.close_connection = True
        finally:
            proxy._track_upstream(conn, False)
            conn.close()

    def _send_head(self, resp: http.client.HTTPResponse, headers):
        self.send_response_only(resp.status, resp.reason)
        for k, v in headers:
            self._headers_buffer.append(f"{k}: {v}\r\n".encode("latin-1", "strict"))
        self.end_headers()


def _upstream(url: str):
    """(host, port) of an http://host:port upstream; ValueError otherwise."""
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"upstream must be http://host:port, got {url!r}")
    return u.hostname, u.port or 80


class FaultProxy(_Closing):
    """HTTP/1.1 reverse proxy on 127.0.0.1 in front of ``upstream_url`` that forwards method,
    path+query and all request headers unchanged (Host included) and injects faults.

    Faults: ``latency_s`` (sleep before every request), and ``inject(kind, count, match, methods)``
    for the next matching requests, kind one of ``FaultProxy.KINDS``. ``log`` lists a dict
    {method, path, headers, status, fault} per request; ``stats()`` counts faults and requests.
    """

    KINDS = ("503", "500", "reset", "short", "stall", "redirect")

    def __init__(self, upstream_url: str, latency_s: float = 0.0, stall_s: float = 30.0,
                 upstream_timeout_s: float = 60.0):
        self.upstream_url = upstream_url
        self.upstream_host, self.upstream_port = _upstream(upstream_url)
        self.upstream_timeout_s = upstream_timeout_s
        self.latency_s = latency_s
        self.stall_s = stall_s
        self.log = _LockedList()
        self._lock = threading.Lock()
        self._faults: list[list] = []  # [kind, remaining, match, methods]
        self._counts = {k: 0 for k in self.KINDS}
        self._total = 0
        self._stop = threading.Event()
        self._upstreams: set[http.client.HTTPConnection] = set()
        self._server = _LoopbackHTTPServer(_ProxyHandler, self)
        self.port: int = self._server.server_port
        self.url = f"http://{HOST}:{self.port}"
        self._server.start()

    def inject(self, kind: str, count: int = 1, match: str | None = None,
               methods: Iterable[str] | None = None):
        """Apply fault ``kind`` to the next ``count`` requests whose path contains ``match`` (or,
        for a callable, for which ``match(path)`` is true; any path when None) and whose method
        is in ``methods`` (any when None)."""
        if kind not in self.KINDS:
            raise ValueError(f"unknown fault {kind!r}; expected one of {self.KINDS}")
        if count <= 0:
            return
        ms = None if methods is None else frozenset(m.upper() for m in methods)
        with self._lock:
            self._faults.append([kind, count, match, ms])

    def clear_faults(self):
        """Drop every queued fault."""
        with self._lock:
            self._faults.clear()

    def pending(self) -> int:
        """Number of queued faults not yet applied."""
        with self._lock:
            return sum(f[1] for f in self._faults)

    def stats(self) -> dict:
        """{kind: times applied for each kind, "requests": requests seen}."""
        with self._lock:
            return {**self._counts, "requests": self._total}

    def _take_fault(self, method: str, path: str) -> str | None:
        with self._lock:
            self._total += 1
            for f in self._faults:
                kind, _, match, ms = f
                hit = match is None or (match(path) if callable(match) else match in path)
                if hit and (ms is None or method.upper() in ms):
                    f[1] -= 1
                    if f[1] <= 0:
                        self._faults.remove(f)
                    self._counts[kind] += 1
                    return kind
        return None

    def _sleep(self, seconds: float):
        """Sleep, waking early when the proxy stops."""
        self._stop.wait(seconds)

    def _track_upstream(self, conn, add: bool):
        with self._lock:
            (self._upstreams.add if add else self._upstreams.discard)(conn)

    def close(self):
        if self._server is None:
            return
        self._stop.set()
        with self._lock:
            ups = list(self._upstreams)
        for c in ups:
            try:
                if c.sock is not None:
                    c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.stop()
        self._server = None


# --------------------------------------------------------------------------------------------
# LatencyProxy

_LP_LIMIT = 1 << 20  # a request or response head longer than this is refused
_LP_WRITE_HIGH = 4 << 20  # client write buffer above which reading from the upstream pauses
_LP_NO_BODY = frozenset((204, 304))


class _LPFields:
    """A raw HTTP head's fields, looked up by lower-case name (the first of a repeated one; the
    value lower-cased): a few finds in the head instead of a dict built per head."""

    __slots__ = ("lower",)

    def __init__(self, head: bytes):
        self.lower = head.lower()

    def get(self, name: bytes, default=None):
        i = self.lower.find(b"\r\n" + name + b":")
        if i < 0:
            return default
        j = self.lower.find(b"\r\n", i + 2)
        return self.lower[i + len(name) + 3:j].strip()

    def __contains__(self, name: bytes) -> bool:
        return self.get(name) is not None

    def __getitem__(self, name: bytes) -> bytes:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value


def _lp_parse_head(head: bytes) -> tuple[bytes, _LPFields]:
    """(first line, fields) of a raw HTTP head ending in CRLF CRLF."""
    return head[:head.find(b"\r\n")], _LPFields(head)


def _lp_has_token(value: bytes | None, token: bytes) -> bool:
    return value is not None and token in (t.strip().lower() for t in value.split(b","))


def _lp_error(status: int, text: str) -> bytes:
    body = f"{status} {text}\n".encode()
    return (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nConnection: close\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


class _LPChunks:
    """Finds the end of a chunked body in the bytes fed to it (framing and trailers included)."""

    def __init__(self):
        self.in_data = False
        self.trailers = False
        self.left = 0  # bytes left of the current chunk's data and its CRLF
        self.line = bytearray()
        self.payload = 0  # chunk data bytes seen

    def feed(self, data, start: int = 0) -> int:
        """Consumes data[start:]; returns the index just past the body's end, or -1 if not yet."""
        i, n = start, len(data)
        while i < n:
            if self.in_data:
                take = min(self.left, n - i)
                self.payload += min(take, max(0, self.left - 2))
                self.left -= take
                i += take
                if self.left == 0:
                    self.in_data = False
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > _LP_LIMIT:
                    raise ValueError("chunk line too long")
                return -1
            self.line += data[i:j + 1]
            i = j + 1
            line = bytes(self.line).strip()
            self.line.clear()
            if self.trailers:
                if not line:
                    return i
            else:
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.trailers = True
                else:
                    self.in_data, self.left = True, size + 2
        return -1


class _LPClient(asyncio.Protocol):
    """One client connection: parses requests one at a time, delays and forwards each."""

    def __init__(self, proxy: "LatencyProxy"):
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False  # a request of this connection is being delayed or relayed
        self.closed = False
        self.upstream: "_LPUpstream | None" = None
        self.timer: asyncio.TimerHandle | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.paused = False
        # The request being received: its head and first line, where it ends in buf (-1: not
        # known yet), a chunked body's scanner and how far it got, and Connection: close.
        self._head: bytes | None = None
        self._first = b""
        self._need = 0
        self._chunks: _LPChunks | None = None
        self._scanned = 0
        self._client_close = False

    def connection_made(self, transport):
        self.transport = transport
        transport.set_write_buffer_limits(high=_LP_WRITE_HIGH)
        self.proxy._transports.add(transport)
        self._arm_idle()

    def _arm_idle(self):
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.idle_timer = self.proxy._loop.call_later(self.proxy.idle_timeout_s, self.close)

    def data_received(self, data):
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self):
        """Takes the next complete request off the buffer, if there is one, and sends it on."""
        buf = self.buf
        try:
            if self._head is None:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _LP_LIMIT:
                        self.transport.write(_lp_error(431, "request head too long"))
                        self.close()
                    return
                self._head = bytes(buf[:end + 4])
                first, fields = _lp_parse_head(self._head)
                if _lp_has_token(fields.get(b"transfer-encoding"), b"chunked"):
                    self._chunks, self._scanned = _LPChunks(), len(self._head)
                    self._need = -1
                else:
                    self._need = end + 4 + int(fields.get(b"content-length") or 0)
                self._first = first
                self._client_close = (_lp_has_token(fields.get(b"connection"), b"close")
                                      or first.endswith(b"HTTP/1.0"))
                if _lp_has_token(fields.get(b"expect"), b"100-continue") and self._need != len(self._head):
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the upstream's is dropped
            if self._chunks is not None:
                end = self._chunks.feed(buf, self._scanned)
                self._scanned = len(buf)
                if end < 0:
                    return
                self._need, self._chunks = end, None
            if len(buf) < self._need:
                return
        except ValueError:
            self.transport.write(_lp_error(400, "bad request framing"))
            self.close()
            return
        request = bytes(buf[:self._need])
        del buf[:self._need]
        method = self._first.split(b" ", 1)[0].upper()
        close = self._client_close
        self._head, self._chunks = None, None
        self.busy = True
        self.proxy.requests += 1
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        latency = self.proxy.latency_s
        if latency > 0:
            self.timer = self.proxy._loop.call_later(latency, self._forward, request, method, close)
        else:
            self._forward(request, method, close)

    def _forward(self, request: bytes, method: bytes, close: bool):
        self.timer = None
        if not self.closed:
            self.proxy._dispatch(self, request, method, close, fresh=False)

    def write(self, data):
        if not self.closed:
            self.transport.write(data)

    def fail(self, payload: bytes = b""):
        """Ends this connection after an upstream failure (with a 502 when nothing was sent)."""
        self.upstream = None
        if payload:
            self.write(payload)
            self.close()
        else:
            self.abort()

    def response_done(self, keep: bool, client_close: bool):
        self.upstream = None
        self.busy = False
        if not keep or client_close:
            self.close()
            return
        self._arm_idle()
        if self.buf:
            self._next()

    def close(self):
        if not self.closed:
            self.transport.close()  # after what is buffered has been sent

    def abort(self):
        if not self.closed:
            self.transport.abort()

    def pause_writing(self):
        self.paused = True
        if self.upstream is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self):
        self.paused = False
        if self.upstream is not None and not self.upstream.closed:
            self.upstream.transport.resume_reading()

    def connection_lost(self, exc):
        self.closed = True
        self.proxy._transports.discard(self.transport)
        for t in (self.timer, self.idle_timer):
            if t is not None:
                t.cancel()
        up, self.upstream = self.upstream, None
        if up is not None:
            up.client = None
            up.abort()  # mid-response: that connection cannot be reused


class _LPUpstream(asyncio.Protocol):
    """One pooled keep-alive connection to the upstream; relays one response at a time."""

    IDLE, HEAD, LENGTH, CHUNKED, EOF = range(5)

    def __init__(self, proxy: "LatencyProxy"):
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.state = self.IDLE
        self.closed = False
        self.client: _LPClient | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.hbuf = bytearray()

    def connection_made(self, transport):
        self.transport = transport
        self.proxy._transports.add(transport)

    def start(self, client: _LPClient, request: bytes, method: bytes, close: bool, reused: bool):
        self.client, client.upstream = client, self
        self.request, self.method, self.client_close, self.reused = request, method, close, reused
        self.got_bytes = False
        self.keep = True
        self.state = self.HEAD
        self.hbuf.clear()
        if client.paused:
            self.transport.pause_reading()
        self.transport.write(request)
        self.timer = self.proxy._loop.call_later(self.proxy.upstream_timeout_s, self._timed_out)

    def _timed_out(self):
        self.timer = None
        client = self.client
        self.abort()
        if client is not None:
            client.fail(_lp_error(504, "upstream timed out"))

    def data_received(self, data):
        if self.state == self.IDLE:
            self.abort()  # bytes nobody asked for
            return
        self.got_bytes = True
        if self.state == self.HEAD:
            # The head usually arrives whole, with the body's first bytes: no copy of those then.
            if self.hbuf:
                self.hbuf += data
                data = bytes(self.hbuf)
                self.hbuf.clear()
            pos = 0
            while True:
                end = data.find(b"\r\n\r\n", pos)
                if end < 0:
                    self.hbuf += data[pos:]
                    if len(self.hbuf) > _LP_LIMIT:
                        self._broken(_lp_error(502, "upstream head too long"))
                    return
                head = data[pos:end + 4]
                pos = end + 4
                first, fields = _lp_parse_head(head)
                try:
                    status = int(first.split(b" ", 2)[1])
                except (IndexError, ValueError):
                    self._broken(_lp_error(502, "bad upstream status line"))
                    return
                if 100 <= status < 200 and status != 101:
                    continue  # interim responses are not relayed (the client got ours)
                break
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.keep = not (_lp_has_token(fields.get(b"connection"), b"close")
                             or first.startswith(b"HTTP/1.0"))
            if self.client is None:
                self.abort()
                return
            self.client.write(head)
            rest = memoryview(data)[pos:] if pos < len(data) else None
            if self.method == b"HEAD" or status in _LP_NO_BODY or status < 200:
                self._done()
                return
            if _lp_has_token(fields.get(b"transfer-encoding"), b"chunked"):
                self.state, self.chunks = self.CHUNKED, _LPChunks()
            elif b"content-length" in fields:
                self.state, self.left = self.LENGTH, int(fields[b"content-length"])
                if self.left == 0:
                    self._done()
                    return
            else:
                self.state, self.keep = self.EOF, False
            if rest is not None:
                self._body(rest)
        else:
            self._body(data)

    def _body(self, data):
        client = self.client
        if self.state == self.LENGTH:
            if len(data) >= self.left:
                if len(data) > self.left:
                    data, self.keep = data[:self.left], False  # more than was announced
                self.left = 0
            else:
                self.left -= len(data)
            self.proxy.bytes += len(data)  # before the write, which may reach the client at once
            if client is not None:
                client.write(data)
            if self.left == 0:
                self._done()
        elif self.state == self.CHUNKED:
            if isinstance(data, memoryview):
                data = bytes(data)
            before = self.chunks.payload
            try:
                end = self.chunks.feed(data)
            except ValueError:
                self._broken(b"")
                return
            if end >= 0 and end < len(data):
                data, self.keep = data[:end], False
            self.proxy.bytes += self.chunks.payload - before
            if client is not None:
                client.write(data)
            if end >= 0:
                self._done()
        elif self.state == self.EOF:
            self.proxy.bytes += len(data)
            if client is not None:
                client.write(data)

    def _done(self):
        client, self.client = self.client, None
        keep = self.keep
        self.state = self.IDLE
        if keep and not self.closed:
            self.transport.resume_reading()
            self.proxy._idle.append(self)
        else:
            self.close()
        if client is not None:
            client.response_done(keep, self.client_close)

    def _broken(self, payload: bytes):
        client, self.client = self.client, None
        self.abort()
        if client is not None:
            client.fail(payload)

    def close(self):
        if not self.closed:
            self.transport.close()

    def abort(self):
        if not self.closed:
            self.transport.abort()

    def connection_lost(self, exc):
        self.closed = True
        self.proxy._transports.discard(self.transport)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        try:
            self.proxy._idle.remove(self)
        except ValueError:
            pass
        client, self.client = self.client, None
        state, self.state = self.state, self.IDLE
        if client is None or state == self.IDLE:
            return
        if state == self.HEAD and not self.got_bytes and self.reused:
            # An idle pooled connection the upstream had closed: once more on a fresh one.
            client.upstream = None
            self.proxy._dispatch(client, self.request, self.method, self.client_close, fresh=True)
        elif state == self.EOF:
            client.response_done(False, True)  # a close-delimited body ends here
        elif state == self.HEAD and not self.got_bytes:
            client.fail(_lp_error(502, f"upstream closed the connection: {exc!r}"))
        else:
            client.fail(b"")  # cut short: the client sees the connection end mid-response


class LatencyProxy(_Closing):
    """A fast HTTP/1.1 reverse proxy on 127.0.0.1 in front of ``upstream_url`` that delays every
    request by ``latency_s`` (settable at any time): a loopback stand-in for a distant server in
    benchmarks, where ``FaultProxy``'s thread per connection and http.client relay cost more
    than the server being measured.

    One asyncio event loop on a daemon thread relays raw bytes with protocol callbacks (no
    coroutine per request): each request's head and body go upstream unchanged (Host and
    Authorization included, so S3 signatures still hold) ``latency_s`` after they arrived, each
    request delayed on its own (requests on separate connections overlap their delays).
    Upstream connections are kept alive and pooled: each request in flight holds one, an idle
    one is reused (a stale one is retried once on a fresh connection). Response bytes are written
    to the client as they arrive, up to the end of the body (by Content-Length, the last chunk
    of a chunked body, or the upstream's close, after which the client connection closes too);
    the client connection stays alive otherwise. Reading from the upstream pauses while the
    client's write buffer holds more than 4 MiB. The listen backlog is 512.

    ``requests`` counts the requests received, ``bytes`` the response body bytes relayed (both
    updated on the loop thread). ``close()`` (or leaving the ``with`` block) closes the listener,
    aborts every connection and stops the loop promptly, in-flight requests included.
    """

    def __init__(self, upstream_url: str, latency_s: float = 0.0, upstream_timeout_s: float = 60.0,
                 idle_timeout_s: float = 60.0):
        self.upstream_url = upstream_url
        self.upstream_host, self.upstream_port = _upstream(upstream_url)
        self.upstream_timeout_s = upstream_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.latency_s = float(latency_s)
        self.requests = 0
        self.bytes = 0
        self._idle: list[_LPUpstream] = []
        self._transports: set[asyncio.BaseTransport] = set()
        self._connecting: set[asyncio.Task] = set()
        self._server: asyncio.AbstractServer | None = None
        self._loop = asyncio.new_event_loop()
        self._error: BaseException | None = None
        self._closed = False
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True,
                                        name="LatencyProxy")
        self._thread.start()
        ready.wait(10)
        if self._error is not None or self._server is None:
            self.close()
            raise RuntimeError(f"LatencyProxy did not start: {self._error!r}")
        self.port: int = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"

    @property
    def idle_upstream(self) -> int:
        """Pooled idle upstream connections now."""
        return len(self._idle)

    # ---- the loop thread --------------------------------------------------------------------

    def _run(self, ready: threading.Event):
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(loop.create_server(
                lambda: _LPClient(self), HOST, 0, backlog=512, reuse_address=True))
        except BaseException as e:  # noqa: BLE001 - reported by __init__
            self._error = e
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _dispatch(self, client: _LPClient, request: bytes, method: bytes, close: bool, fresh: bool):
        """Sends a request on an idle pooled upstream connection, else on a new one."""
        while self._idle and not fresh:
            up = self._idle.pop()
            if not up.closed:
                up.start(client, request, method, close, reused=True)
                return
        loop = self._loop
        task = loop.create_task(asyncio.wait_for(
            loop.create_connection(lambda: _LPUpstream(self), self.upstream_host, self.upstream_port),
            self.upstream_timeout_s))
        self._connecting.add(task)

        def connected(t: asyncio.Task):
            self._connecting.discard(t)
            if t.cancelled():
                client.abort()
                return
            if t.exception() is not None:
                client.fail(_lp_error(502, f"upstream connect failed: {t.exception()!r}"))
                return
            up = t.result()[1]
            if client.closed:
                self._idle.append(up)  # unused: pooled for the next request
            else:
                up.start(client, request, method, close, reused=False)

        task.add_done_callback(connected)

    def _shutdown(self):
        if self._server is not None:
            self._server.close()
        self._idle.clear()
        connecting = list(self._connecting)
        for t in connecting:
            t.cancel()
        for tr in list(self._transports):
            tr.abort()
        # The loop stops once the connection_lost callbacks (which close the sockets) and the
        # cancelled connection attempts have run.
        loop = self._loop
        if connecting:
            asyncio.ensure_future(asyncio.wait(connecting, timeout=1)).add_done_callback(
                lambda _: loop.call_soon(loop.stop))
        else:
            loop.call_soon(loop.stop)

    # ---- the caller's side ------------------------------------------------------------------

    def close(self):
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._shutdown)
            except RuntimeError:  # the loop is already closed
                pass
        self._thread.join(5)


# --------------------------------------------------------------------------------------------
# MotoS3

class MotoS3(_Closing):
    """moto's S3 server (``ThreadedMotoServer``) on 127.0.0.1 with fixed fake credentials.

    moto keeps its state per process: servers started in one process share buckets; ``reset()``
    empties them.
    """

    ACCESS_KEY = "AKIAGPUFEEDTEST00001"
    SECRET_KEY = "gpufeedTestSecretKey/DoNotLeak+0123456789"
    SESSION_TOKEN = "gpufeedTestSessionToken0123456789abcdef"
    REGION = "us-east-1"

    def __init__(self, start_timeout_s: float = 10.0):
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no per-request lines on stderr
        self.port = free_port()
        self.endpoint_url = f"http://{HOST}:{self.port}"
        self.url = self.endpoint_url
        self._server = ThreadedMotoServer(ip_address=HOST, port=self.port, verbose=False)
        self._server.start()
        if not _wait_port(self.port, start_timeout_s):
            self.close()
            raise RuntimeError(f"moto server did not start on port {self.port}")

    def client(self, endpoint_url: str | None = None, **config):
        """A boto3 S3 client for this server (or ``endpoint_url``, e.g. a FaultProxy in front of
        it), path-style, env proxies off; ``config`` goes to botocore's Config."""
        import boto3
        from botocore.config import Config

        cfg = {"s3": {"addressing_style": "path"}, "proxies": {}, "connect_timeout": 5,
               "read_timeout": 30, "retries": {"max_attempts": 3, "mode": "standard"}}
        cfg.update(config)
        return boto3.Session().client(
            "s3", endpoint_url=endpoint_url or self.endpoint_url, region_name=self.REGION,
            aws_access_key_id=self.ACCESS_KEY, aws_secret_access_key=self.SECRET_KEY,
            aws_session_token=self.SESSION_TOKEN, config=Config(**cfg))

    def make_bucket(self, name: str):
        """Create bucket ``name``."""
        self.client().create_bucket(Bucket=name)

    def upload_tree(self, bucket: str, prefix: str, folder) -> list[str]:
        """Upload every file under ``folder`` as ``prefix`` + its relative path; returns the keys."""
        folder = os.fspath(folder)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        c = self.client()
        keys = []
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for fn in sorted(filenames):
                path = os.path.join(dirpath, fn)
                key = prefix + os.path.relpath(path, folder).replace(os.sep, "/")
                c.upload_file(path, bucket, key)
                keys.append(key)
        return keys

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """AWS_* variables that point an S3 client at this server (or ``endpoint_url``)."""
        return {"AWS_ACCESS_KEY_ID": self.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY,
                "AWS_SESSION_TOKEN": self.SESSION_TOKEN, "AWS_REGION": self.REGION,
                "AWS_DEFAULT_REGION": self.REGION,
                "AWS_ENDPOINT_URL": endpoint_url or self.endpoint_url}

    def reset(self):
        """Drop every bucket and object moto holds."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=10)
        try:
            conn.request("POST", "/moto-api/reset")
            conn.getresponse().read()
        finally:
            conn.close()

    def close(self):
        if self._server is not None:
            server, self._server = self._server, None
            try:
                server.stop()
            except Exception:
                pass


# --------------------------------------------------------------------------------------------
# Self-check

def _request(url: str, method: str = "GET", path: str = "/", headers=None, timeout: float = 5.0,
             conn: http.client.HTTPConnection | None = None):
    """(status, headers dict, body) of one request; reuses ``conn`` when given."""
    u = urllib.parse.urlsplit(url)
    own = conn is None
    conn = conn or http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        return r.status, dict(r.getheaders()), body
    finally:
        if own:
            conn.close()


def _self_check():
    import random

    t_all = time.monotonic()
    rel = "shards/train-000000.tar"
    with tempfile.TemporaryDirectory(prefix="gpufeed-remote-") as tmp:
        os.makedirs(os.path.join(tmp, "shards"))
        data = random.Random(0).randbytes(1 << 20)
        path = os.path.join(tmp, rel)
        with open(path, "wb") as f:
            f.write(data)
        with open(os.path.join(tmp, "shards", "secret.tar"), "wb") as f:
            f.write(b"x" * 10)
        with open(os.path.join(tmp, "outside.txt"), "w") as f:
            f.write("root file")
        size = len(data)

        # RangeHTTPServer
        with RangeHTTPServer(tmp, forbidden=["shards/secret.tar"]) as srv:
            conn = http.client.HTTPConnection(HOST, srv.port, timeout=5)
            s, h, b = _request(srv.url, path="/" + rel, headers={"Range": "bytes=100-199"}, conn=conn)
            assert s == 206 and b == data[100:200] and h["Content-Range"] == f"bytes 100-199/{size}", (s, h)
            s, h, b = _request(srv.url, path="/" + rel, headers={"Range": f"bytes={size - 10}-"}, conn=conn)
            assert s == 206 and b == data[-10:], s
            s, h, b = _request(srv.url, path="/" + rel, headers={"Range": "bytes=-5"}, conn=conn)
            assert s == 206 and b == data[-5:], s
            s, h, b = _request(srv.url, "HEAD", "/" + rel, conn=conn)
            etag = h["ETag"]
            assert s == 200 and int(h["Content-Length"]) == size and etag.startswith('"') and not b
            assert h["Accept-Ranges"] == "bytes" and "Last-Modified" in h
            s, h, b = _request(srv.url, path="/" + rel, headers={"If-Match": '"nope"'}, conn=conn)
            assert s == 412, s
            s, h, b = _request(srv.url, path="/" + rel, headers={"If-Match": etag, "Range": "bytes=0-3"},
                               conn=conn)
            assert s == 206 and b == data[:4], s
            s, h, b = _request(srv.url, path="/" + rel, headers={"Range": f"bytes={size}-"}, conn=conn)
            assert s == 416 and h["Content-Range"] == f"bytes */{size}", (s, h)
            s, h, b = _request(srv.url, path="/" + rel + "?x-id=GetObject", conn=conn)
            assert s == 200 and b == data, s
            assert _request(srv.url, path="/missing.tar", conn=conn)[0] == 404
            assert _request(srv.url, path="/shards/secret.tar", conn=conn)[0] == 403
            assert _request(srv.url, path="/shards/../../etc/passwd", conn=conn)[0] == 404
            assert _request(srv.url, path="/%2e%2e/etc/passwd", conn=conn)[0] == 404
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
            s, h, b = _request(srv.url, "HEAD", "/" + rel, conn=conn)
            assert h["ETag"] != etag, "ETag must change with mtime"
            conn.close()
            reqs = srv.requests.snapshot()
            assert reqs[0] == ("GET", "/" + rel, "bytes=100-199", 206), reqs[0]
            assert ("GET", "/" + rel + "?x-id=GetObject", None, 200) in reqs
            print(f"RangeHTTPServer {srv.url}: 206/HEAD/412/416/404/403/traversal/ETag ok, "
                  f"{len(reqs)} requests on one keep-alive connection")

            # FaultProxy in front of it
            with FaultProxy(srv.url) as px:
                host_hdr = f"{HOST}:{px.port}"
                pconn = http.client.HTTPConnection(HOST, px.port, timeout=5)
                s, h, b = _request(px.url, path="/" + rel, headers={"Range": "bytes=10-19",
                                                                    "Authorization": "AWS4 test"},
                                   conn=pconn)
                assert s == 206 and b == data[10:20] and h["Content-Range"] == f"bytes 10-19/{size}"
                e = px.log[-1]
                assert e["headers"]["Host"] == host_hdr and e["headers"]["Authorization"] == "AWS4 test"
                assert srv.requests[-1][2] == "bytes=10-19"
                s, h, b = _request(px.url, "HEAD", "/" + rel, conn=pconn)
                assert s == 200 and int(h["Content-Length"]) == size and not b

                px.inject("503", match=".tar", methods=("GET",))
                assert _request(px.url, "HEAD", "/" + rel, conn=pconn)[0] == 200  # spared
                assert _request(px.url, path="/outside.txt", conn=pconn)[0] == 200  # spared
                s, h, b = _request(px.url, path="/" + rel, conn=pconn)
                assert s == 503 and h["Retry-After"] == "0" and b"SlowDown" in b, (s, h)
                px.inject("500")
                s, h, b = _request(px.url, path="/" + rel, conn=pconn)
                assert s == 500 and b"InternalError" in b
                px.inject("redirect")
                s, h, b = _request(px.url, path="/" + rel, conn=pconn)
                assert s == 302 and h["Location"] == "http://example.invalid/elsewhere"
                assert _request(px.url, path="/" + rel, conn=pconn)[0] == 200  # same connection
                pconn.close()
                print("FaultProxy: forwarding (Host/Authorization kept), 503 Retry-After: 0, 500, 302, "
                      "match/methods filter ok")

                px.inject("reset")
                try:
                    _request(px.url, path="/" + rel)
                    raise AssertionError("reset: no error")
                except ConnectionError as ex:  # ConnectionResetError / RemoteDisconnected
                    print(f"FaultProxy reset -> {type(ex).__name__}: {ex}")

                px.inject("short")
                c = http.client.HTTPConnection(HOST, px.port, timeout=5)
                c.request("GET", "/" + rel)
                r = c.getresponse()
                assert int(r.getheader("Content-Length")) == size
                try:
                    r.read()
                    raise AssertionError("short: full body")
                except http.client.IncompleteRead as ex:
                    assert len(ex.partial) == size // 2
                    print(f"FaultProxy short -> IncompleteRead ({len(ex.partial)} of {size} bytes)")
                c.close()

                px.inject("stall")
                t0 = time.monotonic()
                try:
                    _request(px.url, path="/" + rel, timeout=1.0)
                    raise AssertionError("stall: got a response")
                except TimeoutError:
                    print(f"FaultProxy stall -> TimeoutError after {time.monotonic() - t0:.2f} s")

                px.latency_s = 0.05
                t0 = time.monotonic()
                assert _request(px.url, path="/" + rel, headers={"Range": "bytes=0-0"})[0] == 206
                dt = time.monotonic() - t0
                assert dt >= 0.05, dt
                px.latency_s = 0.0
                print(f"FaultProxy latency 0.05 s -> request took {dt:.3f} s")

                # a connection left stalled must not hold up shutdown
                px.inject("stall")
                hung = socket.create_connection((HOST, px.port), timeout=5)
                hung.sendall(f"GET /{rel} HTTP/1.1\r\nHost: {host_hdr}\r\n\r\n".encode())
                time.sleep(0.2)
                stats = px.stats()
                log_n = len(px.log)
                t0 = time.monotonic()
            shutdown_s = time.monotonic() - t0
            hung.close()
            assert shutdown_s < 2, shutdown_s
            assert stats == {"503": 1, "500": 1, "reset": 1, "short": 1, "stall": 2, "redirect": 1,
                             "requests": log_n}, stats
            print(f"FaultProxy stats {stats}; shutdown with a stalled connection took {shutdown_s:.2f} s")

        # NginxServer
        if NginxServer.available():
            with NginxServer(tmp) as ng:
                conn = http.client.HTTPConnection(HOST, ng.port, timeout=5)
                s, h, b = _request(ng.url, path="/" + rel, headers={"Range": "bytes=1000-1999"}, conn=conn)
                assert s == 206 and b == data[1000:2000] and h["Content-Range"] == f"bytes 1000-1999/{size}"
                s, h, b = _request(ng.url, "HEAD", "/" + rel, conn=conn)
                assert s == 200 and int(h["Content-Length"]) == size and "ETag" in h
                etag = h["ETag"]
                assert _request(ng.url, path="/" + rel, headers={"If-Match": '"nope"'}, conn=conn)[0] == 412
                conn.close()  # nginx closes the connection after a 412 although it says keep-alive
                conn = http.client.HTTPConnection(HOST, ng.port, timeout=5)
                s, h, b = _request(ng.url, path="/" + rel, headers={"If-Match": etag, "Range": "bytes=0-3"},
                                   conn=conn)
                assert s == 206 and b == data[:4]
                assert _request(ng.url, path="/missing.tar", conn=conn)[0] == 404
                conn.close()
                print(f"NginxServer {ng.url}: 206, HEAD size+ETag {etag}, If-Match 412 ok")
        else:
            print(f"NginxServer: skipped ({NGINX} not found)")

        # MotoS3 behind a FaultProxy
        with MotoS3() as s3:
            s3.make_bucket("gpufeed-test")
            keys = s3.upload_tree("gpufeed-test", "data", os.path.join(tmp, "shards"))
            assert f"data/{os.path.basename(rel)}" in keys, keys
            with FaultProxy(s3.endpoint_url) as px:
                c = s3.client(endpoint_url=px.url)
                key = f"data/{os.path.basename(rel)}"
                obj = c.get_object(Bucket="gpufeed-test", Key=key, Range="bytes=4096-8191")
                got = obj["Body"].read()
                assert got == data[4096:8192] and obj["ContentRange"] == f"bytes 4096-8191/{size}"
                head = c.head_object(Bucket="gpufeed-test", Key=key)
                assert head["ContentLength"] == size
                px.inject("503", match=key, methods=("GET",))
                got = c.get_object(Bucket="gpufeed-test", Key=key, Range="bytes=0-99")["Body"].read()
                assert got == data[:100]
                entries = [e for e in px.log if e["method"] == "GET" and key in e["path"]]
                assert [e["fault"] for e in entries] == [None, "503", None], entries
                e = entries[0]
                assert e["headers"]["Host"] == f"{HOST}:{px.port}", e["headers"]
                assert s3.ACCESS_KEY in e["headers"]["Authorization"]
                assert e["headers"]["X-Amz-Security-Token"] == s3.SESSION_TOKEN
                assert s3.SECRET_KEY not in repr(px.log.snapshot())
                print(f"MotoS3 {s3.endpoint_url} via FaultProxy {px.url}: ranged get_object ok, "
                      f"503 SlowDown retried by boto3, Host/Authorization/token forwarded verbatim; "
                      f"{len(px.log)} requests, stats {px.stats()}")
    print(f"self-check passed in {time.monotonic() - t_all:.1f} s")


def _latency_proxy_check():
    """LatencyProxy: relay of ranges/HEAD/404, added latency, concurrent delays, chunked and
    close-delimited bodies, stale pooled connections, prompt shutdown."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    t_all = time.monotonic()
    rel = "shards/train-000000.tar"
    with tempfile.TemporaryDirectory(prefix="gpufeed-latency-") as tmp:
        os.makedirs(os.path.join(tmp, "shards"))
        data = random.Random(1).randbytes(3 << 20)
        with open(os.path.join(tmp, rel), "wb") as f:
            f.write(data)
        size = len(data)
        with RangeHTTPServer(tmp) as srv, LatencyProxy(srv.url) as px:
            conn = http.client.HTTPConnection(HOST, px.port, timeout=5)
            s, h, b = _request(px.url, path="/" + rel, headers={"Range": "bytes=100-199"}, conn=conn)
            assert s == 206 and b == data[100:200] and h["Content-Range"] == f"bytes 100-199/{size}", (s, h)
            s, h, b = _request(px.url, path="/" + rel, conn=conn)
            assert s == 200 and b == data, s
            s, h, b = _request(px.url, "HEAD", "/" + rel, conn=conn)
            assert s == 200 and int(h["Content-Length"]) == size and not b
            s, h, b404 = _request(px.url, path="/missing.tar", conn=conn)
            assert s == 404, s
            assert px.requests == 4 and px.bytes == 100 + size + len(b404), (px.requests, px.bytes)
            deadline = time.monotonic() + 2  # the loop pools the connection just after the reply
            while px.idle_upstream != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(srv.requests) == 4 and px.idle_upstream == 1, (srv.requests, px.idle_upstream)
            px.latency_s = 0.05
            t0 = time.monotonic()
            s, h, b = _request(px.url, path="/" + rel, headers={"Range": "bytes=0-0"}, conn=conn)
            one_s = time.monotonic() - t0
            assert s == 206 and b == data[:1] and one_s >= 0.05, (s, one_s)
            conn.close()

            def ranged(i):
                lo = i * 40000
                st, _, body = _request(px.url, path="/" + rel,
                                       headers={"Range": f"bytes={lo}-{lo + 3999}"}, timeout=10)
                return st == 206 and body == data[lo:lo + 4000]

            with ThreadPoolExecutor(64) as ex:
                list(ex.map(lambda _: time.sleep(0.01), range(64)))  # threads started before timing
                times = {}
                for latency in (0.0, 0.05):
                    px.latency_s = latency
                    t0 = time.monotonic()
                    ok = list(ex.map(ranged, range(64)))
                    times[latency] = time.monotonic() - t0
                    assert all(ok), ok.count(False)
            # 64 delays of 0.05 s one after another would take 3.2 s; overlapped, about 0.05 s
            # more than the same requests without delay (this Python client's own time).
            assert times[0.05] < 0.8, times
            print(f"LatencyProxy {px.url} -> {srv.url}: 206/200/HEAD/404 relayed on one keep-alive "
                  f"connection; latency 0.05 s -> one request {one_s:.3f} s, 64 concurrent requests "
                  f"{times[0.05]:.3f} s (without latency {times[0.0]:.3f} s); {px.requests} requests, "
                  f"{px.bytes} body bytes, {px.idle_upstream} idle upstream connections")

        # An upstream that answers one request per connection and then closes without saying so
        # (a stale pooled connection next time), chunked or close-delimited.
        lsock = socket.create_server((HOST, 0))
        lsock.settimeout(0.2)
        stop = threading.Event()
        body = b"0123456789" * 1000

        def raw_upstream():
            while not stop.is_set():
                try:
                    c, _ = lsock.accept()
                except (TimeoutError, OSError):
                    continue
                with c:
                    c.settimeout(5)
                    req = b""
                    while b"\r\n\r\n" not in req:
                        got = c.recv(65536)
                        if not got:
                            break
                        req += got
                    if b"/chunked" in req:
                        c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  + b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 3000]), body[i:i + 3000])
                                             for i in range(0, len(body), 3000)) + b"0\r\n\r\n")
                    else:
                        c.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + body)

        th = threading.Thread(target=raw_upstream, daemon=True)
        th.start()
        try:
            with LatencyProxy(f"http://{HOST}:{lsock.getsockname()[1]}") as px:
                conn = http.client.HTTPConnection(HOST, px.port, timeout=5)
                assert _request(px.url, path="/chunked", conn=conn)[2] == body
                assert _request(px.url, path="/chunked", conn=conn)[2] == body  # stale pool: retried
                s, h, b = _request(px.url, path="/eof", conn=conn)
                assert s == 200 and b == body, s
                conn.close()
                assert px.bytes == 3 * len(body), px.bytes
                print("LatencyProxy: chunked and close-delimited bodies, stale pooled connection retried")
        finally:
            stop.set()
            th.join(2)
            lsock.close()

        # Shutdown with a request held in its delay and an idle client connection.
        with RangeHTTPServer(tmp) as srv:
            px = LatencyProxy(srv.url, latency_s=30)
            idle = socket.create_connection((HOST, px.port), timeout=5)
            outcome = []

            def held():
                try:
                    outcome.append(_request(px.url, path="/" + rel, timeout=10)[0])
                except (OSError, http.client.HTTPException) as e:
                    outcome.append(type(e).__name__)

            t = threading.Thread(target=held, daemon=True)
            t.start()
            time.sleep(0.2)
            t0 = time.monotonic()
            px.close()
            shutdown_s = time.monotonic() - t0
            t.join(5)
            idle.close()
            assert shutdown_s < 2 and not t.is_alive(), shutdown_s
            print(f"LatencyProxy shutdown with a request held in its 30 s delay: {shutdown_s:.3f} s "
                  f"(that client got {outcome[0]})")
    print(f"LatencyProxy check passed in {time.monotonic() - t_all:.1f} s")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["latency"]:  # `python remote_servers.py latency`: the LatencyProxy check only
        _self_check()
    _latency_proxy_check()
