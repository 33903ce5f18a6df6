"""Divisibility, link and network checks for one layout (memory checks live in memory*.py)."""

from __future__ import annotations

from placement.cluster import ESTIMATED, estimated_speed
from placement.dtypes import HF
from placement.layout import Layout
from placement.links import CROSS_SOCKET, NETWORK, UNKNOWN, Link
from placement.memory import Issue
from placement.request import FAMILY, LLAMA_CPP, Settings
from placement.spec import ModelSpec

QUANT_GROUP = 128  # AWQ/GPTQ group size: each TP shard of a row-parallel weight needs whole groups


def divisibility_problems(model: ModelSpec, layout: Layout, settings: Settings) -> list[Issue]:
    tp, pp = layout.tp, layout.pp
    problems = []
    if pp > model.num_layers:
        problems.append(Issue("divisibility", f"PP={pp} exceeds the model's {model.num_layers} layers"))
    if FAMILY[settings.backend] != HF or tp == 1:
        return problems
    checks = [
        (model.num_heads % tp, f"{model.num_heads} attention heads"),
        (
            model.num_kv_heads % tp and tp % model.num_kv_heads,
            f"{model.num_kv_heads} KV heads (TP must divide them, or be a multiple of them so heads replicate)",
        ),
        (
            model.vocab_size % tp,
            f"vocabulary of {model.vocab_size:,} (GPUStack's rule; vLLM pads the vocabulary)",
        ),
        (model.intermediate_size % tp, f"MLP width {model.intermediate_size:,}"),
    ]
    if model.is_moe and model.moe_intermediate_size:
        checks.append((model.moe_intermediate_size % tp, f"expert width {model.moe_intermediate_size:,}"))
    if settings.fmt.name in ("awq", "gptq", "int4"):
        width = (model.moe_intermediate_size or model.intermediate_size) // tp
        checks.append(
            (
                width % QUANT_GROUP,
                f"{settings.fmt.name} groups of {QUANT_GROUP} (each shard of the MLP is {width} wide)",
            )
        )
    problems += [
        Issue("divisibility", f"TP={tp} does not divide the {what}") for failed, what in checks if failed
    ]
    return problems


def vision_tp_problem(model: ModelSpec, layout: Layout, encoder_data_mode: bool) -> Issue | None:
    """vLLM shards the ViT by TP unless `--mm-encoder-tp-mode data`; its heads must divide."""
    v = model.vision
    if v is None or layout.tp == 1 or v.num_heads % layout.tp == 0 or encoder_data_mode:
        return None
    return Issue(
        "divisibility",
        f"TP={layout.tp} does not divide the vision tower's {v.num_heads} heads; add "
        "--mm-encoder-tp-mode data to replicate the tower on every GPU instead",
    )


def link_risks(layout: Layout) -> list[Issue]:
    risks = []
    for stage, link in enumerate(layout.tp_links):
        if link is None or link.kind == NETWORK or not link.without_p2p:
            continue
        names = ", ".join(f"GPU{g.index}" for g in layout.stages[stage])
        if link.kind == UNKNOWN:
            risks.append(
                Issue(
                    "link",
                    f"TP group {names}: the node reported no topology, so NVLink/P2P cannot "
                    "be confirmed; if the pairs lack P2P, NCCL may hang: run `nvidia-smi topo -m`",
                )
            )
            continue
        place = "across CPU sockets " if link.kind == CROSS_SOCKET else ""
        risks.append(
            Issue(
                "link",
                f"TP group {names} all-reduces {place}over {link.describe()}: NCCL hang risk. "
                "Fixes: NCCL_P2P_DISABLE=1, --disable-custom-all-reduce, check that ACS and the "
                "IOMMU are off (iommu=pt), or use pipeline parallelism across this link instead",
            )
        )
    return risks


def numa_risks(layout: Layout) -> list[Issue]:
    risks = []
    for stage in layout.stages:
        domains = {g.numa for g in stage if g.numa is not None}
        if len(domains) > 1:
            names = ", ".join(f"GPU{g.index} (NUMA {g.numa})" for g in stage)
            risks.append(
                Issue(
                    "numa",
                    f"TP group {names} spans NUMA nodes: every all-reduce crosses the "
                    "socket interconnect; prefer GPUs of one NUMA node, or pin the server with "
                    "`numactl --cpunodebind` to the node of the first GPU",
                )
            )
    return risks


def estimated_speed_risks(layout: Layout) -> list[Issue]:
    unknown = sorted({(g.node, g.name) for g in layout.gpus if g.model == ESTIMATED})
    if not unknown:
        return []
    names = ", ".join(f"'{name}' ({node})" for node, name in unknown)
    bw, tflops = estimated_speed()
    return [
        Issue(
            "estimated_speed",
            f"GPU {names} is not in the built-in GPU table: its memory is what the node "
            f"reported, but its speed is assumed ({bw:g} GB/s, {tflops:g} TFLOPS, the slowest GPUs in the "
            "table), so the predicted tokens/s is a floor; add the GPU to placement/data/gpus.csv (or give "
            "mem_bw_gbs and bf16_tflops in a cluster file) for a real prediction",
        )
    ]


def network_issues(layout: Layout) -> tuple[list[Issue], list[Issue]]:
    """(problems, risks) of a multi-node layout."""
    if not layout.multi_node:
        return [], []
    problems, risks = [], []
    unknown_tp = spanning_tp_without_network(layout)
    if unknown_tp:
        problems.append(
            Issue(
                "network",
                f"TP group {unknown_tp} spans nodes that give no network_gbps: its 2 all-reduces per layer "
                "per token would cross a network of unknown speed, which is never free (a measured 2-node "
                "TP=2 run was 5.4x slower than a plan that ignored it); give each node's network_gbps, or "
                "keep TP inside a node and use PP across nodes",
            )
        )
    if any(link is not None and link.kind == NETWORK for link in layout.tp_links):
        problems.append(
            Issue(
                "network",
                "a TP group spans nodes: 2 all-reduces per layer per token over the "
                "network; keep TP inside a node and use PP across nodes",
            )
        )
    if None in layout.boundaries:
        problems.append(
            Issue("network", "a node gives no network_gbps, so the link between nodes is unknown")
        )
    slow = [link for link in layout.boundaries if link is not None and link.kind == NETWORK]
    if slow and not all("RDMA" in link.label for link in slow):
        risks.append(_slow_network(layout.backend, min(slow, key=lambda link: link.busbw_gbs)))
    return problems, risks


def spanning_tp_without_network(layout: Layout) -> str | None:
    """The GPUs of the first TP group that spans nodes whose network is not described, else None."""
    for stage, link in zip(layout.stages, layout.tp_links, strict=True):
        if link is None and len({gpu.node for gpu in stage}) > 1:
            return " + ".join(gpu.label for gpu in stage)
    return None


def _slow_network(backend: str, link: Link) -> Issue:
    if backend == LLAMA_CPP:
        return Issue(
            "network",
            f"llama.cpp RPC hands activations over {link.label} by TCP and rpc-server has no "
            "authentication: keep it on a private interface; RPC adds a round trip per stage per token",
        )
    return Issue(
        "network",
        f"stages hand off over {link.label} without RDMA: NCCL falls back to TCP sockets; set "
        "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to the interface that links the nodes (multi-NIC hosts "
        "otherwise pick the wrong one and hang)",
    )
