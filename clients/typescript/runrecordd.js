// A client of runrecordd's HTTP/JSON API for Node (18 or later), on
// Node's own modules only (http, tls, crypto): copy runrecordd.js and
// runrecordd.d.ts next to your code. Two transports (docs/clients.md):
//
//   Client.unix("/var/lib/runrecordd/runrecordd.sock")          // the operator
//   Client.tls("host:7443", certPem, keyPem, hostPublicKeyHex)  // a platform key
//
// Every method resolves to the decoded JSON answer (pkg/api/openapi.json
// describes it) or rejects with a RunrecorddError carrying the API's code.

import http from "node:http";
import tls from "node:tls";
import { X509Certificate } from "node:crypto";

export const DEFAULT_SOCKET = "/var/lib/runrecordd/runrecordd.sock";

// The routes this client calls, as the OpenAPI document names them
// (TestTypeScriptClient checks each is there).
export const routes = {
  run: "POST /v1/runs",
  list: "GET /v1/runs",
  show: "GET /v1/runs/{id}",
  park: "POST /v1/runs/{id}/park",
  resume: "POST /v1/runs/{id}/resume",
  close: "POST /v1/runs/{id}/close",
  verify: "GET /v1/runs/{id}/verify",
  waitProof: "GET /v1/runs/{id}/wait-proof",
  calls: "GET /v1/calls",
  post: "POST /v1/runs/{id}/calls/{call}/result",
  events: "GET /v1/events",
  logs: "GET /v1/runs/{id}/logs",
  host: "GET /v1/host",
  openapi: "GET /v1/openapi.json",
};

// An ed25519 SubjectPublicKeyInfo is these 12 bytes, then the 32 key bytes.
const ED25519_SPKI_PREFIX = Buffer.from("302a300506032b6570032100", "hex");

export class RunrecorddError extends Error {
  constructor(code, message, status = 0, body = {}) {
    super(`${message} (${code})`);
    this.name = "RunrecorddError";
    this.code = code;
    this.status = status;
    this.body = body;
  }
}

export class PinError extends Error {
  constructor(message) {
    super(message);
    this.name = "PinError";
  }
}

// publicKeyOf is the raw ed25519 key of a DER certificate, from its own
// SubjectPublicKeyInfo; it throws for any other key.
export function publicKeyOf(der) {
  const spki = new X509Certificate(der).publicKey.export({ type: "spki", format: "der" });
  if (spki.length !== 44 || !spki.subarray(0, 12).equals(ED25519_SPKI_PREFIX)) {
    throw new PinError("the server's certificate key is not ed25519");
  }
  return spki.subarray(12);
}

const runPath = (id, suffix = "") => "/v1/runs/" + encodeURIComponent(id) + suffix;

export class Client {
  // connect(options) is http.request's options for one request.
  constructor(options) {
    this.options = options;
  }

  static unix(socketPath = DEFAULT_SOCKET) {
    return new Client({ socketPath });
  }

  // tls is a platform key's client of the mutual-TLS listener at address
  // ("host:port"): it presents certPem/keyPem (`runrecordd fleet key
  // --tls-out DIR` writes them) and accepts only a server holding
  // hostPublicKey (64 hex digits: `runrecordd fleet key --public`).
  static tls(address, certPem, keyPem, hostPublicKey) {
    const pin = Buffer.from(hostPublicKey, "hex");
    if (pin.length !== 32) throw new TypeError("hostPublicKey: want 32 bytes, 64 hex digits");
    const i = address.lastIndexOf(":");
    const host = address.slice(0, i).replace(/^\[|\]$/g, "");
    const port = Number(address.slice(i + 1));
    // No CA signs these certificates: the pin is the whole trust. The
    // request goes out only once the handshake is done (it proved the
    // server holds its certificate's key) and that key is the pinned one.
    const createConnection = (_opts, done) => {
      const s = tls.connect({ host, port, cert: certPem, key: keyPem, minVersion: "TLSv1.3", rejectUnauthorized: false, servername: "" });
      let called = false;
      const once = (err, sock) => {
        if (!called) {
          called = true;
          done(err, sock);
        }
      };
      s.once("error", (err) => once(err));
      s.once("secureConnect", () => {
        let got;
        try {
          got = publicKeyOf(s.getPeerCertificate(true).raw);
        } catch (err) {
          s.destroy();
          return once(err instanceof PinError ? err : new PinError(String(err)));
        }
        if (!got.equals(pin)) {
          s.destroy();
          return once(new PinError(`server key ${got.toString("hex")} is not the pinned ${pin.toString("hex")}`));
        }
        once(null, s);
      });
      return undefined;
    };
    return new Client({ host, port, createConnection, protocol: "http:" });
  }

