"""The exporter's HTTP server: /metrics (prometheus_client exposition), /health, a landing page;
optional TLS and basic auth.

A threading server of our own rather than prometheus_client.start_http_server, for the extra
endpoints, TLS handshakes done in the connection's thread (a slow client cannot stall
accept()), and authentication. /health is left open so probes need no credentials; it says
nothing but whether the exporter is polling its log, which collectors are stuck, and (503)
whether a /metrics collection has run past the exporter's `metrics_stall_seconds`.
"""

import base64
import errno
import gzip
import hashlib
import hmac
import html
import json
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.exposition import choose_encoder

from collbench import __version__
from collbench.errors import UserError

log = logging.getLogger("collbench.exporter")

DEFAULT_LISTEN = "0.0.0.0:9105"


def parse_listen(value, source="--listen"):
    """HOST:PORT, [v6]:PORT or :PORT -> (host, port); UserError naming the value otherwise."""
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{source}: got {value!r}, expected HOST:PORT with a port 1-65535 "
                        f"(e.g. {DEFAULT_LISTEN}, 127.0.0.1:9105, [::]:9105)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


class BasicAuth:
    """Checks `Authorization: Basic` in constant time (digests compared, so lengths do not leak)."""

    def __init__(self, user, password):
        self._user = hashlib.sha256(user.encode()).digest()
        self._password = hashlib.sha256(password.encode()).digest()

    def check(self, header):
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        ok_user = hmac.compare_digest(hashlib.sha256(user.encode()).digest(), self._user)
        ok_password = hmac.compare_digest(hashlib.sha256(password.encode()).digest(), self._password)
        return ok_user and ok_password


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"     # keep-alive: Prometheus reuses its connection
    server_version = f"collbench-exporter/{__version__}"
    sys_version = ""                  # no Python version in the Server header
    timeout = 30                      # an idle or stalled client frees its thread
    # A response is one write (see _send); no Nagle so it leaves at once even when it is
    # several segments long.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        if log.isEnabledFor(logging.DEBUG):     # called on every request: format only when shown
            log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, code, body, content_type, extra_headers=()):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra_headers:
            self.send_header(k, v)
        # Headers and body in one write (end_headers would send the headers on their own):
        # one syscall and one segment train, and the client wakes once per response.
        parts = getattr(self, "_headers_buffer", [])     # none for an HTTP/0.9 request
        if parts:
            parts.append(b"\r\n")
        if self.command != "HEAD":
            parts.append(body)
        self._headers_buffer = []
        self.wfile.write(b"".join(parts))

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        app = self.server.app
        if url.path == "/health":
            ok, detail = app.health()
            age = self.server.collection_age()
            limit = getattr(app, "metrics_stall_seconds", None)
            if limit is not None and age is not None and age > limit:
                # /health must not say 200 while /metrics cannot answer
                ok = False
                detail.update(status="unhealthy", reason=f"a /metrics collection has not finished for {age:.1f} s "
                                                         f"(limit {limit:g} s)")
            self._send(200 if ok else 503, (json.dumps(detail, sort_keys=True) + "\n").encode(),
                       "application/json")
            return
        auth = self.server.auth
        if auth is not None and not auth.check(self.headers.get("Authorization")):
            self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                       [("WWW-Authenticate", 'Basic realm="collbench exporter", charset="UTF-8"')])
            return
        if url.path == "/metrics":
            self._metrics(url)
        elif url.path == "/":
            self._send(200, landing_page(app).encode(), "text/html; charset=utf-8")
        else:
            self._send(404, b"Not found: try /metrics or /health\n", "text/plain; charset=utf-8")

    def do_POST(self):
        self._send(405, b"Method not allowed\n", "text/plain; charset=utf-8", [("Allow", "GET, HEAD")])

    def _metrics(self, url):
        registry = self.server.app.registry
        names = urllib.parse.parse_qs(url.query).get("name[]")
        encoder, content_type = choose_encoder(self.headers.get("Accept"))
        if names:
            body = encoder(_OnlyNames(registry, names))
        else:
            body = self.server.render(encoder, content_type)
        headers = []
        if "gzip" in (self.headers.get("Accept-Encoding") or "") and len(body) > 1024:
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        self._send(200, body, content_type, headers)


class Coalescer:
    """Concurrent scrapes share one collection: a scrape waits for the collection in flight to
    end and then joins the next one, so every scrape gets data collected after it arrived, and
    twenty scrapers arriving together cost two collections, not twenty (sysfs reads, ethtool)."""

    def __init__(self, produce):
        self.produce = produce
        self._cond = threading.Condition()
        self._started = 0        # collections started
        self._done = 0           # collections finished
        self._running = False
        self._result = None      # (value, exception) of the newest finished collection
        self.running_since = None    # monotonic start of the collection in flight

    def age(self):
        """Seconds the collection in flight has run, None when there is none."""
        since = self.running_since
        return None if since is None else time.monotonic() - since

    def get(self):
        with self._cond:
            target = self._started + 1          # the first collection to start after our arrival
            while self._done < target:
                if not self._running:
                    self._running = True
                    self._started += 1
                    self.running_since = time.monotonic()
                    self._cond.release()
                    try:
                        try:
                            result = (self.produce(), None)
                        except Exception as e:   # noqa: BLE001 -- handed to every waiter
                            result = (None, e)
                    finally:
                        self._cond.acquire()
                    self._result = result
                    self._running = False
                    self.running_since = None
                    self._done += 1
                    self._cond.notify_all()
                else:
                    self._cond.wait()
            value, error = self._result
        if error is not None:
            raise error
        return value


