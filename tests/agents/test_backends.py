"""Backend adapters: the argv and env each backend gets, and every launch the agent must refuse."""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path

import pytest

from agents import protocol
from agents.backends import ADAPTERS, LaunchRefused, admit
from agents.backends.base import RankedServerAdapter, gpu_env
from tests.fixtures import fixture_files

EXECUTABLES = ("vllm", "llama-server", "ollama", "python3")


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only fake backend executables, so `shutil.which` finds exactly these."""
    path = tmp_path / "bin"
    path.mkdir()
    for name in EXECUTABLES:
        exe = path / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(path))
    return path


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (root / "qwen2.5-7b").mkdir(parents=True)
    (root / "qwen2.5-7b" / "config.json").write_text("{}")
    (root / "llama-70b.Q4_K_M.gguf").write_bytes(b"GGUF")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.gguf").write_bytes(b"GGUF")
    (root / "escape.gguf").symlink_to(outside / "secret.gguf")
    (root / "inside-link.gguf").symlink_to(root / "llama-70b.Q4_K_M.gguf")
    return root


def launch(**over) -> protocol.Launch:
    """A launch as the server would send it, through the protocol's own validation."""
    command = {
        "type": "launch",
        "v": 1,
        "deployment": "dep-1",
        "backend": "vllm",
        "model": "qwen2.5-7b",
        "gpus": [0],
    }
    command.update(over)
    return protocol.parse_server_command(json.dumps(command))


def argv_for(models: Path, port: int = 8123, **over) -> list[str]:
    command = launch(**over)
    adapter = ADAPTERS[command.backend]
    return adapter.argv(admit(adapter, command, [models]), port)


def test_it_has_one_adapter_per_protocol_backend():
    assert set(ADAPTERS) == set(typing.get_args(protocol.Backend))
    assert all(name == adapter.name for name, adapter in ADAPTERS.items())


def test_it_maps_only_real_launch_options_to_flags_in_the_ranked_server_tables():
    ranked = [adapter for adapter in ADAPTERS.values() if isinstance(adapter, RankedServerAdapter)]
    assert {adapter.name for adapter in ranked} == {"vllm", "sglang"}
    fields = protocol.LaunchOptions.model_fields
    for adapter in ranked:
        assert set(adapter.valued_flags) | set(adapter.switch_flags) <= set(fields), adapter.name
        assert all(fields[name].annotation is bool for name in adapter.switch_flags), adapter.name


# ---- argv per backend ----------------------------------------------------------------------------------
def test_it_builds_the_seed_llamacpp_layer_split_over_four_gpus(bin_dir, models):
    argv = argv_for(
        models,
        backend="llama.cpp",
        model="llama-70b.Q4_K_M.gguf",
        gpus=[0, 1, 2, 3],
        options={"tensor_split": [1, 1, 1, 1], "n_gpu_layers": 81, "max_model_len": 8192, "parallel": 4},
    )
    assert argv == [
        str(bin_dir / "llama-server"),
        "-m",
        str(models / "llama-70b.Q4_K_M.gguf"),
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--metrics",
        "--split-mode",
        "layer",
        "--tensor-split",
        "1,1,1,1",
        "--n-gpu-layers",
        "81",
        "--ctx-size",
        "8192",
        "--parallel",
        "4",
    ]


def test_it_offloads_every_layer_when_llamacpp_gets_gpus_but_no_layer_count(bin_dir, models):
    argv = argv_for(models, backend="llama.cpp", model="llama-70b.Q4_K_M.gguf", gpus=[2])
    assert argv[argv.index("--n-gpu-layers") + 1] == "999"
    assert "--split-mode" not in argv


def test_it_keeps_llamacpp_on_the_cpu_without_gpus(bin_dir, models):
    argv = argv_for(models, backend="llama.cpp", model="llama-70b.Q4_K_M.gguf", gpus=[])
    assert argv[argv.index("--n-gpu-layers") + 1] == "0"


