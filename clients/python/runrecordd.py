"""A client of runrecordd's HTTP/JSON API, on the standard library only.

Two transports (docs/clients.md):

    Client.unix("/var/lib/runrecordd/runrecordd.sock")    # the operator
    Client.tls("host:7443", "platform/cert.pem", "platform/key.pem",
               host_public_key="5a35...")                   # a platform key

Every method returns the decoded JSON answer (dicts and lists, as
pkg/api/openapi.json describes them) or raises RunrecorddError, whose
`code` is one of the API's stable codes.
"""

import http.client
import json
import socket
import ssl
import urllib.parse

__all__ = ["Client", "RunrecorddError", "PinError", "DEFAULT_SOCKET"]

DEFAULT_SOCKET = "/var/lib/runrecordd/runrecordd.sock"

# An ed25519 SubjectPublicKeyInfo is these 12 bytes, then the 32 key bytes.
_ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


class RunrecorddError(Exception):
    """A refusal: the API's error body (code, message, and keys, segment,
    signer when the code has them) and the HTTP status."""

    def __init__(self, code, message, status=0, body=None):
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message
        self.status = status
        self.body = body or {}


class PinError(ssl.SSLError):
    """The server's certificate does not carry the pinned host key."""


def _der(buf, i):
    """The DER element at buf[i:]: (tag, content start, end)."""
    if i + 2 > len(buf):
        raise ValueError("truncated DER")
    tag, n = buf[i], buf[i + 1]
    i += 2
    if n & 0x80:
        k = n & 0x7F
        if k == 0 or k > 4 or i + k > len(buf):
            raise ValueError("bad DER length")
        n = int.from_bytes(buf[i:i + k], "big")
        i += k
    if i + n > len(buf):
        raise ValueError("truncated DER")
    return tag, i, i + n