  // open sends a request and resolves to its 2xx response (a stream).
  open(method, path, body) {
    return new Promise((resolve, reject) => {
      const headers = {};
      let data;
      if (body !== undefined) {
        data = Buffer.from(JSON.stringify(body));
        headers["Content-Type"] = "application/json";
        headers["Content-Length"] = data.length;
      }
      // A connection per request: with createConnection (mTLS) Node
      // uses no agent; the socket's gets a fresh one (agent: false).
      const agent = this.options.createConnection ? undefined : false;
      const req = http.request({ ...this.options, method, path, headers, agent }, (res) => {
        if (Math.floor(res.statusCode / 100) === 2) return resolve(res);
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => {
          const raw = Buffer.concat(chunks).toString();
          try {
            const e = JSON.parse(raw);
            if (typeof e.code !== "string") throw new Error();
            reject(new RunrecorddError(e.code, e.error ?? "", res.statusCode, e));
          } catch {
            reject(new RunrecorddError("internal", `daemon answered ${res.statusCode}: ${raw.slice(0, 200)}`, res.statusCode));
          }
        });
        res.on("error", reject);
      });
      req.on("error", reject);
      req.end(data);
    });
  }

  async call(method, path, body) {
    const res = await this.open(method, path, body);
    const chunks = [];
    for await (const c of res) chunks.push(c);
    return JSON.parse(Buffer.concat(chunks).toString());
  }

  // lines yields each JSON line of a streamed answer.
  async *lines(path) {
    const res = await this.open("GET", path);
    let buf = "";
    try {
      for await (const c of res) {
        buf += c.toString();
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i).trim();
          buf = buf.slice(i + 1);
          if (line) yield JSON.parse(line);
        }
      }
    } finally {
      res.destroy();
    }
  }

  run(unit, grants = {}, id, secrets) {
    const req = id ? { id, unit, grants } : { unit, grants };
    if (secrets && Object.keys(secrets).length) req.secrets = secrets;
    return this.call("POST", "/v1/runs", req);
  }
  list(phase) {
    return this.call("GET", "/v1/runs" + (phase ? "?phase=" + encodeURIComponent(phase) : ""));
  }
  show(id) {
    return this.call("GET", runPath(id));
  }
  park(id) {
    return this.call("POST", runPath(id, "/park"));
  }
  resume(id, secrets) {
    const body = secrets && Object.keys(secrets).length ? { secrets } : undefined;
    return this.call("POST", runPath(id, "/resume"), body);
  }
  close(id, reason = "") {
    return this.call("POST", runPath(id, "/close"), { reason });
  }
  verify(id) {
    return this.call("GET", runPath(id, "/verify"));
  }
  waitProof(id) {
    return this.call("GET", runPath(id, "/wait-proof"));
  }
  calls() {
    return this.call("GET", "/v1/calls");
  }
  post(id, call, result) {
    return this.call("POST", runPath(id, "/calls/" + encodeURIComponent(call) + "/result"), result);
  }
  // events yields the host's transitions as they happen, until the caller
  // stops iterating (break) or the daemon stops.
  events() {
    return this.lines("/v1/events");
  }
  // logs yields a run's output lines across parks and resumes (GET
  // /v1/runs/{id}/logs); an error line throws.
  async *logs(id, { follow = false, tail, since } = {}) {
    const q = new URLSearchParams();
    if (follow) q.set("follow", "true");
    if (tail !== undefined) q.set("tail", String(tail));
    if (since !== undefined) q.set("since", since);
    const s = q.toString();
    for await (const line of this.lines(runPath(id, "/logs") + (s ? "?" + s : ""))) {
      if (line.error) throw new RunrecorddError(line.error.code ?? "internal", line.error.error ?? "", 0, line.error);
      yield line;
    }
  }
  host() {
    return this.call("GET", "/v1/host");
  }
  openapi() {
    return this.call("GET", "/v1/openapi.json");
  }
}