def test_it_builds_a_vllm_tensor_and_pipeline_parallel_command(bin_dir, models):
    argv = argv_for(
        models,
        gpus=[0, 1, 2, 3],
        options={
            "tp": 2,
            "pp": 2,
            "max_model_len": 16384,
            "gpu_memory_utilization": 0.9,
            "kv_cache_dtype": "fp8",
            "dtype": "bfloat16",
            "disable_custom_all_reduce": True,
            "enforce_eager": True,
            "served_model_name": "qwen2.5-7b",
        },
    )
    assert argv == [
        str(bin_dir / "vllm"),
        "serve",
        str(models / "qwen2.5-7b"),
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "2",
        "--max-model-len",
        "16384",
        "--gpu-memory-utilization",
        "0.9",
        "--kv-cache-dtype",
        "fp8",
        "--dtype",
        "bfloat16",
        "--served-model-name",
        "qwen2.5-7b",
        "--disable-custom-all-reduce",
        "--enforce-eager",
    ]


def test_it_leaves_unset_vllm_options_to_vllm(bin_dir, models):
    argv = argv_for(models)
    assert argv[3:] == [
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tensor-parallel-size",
        "1",
        "--pipeline-parallel-size",
        "1",
    ]


def test_it_builds_an_sglang_command_with_metrics_on(bin_dir, models):
    argv = argv_for(
        models,
        backend="sglang",
        gpus=[0, 1],
        options={"tp": 2, "max_model_len": 32768, "gpu_memory_utilization": 0.85, "enforce_eager": True},
    )
    assert argv == [
        str(bin_dir / "python3"),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(models / "qwen2.5-7b"),
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tp-size",
        "2",
        "--pp-size",
        "1",
        "--enable-metrics",
        "--context-length",
        "32768",
        "--mem-fraction-static",
        "0.85",
        "--disable-cuda-graph",
    ]


