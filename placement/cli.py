"""Command line: `plan` prints ranked plans, `check` judges an operator's own command.

Exit codes: 0 a plan exists / the command is feasible, 2 no plan fits / the command is infeasible,
1 bad input (with a message naming what is wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn

from placement.check import CheckResult, check_command
from placement.cluster import load_cluster
from placement.errors import PlacementError
from placement.plans import plan
from placement.request import Request
from placement.result import PlanResult, shape_text, where_text
from placement.spec import load_model


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _gpu_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1,2, got '{text}'") from exc


def _parser() -> Parser:
    parser = Parser(prog="python -m placement", description="Plan where and how to run a model on GPUs.")
    sub = parser.add_subparsers(dest="action", required=True, parser_class=Parser)
    p = sub.add_parser("plan", help="ranked plans for a model on a cluster")
    p.add_argument(
        "--model", required=True, help="catalog name / HF id, config.json or its folder, or a .gguf"
    )
    p.add_argument("--cluster", required=True, help="cluster JSON file")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--dtype", help="bf16, fp16, fp8, int8, int4, awq, gptq, mxfp4, Q4_K_M, Q8_0, F16 ...")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--backend", help="vllm, sglang, llama.cpp, ollama")
    p.add_argument("--tp", type=int)
    p.add_argument("--pp", type=int)
    p.add_argument("--gpus", type=_gpu_list, help="use exactly these GPU indices")
    p.add_argument("--node")
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument(
        "--decode-context", type=int, help="tokens in context while decoding (default: half the length)"
    )
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument(
        "--backend-version", help="vLLM release that will serve, e.g. 0.7.3 (selects its non-torch memory)"
    )
    p.add_argument(
        "--split-mode",
        default="layer",
        choices=["layer", "row", "tensor"],
        help="llama.cpp split mode (row is deprecated, tensor experimental)",
    )
    p.add_argument("--limit", type=int, help="show at most this many plans and rejections")
    p.add_argument("--json", action="store_true")
    c = sub.add_parser(
        "check", help="judge a command line: check --cluster C.json [--visible 0,1] -- vllm serve ..."
    )
    c.add_argument("--cluster", required=True)
    c.add_argument("--visible", help="CUDA_VISIBLE_DEVICES for the command (default: the environment's)")
    c.add_argument("--node")
    c.add_argument("--concurrency", type=int)
    c.add_argument("--json", action="store_true")
    c.add_argument("command", nargs=argparse.REMAINDER)
    return parser


def _request(args: argparse.Namespace) -> Request:
    return Request(
        max_model_len=args.max_model_len,
        concurrency=args.concurrency,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        backend=args.backend,
        tp=args.tp,
        pp=args.pp,
        gpus=args.gpus,
        node=args.node,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        decode_context=args.decode_context,
        enforce_eager=args.enforce_eager,
        split_mode=args.split_mode,
        backend_version=args.backend_version,
    )


def _issues(items: list[dict[str, str]]) -> str:
    return "; ".join(f"[{i['code']}] {i['message']}" for i in items)


def _plan_lines(result: PlanResult, data: dict[str, Any]) -> list[str]:
    lines = [f"{data['model']['name']}: {len(result.plans)} plan(s), {data['rejected_total']} rejected"]
    for rank, (c, p) in enumerate(zip(result.plans, data["plans"], strict=False), 1):
        risks = ",".join(sorted({r["code"] for r in p["risks"]})) or "-"
        lines.append(
            f"{rank:>3}. {shape_text(c)} on {where_text(c)}: weights {p['weights_gib_per_gpu']:.1f} "
            f"GiB/GPU, peak {max(p['memory_gib_per_gpu']):.1f} GiB, KV {p['kv_cache_tokens']:,} tok, "
            f"decode {p['decode_tok_s']:.1f}/stream {p['decode_tok_s_total']:.0f} total, prefill "
            f"{p['prefill_tok_s']:.0f} tok/s, risks {risks}"
        )
    if data["plans"]:
        best = data["plans"][0]
        lines += ["", f"why: {best['why']}", f"run: {best['command']}"]
        lines += [f"on {node}: {line}" for node, line in best.get("node_commands", {}).items()]
        lines += [f"risk: [{r['code']}] {r['message']}" for r in best["risks"]]
    if data["rejected"]:
        lines.append("\nrejected:")
        lines += [
            f"  node {r['node']} (left out): {_issues(r['problems'])}"
            for r in data["rejected"]
            if "backend" not in r
        ]
        configs = [r for r in data["rejected"] if "backend" in r]
        for c, r in zip(result.rejected, configs, strict=False):
            lines.append(f"  {shape_text(c)} on {where_text(c)}: {_issues(r['problems'])}")
    return lines


def _check_lines(result: CheckResult, data: dict[str, Any]) -> list[str]:
    verdict = "feasible" if data["feasible"] else "NOT feasible"
    lines = [f"{verdict}: {shape_text(result.candidate)} on {where_text(result.candidate)}"]
    if data["memory_gib_per_gpu"]:
        lines.append(f"memory per GPU (GiB): {', '.join(f'{m:.1f}' for m in data['memory_gib_per_gpu'])}")
    if data["decode_tok_s"] is not None:
        lines.append(
            f"predicted: decode {data['decode_tok_s']:.1f} tok/s per stream, {data['decode_tok_s_total']:.0f} "
            f"in total, prefill {data['prefill_tok_s']:.0f} tok/s"
        )
    lines += [f"problem: [{p['code']}] {p['message']}" for p in data["problems"]]
    lines += [f"risk: [{r['code']}] {r['message']}" for r in data["risks"]]
    lines += [f"note: {n}" for n in data["notes"]]
    if data["suggestion"]:
        best = data["suggestion"]
        lines += ["", f"suggestion: {best['why']}", f"run: {best['command']}"]
    return lines


def _run_plan(args: argparse.Namespace) -> int:
    result = plan(load_model(args.model), load_cluster(args.cluster), _request(args))
    data = result.to_json(limit=args.limit, rejected_limit=args.limit)
    print(json.dumps(data, indent=2) if args.json else "\n".join(_plan_lines(result, data)))
    return 0 if result.plans else 2


def _run_check(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise PlacementError("check needs the command after `--`, e.g. -- vllm serve MODEL ...")
    result = check_command(
        command,
        load_cluster(args.cluster),
        visible=args.visible,
        env=dict(os.environ),
        node=args.node,
        concurrency=args.concurrency,
    )
    data = result.to_json()
    print(json.dumps(data, indent=2) if args.json else "\n".join(_check_lines(result, data)))
    return 0 if result.feasible else 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run_plan(args) if args.action == "plan" else _run_check(args)
    except PlacementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
