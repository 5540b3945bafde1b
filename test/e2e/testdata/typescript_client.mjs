// Drives a real daemon with clients/typescript/runrecordd.js
// (typescript_client_test.go), as testdata/python_client.py does with the
// Python client: the same environment (RR_SOCKET or RR_ADDR, RR_CERT,
// RR_KEY, RR_PIN; RR_AGENT, RR_ORACLE, RR_PREFIX, RR_WANT_EVENTS and
// RR_CLIENT, the client's path). It prints one JSON object, what it saw;
// any failure throws (exit 1).

import { readFileSync } from "node:fs";
import assert from "node:assert/strict";

const { Client, PinError, RunrecorddError } = await import(process.env.RR_CLIENT);
const env = process.env;
const tlsMode = "RR_ADDR" in env;
const c = tlsMode
  ? Client.tls(env.RR_ADDR, readFileSync(env.RR_CERT), readFileSync(env.RR_KEY), env.RR_PIN)
  : Client.unix(env.RR_SOCKET);
const prefix = env.RR_PREFIX;
const grants = { milli_cpu: 1000, memory_bytes: 256 << 20, network: "none" };
const out = {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(what, fn, timeout = 60000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > deadline) throw new Error("waiting for " + what);
    await sleep(50);
  }
}
const phase = async (id) => (await c.show(id)).run.phase;
async function refused(p, code, status) {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof RunrecorddError, String(e));
    assert.deepEqual([e.code, e.status], [code, status]);
    return;
  }
  assert.fail(`not refused: want ${code}`);
}

const doc = await c.openapi();
assert.match(doc.openapi, /^3\.1/);
const hasLogs = "/v1/runs/{id}/logs" in doc.paths;

// The events of our runs, from before they start.
const events = [];
const stream = c.events();
(async () => {
  for await (const e of stream) if (e.run.startsWith(prefix)) events.push(e);
})().catch(() => {});
await sleep(500);

const agent = prefix + "-agent";
const r = await c.run({ image: env.RR_AGENT, mode: "transcript", env: ["STEPS=1", "WORK_ITERS=1000"] }, grants, agent);
assert.equal(r.id, agent);
assert.equal(r.mode, "transcript");
await until("the agent's park", async () => (await phase(agent)) === "parked");
const mine = (await c.calls()).filter((x) => x.run === agent);
assert.deepEqual(mine.map((x) => x.id), ["call-1"]);
const posted = await c.post(agent, "call-1", { artifact: "sha256:ts" });
assert.equal(posted.call, "call-1");
assert.ok(posted.resumed, JSON.stringify(posted));
await until("the agent's close", async () => (await phase(agent)) === "closed");
const v = await c.verify(agent);
assert.ok(v.ok && v.segments >= 3, JSON.stringify(v));
out.agent_segments = v.segments;

if (hasLogs) {
  let text = "";
  for await (const line of c.logs(agent)) text += line.text ?? "";
  assert.match(text, /done/);
  out.logs = "read";
} else {
  try {
    for await (const _ of c.logs(agent)); // eslint-disable-line no-unused-vars
    assert.fail("logs answered without the route");
  } catch (e) {
    assert.ok(e instanceof RunrecorddError && [403, 404].includes(e.status), String(e));
  }
  out.logs = "not served";
}

const oracle = prefix + "-oracle";
await c.run({ image: env.RR_ORACLE, env: ["SIZE_MB=64", "VERIFY_EVERY=5", "SECRET_FILE=/run/secrets/K"] }, grants, oracle, { K: "ts-value" });
assert.deepEqual((await c.show(oracle)).grants.secrets, ["K"]);
const p = await c.park(oracle);
assert.equal(p.run.phase, "parked");
assert.ok(p.snapshot);
await assert.rejects(c.resume(oracle, { OTHER: "x" }), (e) => e.code === "secrets_required" && e.status === 422);
assert.equal((await c.resume(oracle, { K: "ts-value" })).run.phase, "executing");
out.secrets = "given";
assert.equal((await c.close(oracle, "typescript client")).phase, "closed");
assert.ok((await c.verify(oracle)).ok);
assert.ok((await c.list("closed")).some((x) => x.id === oracle));

await refused(c.show(prefix + "-none"), "not_found", 404);
if (tlsMode) {
  await refused(c.host(), "forbidden", 403);
  const wrong = Client.tls(env.RR_ADDR, readFileSync(env.RR_CERT), readFileSync(env.RR_KEY), "00".repeat(32));
  await assert.rejects(wrong.list(), PinError);
  out.pin = "refused";
}

const want = (env.RR_WANT_EVENTS ?? "run.started run.parked run.resumed run.closed").split(" ");
for (const id of [agent, oracle]) {
  const got = () => new Set(events.filter((e) => e.run === id).map((e) => e.kind));
  try {
    await until("events", () => want.every((k) => got().has(k)), 10000);
  } catch {
    throw new Error(`${id}: events ${[...got()].sort()}, want ${want}`);
  }
}
out.events = [...new Set(events.map((e) => e.kind))].sort();
console.log(JSON.stringify(out));
process.exit(0);