def test_it_starts_ollama_on_a_private_port_and_loads_the_model_through_its_api(bin_dir, models):
    command = launch(
        backend="ollama",
        model="llama3.2:3b-instruct-q4_K_M",
        gpus=[1, 3],
        options={"max_model_len": 8192, "parallel": 2},
    )
    adapter = ADAPTERS["ollama"]
    admitted = admit(adapter, command, [models])
    assert adapter.argv(admitted, 9000) == [str(bin_dir / "ollama"), "serve"]
    env = adapter.env(admitted, 9000)
    assert env["OLLAMA_HOST"] == "127.0.0.1:9000"
    assert (env["OLLAMA_CONTEXT_LENGTH"], env["OLLAMA_NUM_PARALLEL"], env["OLLAMA_SCHED_SPREAD"]) == (
        "8192",
        "2",
        "1",
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert adapter.load_request(admitted, 9000) == (
        "http://127.0.0.1:9000/api/generate",
        {"model": "llama3.2:3b-instruct-q4_K_M", "keep_alive": -1, "stream": False},
    )
    assert adapter.health_url(9000) == "http://127.0.0.1:9000/api/version"
    assert adapter.metrics_url(9000) == "http://127.0.0.1:9000/api/ps"


def test_it_reads_ollama_counters_from_api_ps(bin_dir):
    ps = {
        "models": [
            {
                "name": "llama3.2:3b",
                "model": "llama3.2:3b",
                "size": 3_000_000_000,
                "size_vram": 3_000_000_000,
                "digest": "abc",
                "expires_at": "2026-01-01T00:00:00Z",
            }
        ]
    }
    counters = ADAPTERS["ollama"].counters(json.dumps(ps))
    assert isinstance(counters, protocol.ServerCounters)


def test_it_runs_llama_cpp_python_through_the_agent_wrapper(models):
    command = launch(
        backend="llama-cpp-python",
        model="llama-70b.Q4_K_M.gguf",
        gpus=[],
        options={"max_model_len": 2048, "threads": 4, "served_model_name": "smol"},
    )
    adapter = ADAPTERS["llama-cpp-python"]
    admitted = admit(adapter, command, [models])
    assert adapter.argv(admitted, 8200) == [
        sys.executable,
        "-m",
        "agents.sim.llamacpp_server",
        "--model",
        str(models / "llama-70b.Q4_K_M.gguf"),
        "--host",
        "127.0.0.1",
        "--port",
        "8200",
        "--n_gpu_layers",
        "0",
        "--verbose",
        "--n_ctx",
        "2048",
        "--n_threads",
        "4",
        "--served_model_name",
        "smol",
    ]
    assert adapter.health_url(8200) == "http://127.0.0.1:8200/health"
    assert adapter.metrics_url(8200) == "http://127.0.0.1:8200/metrics"
    assert str(Path(__file__).resolve().parents[2]) in adapter.env(admitted, 8200)["PYTHONPATH"].split(":")


def test_it_runs_the_simulated_backend_with_the_planned_rate_and_fault(models):
    command = launch(
        backend="simulated",
        model="Qwen/Qwen2.5-7B-Instruct",
        gpus=[0, 1],
        options={"tp": 2, "sim_tokens_per_s": 42.5, "sim_fault": "stall"},
    )
    adapter = ADAPTERS["simulated"]
    argv = adapter.argv(admit(adapter, command, [models]), 8300)
    assert argv == [
        sys.executable,
        "-m",
        "agents.sim.backend",
        "--host",
        "127.0.0.1",
        "--port",
        "8300",
        "--model",
        "Qwen/Qwen2.5-7B-Instruct",
        "--tokens-per-s",
        "42.5",
        "--fault",
        "stall",
        "--tp",
        "2",
    ]
    assert adapter.metrics_url(8300) == "http://127.0.0.1:8300/metrics"


def test_it_binds_to_the_configured_host_but_probes_through_loopback(bin_dir, models):
    adapter = ADAPTERS["vllm"]
    argv = adapter.argv(admit(adapter, launch(), [models]), 8123, host="0.0.0.0")
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert adapter.health_url(8123, host="0.0.0.0") == "http://127.0.0.1:8123/health"


def test_it_sets_the_plan_gpus_and_allow_listed_env(bin_dir, models):
    command = launch(gpus=[2, 3], options={"tp": 2}, env={"NCCL_P2P_DISABLE": "1"})
    env = ADAPTERS["vllm"].env(admit(ADAPTERS["vllm"], command, [models]), 8123)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3", "NCCL_P2P_DISABLE": "1"}
    assert gpu_env([])["CUDA_VISIBLE_DEVICES"] == "-1"


def test_it_accepts_a_symlink_that_stays_inside_the_model_dirs(bin_dir, models):
    argv = argv_for(models, backend="llama.cpp", model="inside-link.gguf")
    assert argv[2] == str(models / "llama-70b.Q4_K_M.gguf")


def test_it_accepts_an_absolute_path_inside_the_model_dirs(bin_dir, models):
    argv = argv_for(models, model=str(models / "qwen2.5-7b"))
    assert argv[2] == str(models / "qwen2.5-7b")


# ---- one launch per node -----------------------------------------------------------------------------------
HEAD = {"tp": 2, "pp": 2, "nnodes": 2, "node_rank": 0, "master_addr": "10.0.0.5", "master_port": 29517}


def test_it_builds_vllm_multiprocessing_multi_node_commands_headless_off_the_head(bin_dir, models):
    head = argv_for(models, gpus=[0, 1], options=HEAD)
    other = argv_for(models, gpus=[0, 1], options={**HEAD, "node_rank": 1})
    flags = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.5", "--master-port", "29517"]
    assert head[-8:] == flags and "--headless" not in head
    assert other[-9:] == [*flags[:3], "1", *flags[4:], "--headless"]


def test_it_builds_sglang_multi_node_commands_with_the_dist_init_address(bin_dir, models):
    argv = argv_for(models, backend="sglang", gpus=[0, 1], options={**HEAD, "node_rank": 1})
    assert argv[-6:] == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.5:29517"]


def test_it_runs_the_simulated_backend_across_nodes(models):
    argv = argv_for(
        models,
        backend="simulated",
        model="m",
        gpus=[0, 1],
        options={**HEAD, "node_rank": 1, "sim_tokens_per_s": 5},
    )
    assert argv[-8:] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.5",
        "--master-port",
        "29517",
    ]