class FamilyTextReuse:
    """The text exposition of a fresh collection, encoded one family at a time by
    prometheus_client's encoder; a family equal to the one of the same name in the previous
    collection (name, type, help, unit and every sample: labels, value, timestamp) gets that
    encoding's bytes again instead of being formatted anew. Every value is still read on this
    scrape: only the formatting of an unchanged family is skipped, and the bytes are those the
    encoder gives for the whole registry (the text format is per family, with no trailer; not
    for OpenMetrics, which ends in '# EOF'). Formatting is ~2/3 of a scrape's CPU, and most
    counters (error counters, idle ports, settled results) do not move between scrapes.
    Called by one Coalescer only, so one collection at a time."""

    def __init__(self, encoder):
        self.encoder = encoder
        self._previous = {}      # family name -> (family, its encoded bytes)

    def __call__(self, registry):
        parts = []
        current = {}
        for fam in registry.collect():
            prev = self._previous.get(fam.name)
            if prev is not None and _same_family(prev[0], fam):
                text = prev[1]
            else:
                text = self.encoder(_OneFamily(fam))
            current[fam.name] = (fam, text)
            parts.append(text)
        self._previous = current
        return b"".join(parts)


def _same_family(a, b):
    # NaN != NaN: a NaN sample is always formatted anew, which is merely slower.
    return (a.name == b.name and a.type == b.type and a.documentation == b.documentation
            and a.unit == b.unit and a.samples == b.samples)


class _OneFamily:
    def __init__(self, family):
        self.family = family

    def collect(self):
        return (self.family,)


class _OnlyNames:
    """`/metrics?name[]=X`: only the named families. Scrape-time collectors have no describe(),
    so prometheus_client's restricted_registry cannot pick them; filter what they yield."""

    def __init__(self, registry, names):
        self.registry = registry
        self.names = set(names)

    def collect(self):
        for fam in self.registry.collect():
            full = fam.name + "_total" if fam.type == "counter" else fam.name
            if fam.name in self.names or full in self.names:
                yield fam


def landing_page(app):
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in app.describe().items())
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>collbench exporter</title></head>"
            "<body><h1>collbench exporter</h1>"
            "<p>MPI collective benchmark results and RDMA/ECN/PFC congestion counters for Prometheus.</p>"
            "<ul><li><a href=\"/metrics\">/metrics</a></li><li><a href=\"/health\">/health</a></li></ul>"
            f"<table>{rows}</table><p>collbench {html.escape(__version__)}</p></body></html>\n")


class ExporterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address, app, tls_context=None, auth=None):
        host, port = address
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise UserError(f"cannot listen on {host}:{port}: {host!r} is not a local address "
                            f"or resolvable name ({e.strerror})") from None
        self.address_family = infos[0][0]
        self.app = app
        self.tls_context = tls_context
        self.auth = auth
        self._renderers = {}
        self._renderers_lock = threading.Lock()
        try:
            super().__init__(infos[0][4][:2], _Handler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"cannot listen on {host}:{port}: address already in use (another exporter? "
                                "9105 is also the Mesos exporter's port: set exporter.listen or --listen)") from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise UserError(f"cannot listen on {host}:{port}: {host} is not an address of this host") from None
            if e.errno == errno.EACCES:
                raise UserError(f"cannot listen on {host}:{port}: permission denied (ports below 1024 need root)") from None
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None

    def render(self, encoder, content_type):
        """The exposition in this format, from a collection shared with concurrent scrapes."""
        with self._renderers_lock:
            c = self._renderers.get(content_type)
            if c is None:
                registry = self.app.registry
                if content_type.startswith("text/plain"):
                    encoder = FamilyTextReuse(encoder)
                c = self._renderers[content_type] = Coalescer(lambda: encoder(registry))
        return c.get()

    def collection_age(self):
        """Seconds the oldest /metrics collection in flight has run, None when none is."""
        with self._renderers_lock:
            ages = [a for a in (c.age() for c in self._renderers.values()) if a is not None]
        return max(ages) if ages else None

    def server_bind(self):
        if self.address_family == socket.AF_INET6:
            # [::] serves IPv4 too unless the host forbids dual stack.
            try:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            except OSError:
                pass
        super().server_bind()

    def finish_request(self, request, client_address):
        # Runs in the connection's thread: the TLS handshake here cannot block other clients.
        if self.tls_context is not None:
            request.settimeout(_Handler.timeout)
            try:
                request = self.tls_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as e:
                log.debug("TLS handshake with %s failed: %s", client_address[0], e)
                return
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        log.debug("connection from %s ended with an error", client_address[0], exc_info=True)

    @property
    def port(self):
        return self.server_address[1]


def tls_context(cert, key):
    """Server TLS context (TLS 1.2+); UserError naming the file when it cannot be loaded."""
    for what, path in (("tls_cert", cert), ("tls_key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise UserError(f"exporter.{what}: cannot read {path}: {e.strerror}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as e:
        raise UserError(f"exporter.tls_cert/tls_key: {cert} and {key} are not a matching PEM "
                        f"certificate and key ({e.reason or e})") from None
    return ctx
