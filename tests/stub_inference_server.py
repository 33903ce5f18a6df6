"""A tiny stand-in inference server for supervisor tests: vLLM-style load lines, /health, /metrics.

`python -m tests.stub_inference_server --port P --model NAME [--load-seconds S] [--spam N]
[--ignore-sigterm] [--worker]`. /metrics serves the real vLLM scrape from tests/data/fixtures/metrics plus
live counters that POST /v1/completions moves (5 tokens and one finished request per call).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.fixtures import fixture_files, read_fixture

SHARDS = 4


class Counters:
    def __init__(self, model: str) -> None:
        self.model = model
        self.tokens = 0
        self.finished = 0
        self.lock = threading.Lock()
        self.fixture = read_fixture(fixture_files("metrics", "vllm_metrics.txt")[0])[1]

    def complete(self) -> None:
        with self.lock:
            self.tokens += 5
            self.finished += 1

    def exposition(self) -> str:
        label = f'model_name="{self.model}"'
        return (
            self.fixture.rstrip("\n") + "\n"
            f"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{{label}}} {self.tokens}\n"
            f"# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{finished_reason="stop",{label}}} {self.finished}\n'
        )


def handler(counters: Counters) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(200, "text/plain", "")
            elif self.path == "/metrics":
                self.answer(200, "text/plain; version=0.0.4", counters.exposition())
            else:
                self.answer(404, "text/plain", "not found")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/completions":
                self.answer(404, "text/plain", "not found")
                return
            counters.complete()
            self.answer(200, "application/json", json.dumps({"choices": [{"text": "hello"}]}))

        def answer(self, status: int, kind: str, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            print(f"INFO stub: {format % args}", flush=True)

    return Handler


def load(seconds: float) -> None:
    print("INFO stub: Starting to load model stub...", flush=True)
    for done in range(SHARDS + 1):
        time.sleep(seconds / SHARDS if done else 0)
        # tqdm's way: redraw the bar with a carriage return, newline only at the end
        end = "\n" if done == SHARDS else ""
        print(
            f"\rLoading safetensors checkpoint shards: {100 * done // SHARDS:3d}% Completed | {done}/{SHARDS} "
            f"[00:00<00:00, 1.00it/s]",
            end=end,
            flush=True,
        )


def spam(per_second: int) -> None:
    count = 0
    while True:
        count += 1
        print(f"INFO stub: filler line {count:08d} " + "x" * 60, flush=True)
        time.sleep(1 / per_second)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.stub_inference_server")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", required=True)
    p.add_argument("--load-seconds", type=float, default=0.4)
    p.add_argument("--spam", type=int, default=0, help="filler log lines per second")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--worker", action="store_true", help="start a worker process in the same process group")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: print("INFO stub: ignoring SIGTERM", flush=True))
    if args.worker:
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"INFO stub: worker pid={worker.pid}", flush=True)
    load(args.load_seconds)
    if args.spam:
        threading.Thread(target=spam, args=(args.spam,), daemon=True).start()
    server = ThreadingHTTPServer((args.host, args.port), handler(Counters(args.model)))
    print(f"INFO stub: serving on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