def certificate_public_key(der):
    """The raw ed25519 public key of a DER certificate: the 32 bytes of
    its tbsCertificate's subjectPublicKeyInfo (RFC 5280), nothing found
    elsewhere in it. Raises ValueError for any other certificate."""
    tag, start, end = _der(der, 0)  # Certificate
    if tag != 0x30 or end != len(der):
        raise ValueError("not a certificate")
    tag, i, tbs_end = _der(der, start)  # tbsCertificate
    if tag != 0x30:
        raise ValueError("not a certificate")
    tag, _, after = _der(der, i)
    if tag == 0xA0:  # [0] version
        i = after
    # serialNumber, signature, issuer, validity, subject
    for want in (0x02, 0x30, 0x30, 0x30, 0x30):
        tag, _, after = _der(der, i)
        if tag != want:
            raise ValueError("not a certificate")
        i = after
    tag, _, after = _der(der, i)  # subjectPublicKeyInfo
    spki = der[i:after]
    if tag != 0x30 or after > tbs_end or len(spki) != 44 or not spki.startswith(_ED25519_SPKI_PREFIX):
        raise ValueError("the certificate's key is not ed25519")
    return spki[12:]


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("runrecordd", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class _PinnedConnection(http.client.HTTPSConnection):
    def __init__(self, host, port, context, pin, timeout):
        super().__init__(host, port, context=context, timeout=timeout)
        self._pin = pin

    def connect(self):
        super().connect()
        # The handshake proved the server holds its certificate's key
        # (TLS 1.3 CertificateVerify); the pin says which key that must be.
        try:
            got = certificate_public_key(self.sock.getpeercert(binary_form=True) or b"")
        except ValueError as e:
            self.close()
            raise PinError(f"server certificate: {e}") from None
        if got != self._pin:
            self.close()
            raise PinError(f"server key {got.hex()} is not the pinned {self._pin.hex()}")


class Client:
    """A client of one daemon. Make it with Client.unix or Client.tls."""

    def __init__(self, connect):
        self._connect = connect  # timeout -> a new connection

    @classmethod
    def unix(cls, path=DEFAULT_SOCKET, timeout=600):
        """The operator's client, on the daemon's unix socket."""
        return cls(lambda t=timeout: _UnixConnection(path, t))

    @classmethod
    def tls(cls, address, cert_file, key_file, host_public_key, timeout=600):
        """A platform key's client of the fleet's mutual-TLS listener at
        address ("host:port"): it presents cert_file/key_file (`runrecordd
        fleet key --tls-out DIR` writes them) and accepts only a server
        holding host_public_key (64 hex digits: `runrecordd fleet key
        --public` on the host)."""
        pin = bytes.fromhex(host_public_key)
        if len(pin) != 32:
            raise ValueError("host_public_key: want 32 bytes, 64 hex digits")
        host, _, port = address.rpartition(":")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        # No CA signs these certificates: the pin (checked on connect) is
        # the whole trust, so the chain, name and date checks are off.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(cert_file, key_file)
        return cls(lambda t=timeout: _PinnedConnection(host.strip("[]"), int(port), ctx, pin, t))

    # -- the transport

    def _open(self, method, path, body=None, content_type=None, timeout=600):
        conn = self._connect(timeout)
        headers = {}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status // 100 != 2:
            raw = resp.read(1 << 20)
            conn.close()
            try:
                e = json.loads(raw)
                code, msg = e["code"], e.get("error", "")
            except (ValueError, KeyError, TypeError):
                e, code, msg = {}, "internal", f"daemon answered {resp.status}: {raw[:200]!r}"
            raise RunrecorddError(code, msg, resp.status, e)
        return conn, resp

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        conn, resp = self._open(method, path, data)
        try:
            return json.loads(resp.read())
        finally:
            conn.close()

    def _lines(self, path):
        conn, resp = self._open("GET", path, timeout=None)
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

    @staticmethod
    def _run(run_id, suffix=""):
        return "/v1/runs/" + urllib.parse.quote(run_id, safe="") + suffix

    # -- runs

    def run(self, unit, grants=None, run_id=None, secrets=None):
        """Start a run of unit ({"image", "args", "env", "mode"}) under
        grants ({"milli_cpu", "memory_bytes", "network", "read_only",
        "limits"}); the daemon names it when run_id is None. secrets
        ({NAME: VALUE}) reach the unit as files /run/secrets/NAME and
        never its record."""
        req = {"unit": unit, "grants": grants or {}}
        if run_id:
            req["id"] = run_id
        if secrets:
            req["secrets"] = secrets
        return self._call("POST", "/v1/runs", req)

    def list(self, phase=None):
        """The runs (those in phase: executing, parked, closed)."""
        q = "?phase=" + urllib.parse.quote(phase) if phase else ""
        return self._call("GET", "/v1/runs" + q)

    def show(self, run_id):
        """A run in full: its segments, energy and wait-proof."""
        return self._call("GET", self._run(run_id))

    def park(self, run_id):
        return self._call("POST", self._run(run_id, "/park"))

    def resume(self, run_id, secrets=None):
        """Resume a parked run; secrets ({NAME: VALUE}) give again the
        values a host lacks (secrets_required)."""
        body = {"secrets": secrets} if secrets else None
        return self._call("POST", self._run(run_id, "/resume"), body)

    def close(self, run_id, reason=""):
        return self._call("POST", self._run(run_id, "/close"), {"reason": reason})

    def verify(self, run_id):
        """The run's record verified from genesis, every object rehashed."""
        return self._call("GET", self._run(run_id, "/verify"))

    def wait_proof(self, run_id):
        return self._call("GET", self._run(run_id, "/wait-proof"))

    # -- outward calls and events

    def calls(self):
        """The outstanding outward calls of every open run."""
        return self._call("GET", "/v1/calls")

    def post(self, run_id, call_id, result):
        """Post a call's result (any JSON value); the last one a parked
        run awaited resumes it."""
        path = self._run(run_id, "/calls/" + urllib.parse.quote(call_id, safe="") + "/result")
        return self._call("POST", path, result)

    def events(self):
        """The host's transitions as they happen, each a dict (time, kind,
        run, ...), until the caller stops iterating or the daemon stops."""
        return self._lines("/v1/events")

    def logs(self, run_id, follow=False, tail=None, since=None):
        """A run's output, each line a dict (interval, stream, time, text
        or base64, or omitted and reason), across parks and resumes;
        follow goes on until the run is closed or handed off; tail keeps
        the last lines; since (RFC 3339) leaves out sealed intervals'
        output recorded before it. An error line raises RunrecorddError."""
        q = {}
        if follow:
            q["follow"] = "true"
        if tail is not None:
            q["tail"] = str(tail)
        if since is not None:
            q["since"] = since
        path = self._run(run_id, "/logs") + ("?" + urllib.parse.urlencode(q) if q else "")
        for line in self._lines(path):
            if line.get("error"):
                e = line["error"]
                raise RunrecorddError(e.get("code", "internal"), e.get("error", ""), 0, e)
            yield line

    def host(self):
        """Who the daemon is (the operator's only)."""
        return self._call("GET", "/v1/host")

    def openapi(self):
        """The API's OpenAPI 3.1 description."""
        return self._call("GET", "/v1/openapi.json")
