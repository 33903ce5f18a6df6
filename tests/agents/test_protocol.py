import json

import pytest

from agents import protocol


def samples(**over):
    gpu = {
        "index": 0,
        "util_gpu": 50,
        "util_mem": 10,
        "mem_used_mib": 1000,
        "mem_free_mib": 23000,
        "temp_c": 40,
        "power_w": 100,
    }
    msg = {"type": "samples", "v": 1, "seq": 1, "t": 1_700_000_000.0, "gpus": [gpu]}
    msg.update(over)
    return json.dumps(msg)


def test_it_accepts_a_valid_samples_frame():
    message = protocol.parse_agent_message(samples())
    assert isinstance(message, protocol.Samples)
    assert message.gpus[0].util_gpu == 50


@pytest.mark.parametrize(
    ("frame", "code", "words"),
    [
        ("not json", "bad_json", "not JSON"),
        ("[1, 2]", "invalid", "JSON object"),
        ('{"type": "reboot", "v": 1}', "unknown_type", "reboot"),
        (samples(v=2), "bad_version", "version 2"),
        (samples(seq=0), "invalid", "seq"),
        (samples(gpus=[]), "invalid", "gpus"),
        (samples(extra="x"), "invalid", "extra"),
        (samples(gpus=[{"index": 0, "util_gpu": 150}]), "invalid", "util_gpu"),
        ("x" * (protocol.MAX_FRAME_BYTES + 1), "too_large", "exceeds"),
        (
            "€" * (protocol.MAX_FRAME_BYTES // 3 + 1),
            "too_large",
            f"{(protocol.MAX_FRAME_BYTES // 3 + 1) * 3} bytes",
        ),
        ("[" * 100_000 + "]" * 100_000, "bad_json", "nested too deeply"),
        ('{"type": ' + "[" * 900 + "]" * 900 + ', "v": 1}', "unknown_type", "a JSON array"),
        (samples(seq=2**63), "invalid", "seq"),
        (samples(t=float("inf")), "invalid", "t: Input should be a finite number"),
    ],
)
def test_it_rejects_bad_frames_with_a_clear_error(frame, code, words):
    with pytest.raises(protocol.ProtocolError) as exc:
        protocol.parse_agent_message(frame)
    assert exc.value.code == code
    assert words in exc.value.message


def test_it_rejects_oversized_log_tails():
    frame = {
        "type": "logs",
        "v": 1,
        "seq": 3,
        "t": 1.0,
        "source": "vllm",
        "lines": ["x"] * (protocol.MAX_LOG_LINES + 1),
    }
    with pytest.raises(protocol.ProtocolError, match="lines"):
        protocol.parse_agent_message(json.dumps(frame))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"gpus": [True]}, "gpus.0: Input should be a valid integer"),
        ({"gpus": ["0"]}, "gpus.0: Input should be a valid integer"),
        ({"options": {"tp": "2"}}, "options.tp: Input should be a valid integer"),
        ({"options": {"enforce_eager": 1}}, "options.enforce_eager: Input should be a valid boolean"),
    ],
)
def test_it_refuses_a_command_value_of_the_wrong_json_type_on_the_agent_side(change, words):
    launch = {"type": "launch", "v": 1, "deployment": "d1", "backend": "vllm", "model": "m", "gpus": [0]}
    assert protocol.parse_server_command(json.dumps(launch)).gpus == [0]
    with pytest.raises(protocol.ProtocolError) as exc:
        protocol.parse_server_command(json.dumps({**launch, **change}))
    assert (exc.value.code, words in exc.value.message) == ("invalid", True), exc.value.message


def test_it_refuses_deeply_nested_commands_on_the_agent_side_too():
    with pytest.raises(protocol.ProtocolError, match="nested too deeply"):
        protocol.parse_server_command("[" * 100_000)


def test_it_keeps_the_envelope_first_and_unchanged_on_the_wire():
    reading = protocol.GpuReading(
        index=0, util_gpu=1, util_mem=2, mem_used_mib=3, mem_free_mib=4, temp_c=5, power_w=6
    )
    samples = protocol.Samples(type="samples", v=1, seq=7, t=8.0, gpus=[reading])
    assert protocol.dump(samples).startswith('{"type":"samples","v":1,"seq":7,"t":8.0,"gpus":[{"index":0,')
    assert (
        protocol.dump(protocol.Stop(type="stop", v=1, deployment="d-1"))
        == '{"type":"stop","v":1,"deployment":"d-1"}'
    )


def test_it_gives_every_message_one_envelope_and_every_acknowledged_one_a_sequence():
    agent_messages = (
        protocol.Hello,
        protocol.Samples,
        protocol.LogTail,
        protocol.DeploymentStatus,
        protocol.Metrics,
        protocol.Probe,
        protocol.Answer,
    )
    commands = (protocol.Launch, protocol.Stop, protocol.Restart, protocol.Canary, protocol.Ask)
    assert all(issubclass(m, protocol.Envelope) for m in (*agent_messages, *commands))
    assert [m.model_fields["type"].annotation.__args__[0] for m in commands] == list(protocol.COMMAND_TYPES)
    assert [m.model_fields["type"].annotation.__args__[0] for m in agent_messages] == list(
        protocol.AGENT_TYPES
    )
    unsequenced = [protocol.Hello, protocol.Answer]  # an answer to an ask is not replayed
    assert [m for m in agent_messages if not issubclass(m, protocol.Sequenced)] == unsequenced
