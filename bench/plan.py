"""Time the placement planner on fleets of 1, 100 and 1,000 nodes of 8 GPUs.

    .venv/bin/python bench/plan.py [--model Llama-3.1-70B-Instruct] [--repeat 3]

Fleets mix four node types (8x H100 SXM NV18, 8x A100 SXM NV12, 8x L40S as two 4-GPU sockets, 8x RTX
4090 all SYS) with network links. Two load patterns:
  * "typical": 30 % of nodes run other work (used memory varies per GPU), the rest are idle;
  * "all distinct": every node has different free memory, so no two nodes share a plan (worst case).
Reported: best wall time of `plan()` over --repeat runs, plus rendering the top 10 plans as JSON.

`--cli` times the whole command instead, `python -m placement plan --cluster FILE` in a fresh interpreter
(start-up, imports, reading the JSON, parsing every node's topology, planning, printing), on fleets of 8x H100
nodes whose `topology` is the raw `nvidia-smi topo -m` text of a public 8x H100 paste (fixture
036_penny-8xh100-nv18-13nic-ib-eth-unindented), as the cluster schema allows; 30 % of nodes are busy.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
H100_PASTE = (
    REPO / "tests" / "data" / "fixtures" / "topo" / "036_penny-8xh100-nv18-13nic-ib-eth-unindented.txt"
)
CLI_SIZES = (100, 250, 500, 1000)

from placement import Request, load_cluster, load_model, plan  # noqa: E402

NODE_TYPES = [  # (GPU name, MiB, link inside a socket, link across sockets, network Gb/s, RDMA)
    ("NVIDIA H100 80GB HBM3", 81559, "NV18", "NV18", 400, True),
    ("NVIDIA A100-SXM4-80GB", 81920, "NV12", "NV12", 200, True),
    ("NVIDIA L40S", 46068, "NODE", "SYS", 100, False),
    ("NVIDIA GeForce RTX 4090", 24564, "SYS", "SYS", 25, False),
]


def _topology(inside: str, across: str) -> dict[str, Any]:
    links = [
        {"a": f"GPU{a}", "b": f"GPU{b}", "link": inside if a // 4 == b // 4 else across}
        for a in range(8)
        for b in range(a + 1, 8)
    ]
    gpus = [{"name": f"GPU{i}", "cpu_affinity": None, "numa_affinity": str(i // 4)} for i in range(8)]
    return {"kind": "matrix", "mode": None, "gpus": gpus, "nics": [], "links": links}


def fleet(nodes: int, pattern: str, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    built = []
    for n in range(nodes):
        name, mib, inside, across, gbps, rdma = NODE_TYPES[n % len(NODE_TYPES)]
        busy = pattern == "all distinct" or rng.random() < 0.3
        gpus = []
        for i in range(8):
            used = rng.uniform(0.02, 0.5) * mib if busy else 0.0
            gpus.append(
                {"index": i, "name": name, "memory_total_mib": mib, "memory_free_mib": round(mib - used)}
            )
        built.append(
            {
                "name": f"node-{n:04d}",
                "gpus": gpus,
                "topology": _topology(inside, across),
                "network_gbps": gbps,
                "rdma": rdma,
                "address": f"10.1.{n // 256}.{n % 256}",
            }
        )
    return {"nodes": built}


def time_plan(model_ref: str, nodes: int, pattern: str, repeat: int) -> tuple[float, float, int, int]:
    cluster = load_cluster(fleet(nodes, pattern))
    model = load_model(model_ref)
    request = Request(max_model_len=8192, concurrency=8)
    best_plan = best_json = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = plan(model, cluster, request)
        middle = time.perf_counter()
        result.to_json(limit=10, rejected_limit=10)
        end = time.perf_counter()
        best_plan, best_json = min(best_plan, middle - start), min(best_json, end - middle)
    return best_plan, best_json, len(result.plans), len(result.rejected)


def raw_text_fleet(nodes: int, seed: int = 7) -> dict[str, Any]:
    """8x H100 nodes, each with its own copy of the public paste as raw text."""
    paste = H100_PASTE.read_text(encoding="utf-8").partition("\n---\n")[2]
    rng = random.Random(seed)
    built = []
    for n in range(nodes):
        busy = rng.random() < 0.3
        gpus = [
            {
                "index": i,
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total_mib": 81559,
                "memory_free_mib": round(81559 * (1 - rng.uniform(0.02, 0.5))) if busy else 81559,
            }
            for i in range(8)
        ]
        built.append(
            {"name": f"h100-{n:04d}", "gpus": gpus, "topology": paste, "network_gbps": 400, "rdma": True}
        )
    return {"nodes": built}


def time_cli(model_ref: str, nodes: int, repeat: int) -> tuple[float, int]:
    """Best wall time of the whole `python -m placement plan` command, and its exit code."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.json"
        path.write_text(json.dumps(raw_text_fleet(nodes)), encoding="utf-8")
        argv = [sys.executable, "-m", "placement", "plan", "--model", model_ref, "--cluster", str(path)]
        argv += ["--max-model-len", "8192", "--concurrency", "8", "--limit", "10"]
        best, code = float("inf"), 0
        for _ in range(repeat):
            start = time.perf_counter()
            code = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=False).returncode
            best = min(best, time.perf_counter() - start)
    return best, code


def main_cli(model_ref: str, repeat: int) -> int:
    print(f"whole CLI, model {model_ref}, 8x H100 nodes with raw topo text, best of {repeat}")
    print(f"{'nodes':>6s} {'wall s':>8s} {'per node ms':>12s} {'exit':>5s}")
    for nodes in CLI_SIZES:
        wall, code = time_cli(model_ref, nodes, repeat)
        print(f"{nodes:6d} {wall:8.3f} {wall / nodes * 1e3:12.3f} {code:5d}")
    return 0


def main() -> int:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Llama-3.1-70B-Instruct")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--cli", action="store_true", help="time the whole `python -m placement plan` command"
    )
    args = parser.parse_args()
    if args.cli:
        return main_cli(args.model, args.repeat)
    print(f"model {args.model}, 8 GPUs per node, best of {args.repeat}")
    print(
        f"{'pattern':13s} {'nodes':>6s} {'plan() s':>9s} {'per node ms':>12s} {'top-10 JSON s':>14s} "
        f"{'plans':>6s} {'rejected':>9s}"
    )
    for pattern in ("typical", "all distinct"):
        for nodes in (1, 100, 1000):
            planning, rendering, plans, rejected = time_plan(args.model, nodes, pattern, args.repeat)
            print(
                f"{pattern:13s} {nodes:6d} {planning:9.3f} {planning / nodes * 1e3:12.2f} {rendering:14.3f} "
                f"{plans:6d} {rejected:9d}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
