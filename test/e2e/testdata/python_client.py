"""Drives a real daemon with clients/python/runrecordd.py (python_client_test.go).

The environment says where and with what: RR_SOCKET (the operator's unix
socket) or RR_ADDR, RR_CERT, RR_KEY, RR_PIN (a platform key over mTLS);
RR_AGENT and RR_ORACLE, the images; RR_PREFIX, the run ids' prefix;
RR_WANT_EVENTS, the event kinds each run must show on the stream. It
prints one JSON object, what it saw; any failure raises (exit 1).
"""

import json
import os
import threading
import time

from runrecordd import Client, PinError, RunrecorddError

env = os.environ
if "RR_SOCKET" in env:
    c = Client.unix(env["RR_SOCKET"])
else:
    c = Client.tls(env["RR_ADDR"], env["RR_CERT"], env["RR_KEY"], env["RR_PIN"])
prefix = env["RR_PREFIX"]
grants = {"milli_cpu": 1000, "memory_bytes": 256 << 20, "network": "none"}
out = {}


def until(what, fn, timeout=60):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError("waiting for " + what)
        time.sleep(0.05)


def phase(run_id):
    return c.show(run_id)["run"]["phase"]


doc = c.openapi()
assert doc["openapi"].startswith("3.1"), doc["openapi"]
has_logs = "/v1/runs/{id}/logs" in doc["paths"]

# The events of our runs, from before they start.
events = []
ready = threading.Event()


def follow():
    stream = c.events()
    ready.set()
    for e in stream:
        if e["run"].startswith(prefix):
            events.append(e)


threading.Thread(target=follow, daemon=True).start()
ready.wait(10)
time.sleep(0.5)  # the stream's status is in: it is subscribed

# A transcript agent: it dispatches call-1 and parks awaiting it; the
# result resumes it, and it finishes.
agent = prefix + "-agent"
r = c.run({"image": env["RR_AGENT"], "mode": "transcript", "env": ["STEPS=1", "WORK_ITERS=1000"]}, grants, run_id=agent)
assert r["id"] == agent and r["mode"] == "transcript", r
until("the agent's park", lambda: phase(agent) == "parked")
mine = [x for x in c.calls() if x["run"] == agent]
assert [x["id"] for x in mine] == ["call-1"] and mine[0]["payload"] is not None, mine
posted = c.post(agent, "call-1", {"artifact": "sha256:py"})
assert posted["call"] == "call-1" and posted.get("resumed"), posted
until("the agent's close", lambda: phase(agent) == "closed")
v = c.verify(agent)
assert v["ok"] and v["segments"] >= 3, v
out["agent_segments"] = v["segments"]

if has_logs:
    text = "".join(line.get("text", "") for line in c.logs(agent))
    assert "done" in text, text
    out["logs"] = "read"
else:
    try:
        list(c.logs(agent))
        raise AssertionError("logs answered without the route")
    except RunrecorddError as e:
        assert e.status in (403, 404), e.status
    out["logs"] = "not served"

# An image-mode oracle with a secret: parked, resumed (the secret given
# again), closed by the client.
oracle = prefix + "-oracle"
c.run({"image": env["RR_ORACLE"], "env": ["SIZE_MB=64", "VERIFY_EVERY=5", "SECRET_FILE=/run/secrets/K"]}, grants,
      run_id=oracle, secrets={"K": "py-value"})
assert c.show(oracle)["grants"]["secrets"] == ["K"]
p = c.park(oracle)
assert p["run"]["phase"] == "parked" and p["snapshot"], p["run"]
try:
    c.resume(oracle, secrets={"OTHER": "x"})
    raise AssertionError("a resume with a secret the run does not name went ahead")
except RunrecorddError as e:
    assert (e.code, e.status) == ("secrets_required", 422), (e.code, e.status)
res = c.resume(oracle, secrets={"K": "py-value"})
assert res["run"]["phase"] == "executing", res["run"]
out["secrets"] = "given"
closed = c.close(oracle, "python client")
assert closed["phase"] == "closed", closed
assert c.verify(oracle)["ok"]
assert [x["id"] for x in c.list("closed") if x["id"].startswith(prefix)] != []

# Refusals are typed.
try:
    c.show(prefix + "-none")
    raise AssertionError("a run that does not exist was shown")
except RunrecorddError as e:
    assert (e.code, e.status) == ("not_found", 404), (e.code, e.status)
if "RR_ADDR" in env:
    try:
        c.host()
        raise AssertionError("a platform key got the host's facts")
    except RunrecorddError as e:
        assert (e.code, e.status) == ("forbidden", 403), (e.code, e.status)
    wrong = Client.tls(env["RR_ADDR"], env["RR_CERT"], env["RR_KEY"], "00" * 32)
    try:
        wrong.list()
        raise AssertionError("a server not holding the pinned key was believed")
    except PinError:
        out["pin"] = "refused"

want = set(env.get("RR_WANT_EVENTS", "run.started run.parked run.resumed run.closed").split())
for run_id in (agent, oracle):
    got = lambda: {e["kind"] for e in events if e["run"] == run_id}
    try:
        until("the events of " + run_id, lambda: want <= got(), 10)
    except AssertionError:
        raise AssertionError(f"{run_id}: events {sorted(got())}, want {sorted(want)}") from None
out["events"] = sorted({e["kind"] for e in events})
print(json.dumps(out))
