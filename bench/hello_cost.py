"""What a known node's hello costs the server, part by part, in one process (issue #13: a restart storm).

    .venv/bin/python bench/hello_cost.py [--nodes 200] [--gpus 8] [--json]

A fresh SQLite database with `--nodes` nodes, each welcomed once with the full hello of the real agent code
(simulated GPUs and their topology), so the server holds every inventory. Then every node says hello again,
as after a restart, twice over: with the full hello (what an agent sends when it has no digest, or an older
agent) and with the digest-only hello. Per hello, the CPU time (`time.process_time`, median over the nodes)
of: the token check (`AgentToken.authenticate_token`), parsing the frame (`protocol.parse_agent_message`),
the database side (`ingest.welcome_node`), and their sum; and per digest-only hello parsed and applied in
batches of 8 and 100 (`ingest.welcome_nodes`). Nothing else runs in the process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import SPEC_BY_GPUS, setup_django, versions  # noqa: E402


def cpu_ms(work) -> tuple[float, object]:
    began = time.process_time()
    result = work()
    return (time.process_time() - began) * 1000, result


def hello_frames(count: int, gpus: int) -> list[str]:
    """Each node's full hello as the real agent builds it."""
    from agents.gpus import make_source
    from agents.runner import Agent

    agents = [
        Agent("http://127.0.0.1:1", "t", make_source(f"{SPEC_BY_GPUS[gpus]},seed={i}")) for i in range(count)
    ]
    return [agent.hello() for agent in agents]


def one_hello(node_id: int, token: str, frame: str) -> dict[str, float]:
    from agents import protocol
    from dashboard import ingest
    from dashboard.models import AgentToken

    token_ms, _ = cpu_ms(lambda: AgentToken.authenticate_token(token))
    parse_ms, hello = cpu_ms(lambda: protocol.parse_agent_message(frame))
    db_ms, _ = cpu_ms(lambda: ingest.welcome_node(node_id, hello))
    return {"token_ms": token_ms, "parse_ms": parse_ms, "welcome_node_ms": db_ms}


def medians(parts: list[dict[str, float]]) -> dict[str, float]:
    out = {key: round(statistics.median(p[key] for p in parts), 2) for key in parts[0]}
    out["total_ms"] = round(statistics.median(sum(p.values()) for p in parts), 2)
    return out


def digest_only(frame: str, digest: str) -> str:
    from agents import protocol

    return protocol.dump_hello(protocol.Hello(**json.loads(frame)).without_inventory(digest))


def digest_only_hellos(issued: list, frames: list[str]) -> tuple[list[dict[str, float]], list[str]]:
    from agents import protocol
    from dashboard.models import Node

    if not hasattr(protocol, "dump_hello"):  # measuring the code from before digest-only hellos
        return [], []
    digests = {n.pk: n.inventory_digest for n in Node.objects.all()}
    short = [digest_only(f, digests[row.node_id]) for (row, _), f in zip(issued, frames, strict=True)]
    return [one_hello(row.node_id, token, f) for (row, token), f in zip(issued, short, strict=True)], short


def batched(issued: list, frames: list[str], size: int) -> float | None:
    """CPU per digest-only hello (parse and database side) when `ingest.welcome_nodes` takes `size` at once."""
    from agents import protocol
    from dashboard import ingest

    if not hasattr(ingest, "welcome_nodes") or not frames:
        return None
    began = time.process_time()
    for at in range(0, len(frames), size):
        chunk = zip(issued[at : at + size], frames[at : at + size], strict=True)
        ingest.welcome_nodes([(row.node_id, protocol.parse_agent_message(f)) for (row, _), f in chunk])
    return round((time.process_time() - began) * 1000 / len(frames), 2)


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="lc-bench-hello-") as tmp:
        setup_django(Path(tmp) / "bench.sqlite3")
        from dashboard.models import AgentToken, Node

        issued = [AgentToken.issue(Node.objects.create(name=f"bench-{i:04d}")) for i in range(args.nodes)]
        frames = hello_frames(args.nodes, args.gpus)
        first = [one_hello(row.node_id, token, f) for (row, token), f in zip(issued, frames, strict=True)]
        full = [one_hello(row.node_id, token, f) for (row, token), f in zip(issued, frames, strict=True)]
        resumed, short = digest_only_hellos(issued, frames)
        in_batches = {size: batched(issued, short, size) for size in (8, 100)}
    return {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "hello_bytes": {"full": len(frames[0]), "digest_only": len(short[0]) if short else None},
        "first_hello": medians(first),
        "known_full_hello": medians(full),
        "known_digest_only_hello": medians(resumed) if resumed else None,  # None: code without them
        "digest_only_batched_ms": in_batches,  # CPU per hello, parse + database, batches of 8 and 100
        "versions": versions(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8, choices=sorted(SPEC_BY_GPUS))
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    result = run(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
