"""The reload storm of issue 39: `layad serve` on the fixture checkpoints (one CPU pool of
single-threaded workers), 16 closed-loop clients posting the golden `multi_five_questions_mixed`
request, and ROUNDS rounds of 20 SIGHUP reloads 0.5 s apart that toggle the pool between 3 and 2
workers (2 s pause between rounds). Prints the answers by status (JSON) and the first non-200s;
the supervisor's log is left in WORK_DIR/layad.log (grep 'lost a job' for retries spent).

usage: reload_storm.py REPO_ROOT LAYAD_BINARY WORKER_BINARY_DIR PORT ROUNDS WORK_DIR
"""
import http.client, json, os, signal, subprocess, sys, threading, time, collections

root, layad, bindir, port, rounds, work = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
os.makedirs(work, exist_ok=True)
cases = json.load(open(f"{root}/tests/fixtures/goldens/cases.json"))["cases"]
body = next(c["body"] for c in cases if c["name"] == "multi_five_questions_mixed").encode()
config = f"{work}/layad.toml"
def write(workers):
    open(config, "w").write(f"""[server]
request_timeout = "60s"
[workers]
binary_dir = "{bindir}"
socket_dir = "{work}/sockets"
[[pool]]
name = "cpu"
device = "cpu"
workers = {workers}
threads = 1
""")
write(2)
env = dict(os.environ, HF_HOME=f"{root}/tests/fixtures/hf-cache", HF_HUB_OFFLINE="1")
env = {k: v for k, v in env.items() if not k.startswith("LAYA_")}
log = open(f"{work}/layad.log", "w")
server = subprocess.Popen([layad, "serve", "--config", config, "--listen", f"127.0.0.1:{port}"], env=env, stdout=log, stderr=log)
def ready():
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", "/readyz")
        return c.getresponse().status == 200
    except Exception:
        return False
deadline = time.time() + 120
while not ready():
    assert time.time() < deadline and server.poll() is None, "not ready"
    time.sleep(0.2)
statuses = collections.Counter(); bad = []; stop = threading.Event(); lock = threading.Lock()
def client():
    conn = None
    while not stop.is_set():
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/v1/systemone", body, {"content-type": "application/json"})
            r = conn.getresponse(); text = r.read()
            with lock:
                statuses[r.status] += 1
                if r.status != 200: bad.append((r.status, r.getheader("retry-after"), text[:200]))
        except Exception as e:
            conn = None
            with lock:
                statuses["exception"] += 1; bad.append(("exception", None, repr(e)))
threads = [threading.Thread(target=client) for _ in range(16)]
for t in threads: t.start()
time.sleep(1)
for rnd in range(rounds):
    for i in range(20):
        write(3 if i % 2 == 0 else 2)
        os.kill(server.pid, signal.SIGHUP)
        time.sleep(0.5)
    time.sleep(2)
stop.set()
for t in threads: t.join()
server.send_signal(signal.SIGTERM); server.wait(timeout=60)
total = sum(statuses.values())
print(json.dumps({"total": total, "statuses": {str(k): v for k, v in statuses.items()}, "rounds": rounds}))
for b in bad[:20]: print(b)