def test_it_only_serves_the_api_on_the_head():
    assert ADAPTERS["vllm"].serves_api(launch(gpus=[0, 1], options=HEAD))
    assert not ADAPTERS["vllm"].serves_api(launch(gpus=[0, 1], options={**HEAD, "node_rank": 1}))


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"node_rank": 2}, "node_rank 2 must be below nnodes 2"),
        ({"master_addr": None}, "needs master_addr"),
        ({"node_rank": 1, "master_port": None}, "needs master_port"),
        ({"master_addr": "10.0.0.5; reboot"}, "master_addr"),
        ({"master_addr": "-oProxyCommand"}, "master_addr"),
    ],
)
def test_it_refuses_multi_node_options_that_do_not_add_up(over, words):
    with pytest.raises(protocol.ProtocolError, match=words):
        launch(gpus=[0, 1], options={**HEAD, **over})


# ---- refusals --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("over", "words"),
    [
        (
            {"model": "../outside/secret.gguf", "backend": "llama.cpp"},
            "outside the allowed model directories",
        ),
        ({"model": "escape.gguf", "backend": "llama.cpp"}, "outside the allowed model directories"),
        ({"model": "qwen2.5-7b/../../outside/secret.gguf", "backend": "llama.cpp"}, "outside the allowed"),
        ({"model": "/etc/passwd"}, "outside the allowed model directories"),
        ({"model": "missing-model"}, "does not exist under the allowed model directories"),
        ({"model": "qwen2.5-7b", "backend": "llama.cpp"}, "must be a model file"),
        ({"gpus": [0, 1, 2, 3], "options": {"tp": 2}}, "tp 2 x pp 1 = 2 ranks, but the launch names 4 GPUs"),
        ({"backend": "sglang", "gpus": [0], "options": {"tp": 2, "pp": 2}}, "tp 2 x pp 2 = 4 ranks"),
        ({"gpus": [0, 1], "options": {"tp": 2, "tensor_split": [1, 1, 1]}}, "tensor_split has 3 entries"),
        ({"gpus": [1, 1], "options": {"tp": 2}}, "names a GPU twice"),
        ({"backend": "ollama", "model": "-rf"}, "not a plain model name"),
        ({"backend": "ollama", "model": "library/../etc"}, "not a plain model name"),
        (
            {"backend": "simulated", "model": "/abs/path", "options": {"sim_tokens_per_s": 5}},
            "not a plain model name",
        ),
        ({"backend": "simulated", "model": "m"}, "sim_tokens_per_s is required"),
        (
            {
                "backend": "simulated",
                "model": "m",
                "options": {"sim_tokens_per_s": 5, "sim_fault": "nccl-init-hang"},
            },
            "needs tp >= 2",
        ),
        (
            {"gpus": [0, 1, 2, 3], "options": HEAD},
            "tp 2 x pp 2 = 4 ranks, but the launch names 4 GPUs [0, 1, 2, 3] on each of 2 nodes",
        ),
        (
            {"backend": "llama.cpp", "model": "llama-70b.Q4_K_M.gguf", "gpus": [0, 1], "options": HEAD},
            "cannot launch llama.cpp across nodes",
        ),
        (
            {"backend": "ollama", "model": "llama3", "gpus": [0, 1], "options": HEAD},
            "cannot launch ollama across nodes",
        ),
    ],
)
def test_it_refuses_launches_that_break_the_node_rules(bin_dir, models, over, words):
    command = launch(**over)
    with pytest.raises(LaunchRefused) as exc:
        admit(ADAPTERS[command.backend], command, [models])
    assert words in exc.value.reason


