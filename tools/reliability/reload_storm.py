"""The reload storm of issue 39: `layad serve` on the fixture checkpoints (pool `cpu` of
single-threaded workers), 16 closed-loop clients posting the golden `multi_five_questions_mixed`
request, and rounds of 20 SIGHUP reloads 0.5 s apart (2 s pause between rounds), cycling through
four configurations so that every kind of pool change happens under traffic, often before the
previous one has settled:
  0: pool `cpu` 2 -> 3 workers (scaled), pool `extra` removed;
  1: pool `cpu` 3 -> 2 workers (scaled);
  2: pool `cpu` with 2 threads per worker (replaced: its successor warms while it serves), pool
     `extra` (1 worker) added;
  3: pool `cpu` back to 1 thread (replaced again).
Runs at least ROUNDS rounds and until at least MIN_REQUESTS (default 0) were answered. Prints the
answers by status (JSON) and the first non-200s; the supervisor's log is left in WORK_DIR/layad.log
(grep 'lost a job' for retries spent).

usage: reload_storm.py REPO_ROOT LAYAD_BINARY WORKER_BINARY_DIR PORT ROUNDS WORK_DIR [MIN_REQUESTS]
"""
import http.client, json, os, signal, subprocess, sys, threading, time, collections

root, layad, bindir, port, rounds, work = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
min_requests = int(sys.argv[7]) if len(sys.argv) > 7 else 0
os.makedirs(work, exist_ok=True)
cases = json.load(open(f"{root}/tests/fixtures/goldens/cases.json"))["cases"]
body = next(c["body"] for c in cases if c["name"] == "multi_five_questions_mixed").encode()
config = f"{work}/layad.toml"
def write(step):
    workers, threads, extra = [(3, 1, False), (2, 1, False), (2, 2, True), (2, 1, True)][step % 4]
    extra_pool = """
[[pool]]
name = "extra"
device = "cpu"
workers = 1
threads = 1
""" if extra else ""
    open(config, "w").write(f"""[server]
request_timeout = "60s"
[workers]
binary_dir = "{bindir}"
socket_dir = "{work}/sockets"
[[pool]]
name = "cpu"
device = "cpu"
workers = {workers}
threads = {threads}
{extra_pool}""")
write(1)
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
done = 0
while done < rounds or sum(statuses.values()) < min_requests:
    done += 1
    for i in range(20):
        write(i)
        os.kill(server.pid, signal.SIGHUP)
        time.sleep(0.5)
    time.sleep(2)
stop.set()
for t in threads: t.join()
server.send_signal(signal.SIGTERM); server.wait(timeout=60)
total = sum(statuses.values())
print(json.dumps({"total": total, "statuses": {str(k): v for k, v in statuses.items()}, "rounds": done, "reloads": 20 * done}))
for b in bad[:20]: print(b)
