#!/usr/bin/env python3
"""Load through a URL with the TypeSafe SDK, as an application sends it (tools/reliability/balancers.py).

Run by balancers.py with a Python that has `typesafe-sdk` (tools/sdk/README.md makes such a venv):
CLIENTS threads, each its own `TypeSafeClient(base_url=URL)` (one pooled keep-alive connection, the
SDK's default timeout, compression and model), sending `system_one` calls one after another for
SECONDS. The SDK's own retries are off (`RetryPolicy(max_retries=0)`): a failure here is one the
balancer let through, not one the SDK hid by asking again. Writes one JSON record per call to --out:
start and end (epoch seconds), `ok`, and for a failure the SDK's error class, status and message.
"""

import argparse
import json
import threading
import time

import typesafe_sdk as ts

STATES = [
    "I was charged twice for invoice 4411, please refund it today.",
    "The app crashes every time I open the settings page.",
    "Can I upgrade my plan to the team tier before the end of the month?",
    "My parcel arrived damaged and the box was open.",
]


def questions():
    return {
        "queue": ts.Choice(instructions="Which queue?", criteria={"billing": "payment problems", "tech": "technical issue", "other": None}),
        "urgency": ts.Score(instructions="How urgent is this?", criteria=["not urgent", "urgent", "critical"]),
        "refund": ts.Noul(instructions="Does the customer ask for a refund?"),
    }


def client_loop(url: str, index: int, deadline: float, records: list, lock: threading.Lock) -> None:
    client = ts.TypeSafeClient(base_url=url, api_key="unused-by-an-open-layad", retry=ts.RetryPolicy(max_retries=0))
    qs = questions()
    n = 0
    try:
        while time.time() < deadline:
            state = STATES[(index + n) % len(STATES)]
            n += 1
            start = time.time()
            record = {"client": index, "start": start}
            try:
                response = client.system_one(state=state, questions=qs)
                # A well-formed answer, not only a 200: the SDK parsed it into its types.
                record["ok"] = set(response.answers) == set(qs)
                if not record["ok"]:
                    record["error"] = f"answers {sorted(response.answers)}"
            except ts.TypeSafeError as error:
                record.update(ok=False, error=type(error).__name__, status=getattr(error, "status", None),
                              message=str(error)[:300])
            record["end"] = time.time()
            with lock:
                records.append(record)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    records: list = []
    lock = threading.Lock()
    deadline = time.time() + args.seconds
    threads = [threading.Thread(target=client_loop, args=(args.url, i, deadline, records, lock)) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with open(args.out, "w") as out:
        json.dump({"sdk": ts.__version__, "records": sorted(records, key=lambda r: r["start"])}, out)


if __name__ == "__main__":
    main()
