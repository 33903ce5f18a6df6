"""Issue #14 part 3: a fleet given as raw `nvidia-smi topo -m` text per node (the public 8x H100 paste) loads
with each distinct text parsed once and links built once per hardware, and plans in time linear in the nodes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import agents.topo
from bench.plan import H100_PASTE, raw_text_fleet
from placement import Request, load_cluster, load_model, plan
from tests.fixtures import REPO, read_fixture

OTHER_PASTE = REPO / "tests" / "data" / "fixtures" / "topo" / "004_distserve3-8xa100sxm-nv12-4nic.txt"


def test_it_parses_each_distinct_topology_text_once(monkeypatch) -> None:
    calls = []
    real = agents.topo.parse_topology
    monkeypatch.setattr(agents.topo, "parse_topology", lambda text: calls.append(text) or real(text))
    fleet = raw_text_fleet(40)
    other = read_fixture(OTHER_PASTE)[1]
    for node in fleet["nodes"][::4]:
        node["topology"] = other
    cluster = load_cluster(json.loads(json.dumps(fleet)))  # every node holds its own copy of the text
    assert len(cluster.nodes) == 40
    assert sorted(map(len, calls)) == sorted({len(other), len(read_fixture(H100_PASTE)[1])})


def test_it_gives_nodes_that_share_a_text_the_links_each_would_get_alone() -> None:
    fleet = raw_text_fleet(12)
    together = load_cluster(fleet)
    for node in together.nodes:
        alone = load_cluster({"nodes": [next(n for n in fleet["nodes"] if n["name"] == node.name)]})
        assert node.links == alone.nodes[0].links
        assert {link.label for link in node.links.values()} == {"NV18"}


def cpu_seconds(nodes: int) -> float:
    fleet, model = raw_text_fleet(nodes), load_model("Llama-3.1-70B-Instruct")
    start = time.process_time()
    result = plan(model, load_cluster(fleet), Request(max_model_len=8192, concurrency=8))
    result.to_json(limit=10, rejected_limit=10)
    assert result.best is not None
    return time.process_time() - start


def test_it_loads_and_plans_1000_raw_text_nodes_in_linear_cpu_time() -> None:
    small, large = min(cpu_seconds(250) for _ in range(2)), min(cpu_seconds(1000) for _ in range(2))
    assert large < 1.0, f"1,000 nodes took {large:.2f} s of CPU"
    assert large < 6 * small, f"250 nodes {small:.3f} s, 1,000 nodes {large:.3f} s: not linear"


def test_it_answers_the_whole_cli_for_1000_nodes(tmp_path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(raw_text_fleet(1000)), encoding="utf-8")
    argv = [
        sys.executable,
        "-m",
        "placement",
        "plan",
        "--model",
        "Llama-3.1-70B-Instruct",
        "--cluster",
        str(path),
    ]
    done = subprocess.run(
        [*argv, "--limit", "3", "--json"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    best = data["plans"][0]
    assert (best.get("node") or best["nodes"][0]).startswith("h100-") and len(data["plans"]) == 3