def test_it_refuses_a_backend_whose_executable_is_not_installed(tmp_path, models, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LaunchRefused, match="executable 'vllm' is not installed"):
        admit(ADAPTERS["vllm"], launch(), [models])


def test_it_refuses_model_paths_when_no_model_dir_is_configured(bin_dir):
    with pytest.raises(LaunchRefused, match="no model directories configured"):
        admit(ADAPTERS["vllm"], launch(model="/models/qwen"), [])


@pytest.mark.parametrize(
    "model", ["m; rm -rf /", "$(reboot)", "`id`", "a b", "x|y", "x&y", "x>y", "m\nn", ""]
)
def test_it_never_lets_shell_metacharacters_through_the_protocol(model):
    with pytest.raises(protocol.ProtocolError, match="model"):
        launch(model=model)


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"argv": ["--trust-remote-code"]}, "argv"),
        ({"env": {"LD_PRELOAD": "/tmp/evil.so"}}, "env"),
        ({"env": {"NCCL_DEBUG": "INFO; reboot"}}, "env"),
        ({"backend": "bash"}, "backend"),
        ({"options": {"served_model_name": "a b"}}, "served_model_name"),
    ],
)
def test_it_never_lets_extra_argv_or_odd_env_through_the_protocol(over, words):
    with pytest.raises(protocol.ProtocolError, match=words):
        launch(**over)


# ---- loading progress ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("backend", "line", "progress"),
    [
        (
            "vllm",
            "(VllmWorker rank=0 pid=5) Loading safetensors checkpoint shards:  40% Completed | 2/5 "
            "[00:01<00:01,  1.50it/s]",
            0.4,
        ),
        (
            "vllm",
            "INFO 10-24 13:17:40 [gpu_model_runner.py:1770] Starting to load model /models/qwen...",
            0.0,
        ),
        ("vllm", "INFO 10-24 13:20:07 [default_loader.py:314] Loading weights took 145.32 seconds", 1.0),
        ("vllm", "INFO 10-24 13:20:07 [api_server.py:1] Started server process", None),
        ("sglang", "[2025-02-27 04:40:01 TP0] Load weight begin. avail mem=78.5 GB", 0.0),
        (
            "sglang",
            "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:09<00:00,  2.31s/it]",
            1.0,
        ),
        (
            "sglang",
            "[2025-02-27 04:40:12 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16",
            1.0,
        ),
        ("llama.cpp", "load_tensors: loading model tensors, this can take a while... (mmap = true)", 0.0),
        ("llama.cpp", "." * 37, 0.37),
        ("llama.cpp", "main: model loaded", 1.0),
        ("llama.cpp", "srv  update_slots: all slots are idle", None),
        ("ollama", 'time=2025-01-01T00:00:00 level=DEBUG msg="model load progress 0.42"', 0.42),
        ("ollama", 'time=2025-01-01T00:00:05 level=INFO msg="llama runner started in 2.01 seconds"', 1.0),
        (
            "llama-cpp-python",
            "INFO llama-cpp-python 0.3.16 (llama.cpp engine) loading model /m.gguf: n_ctx=2048",
            0.0,
        ),
        ("llama-cpp-python", "INFO Model smol loaded in 1.52 s", 1.0),
        (
            "simulated",
            "(EngineCore_0 pid=7) Loading safetensors checkpoint shards:  75% Completed | 3/4 [00:01<?, ?it/s]",
            0.75,
        ),
    ],
)
def test_it_reads_weight_loading_progress_from_log_lines(backend, line, progress):
    found = ADAPTERS[backend].loading_progress(line)
    assert found == (pytest.approx(progress) if progress is not None else None)


def test_it_finds_weight_loading_done_in_a_real_vllm_log():
    body = fixture_files("logs", "041_*")[0].read_text().partition("\n---\n")[2]
    seen = [p for p in map(ADAPTERS["vllm"].loading_progress, body.splitlines()) if p is not None]
    assert seen and set(seen) == {1.0}
