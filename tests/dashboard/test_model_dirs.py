"""Model paths typed into the deploy form (issue #10, item 11): the server reads files only under MODEL_DIRS
(symlinks followed first), says the same thing about every path outside them whether it exists or not, never
shows or logs a file's contents, and a plan request always ends."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from dashboard import deploy, tasks
from dashboard.choices import PlanStatus
from dashboard.models import PlanRequest
from placement import PlacementError
from placement.spec import catalog, load_model_within
from tests.personas import seed_server
from tests.placement.test_placement_inputs import write_gguf

SECRET = "pbkdf2_sha256$870000$not-a-real-hash-but-a-secret"
CONFIG = {
    k: catalog()["Qwen3-32B"][k]
    for k in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    )
}


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(the model directory, a directory outside it holding a config.json, a SQLite file and a folder)."""
    models, outside = tmp_path / "models", tmp_path / "outside"
    for folder in (models / "tiny", outside / "folder"):
        folder.mkdir(parents=True)
    (models / "tiny" / "config.json").write_text(json.dumps(CONFIG))
    (outside / "config.json").write_text(json.dumps(CONFIG))
    database = sqlite3.connect(outside / "db.sqlite3")
    database.execute("create table auth_user (password text)")
    database.execute("insert into auth_user values (?)", (SECRET,))
    database.commit()
    database.close()
    return models, outside


def refusal(ref: str, model_dirs: list[Path]) -> str:
    with pytest.raises(PlacementError) as caught:
        load_model_within(ref, model_dirs)
    return str(caught.value).replace(ref, "<ref>")


def test_it_reads_a_model_under_the_model_dirs_by_absolute_or_relative_path(dirs):
    models, outside = dirs
    assert load_model_within(str(models / "tiny"), [models]).num_layers == CONFIG["num_hidden_layers"]
    assert load_model_within("tiny/config.json", [models]).num_layers == CONFIG["num_hidden_layers"]
    write_gguf(outside / "tiny.gguf", layers=3)
    (models / "linked.gguf").symlink_to(outside / "tiny.gguf")  # its target lies in another allowed dir
    assert load_model_within(str(models / "linked.gguf"), [models, outside]).num_layers == 3


def test_it_says_the_same_about_every_path_outside_the_model_dirs_whether_it_exists_or_not(dirs):
    models, outside = dirs
    (models / "escape").symlink_to(outside / "config.json")
    refs = [
        str(outside / "config.json"),
        str(outside / "db.sqlite3"),
        str(outside / "folder"),
        str(outside / "nothing-here"),
        "../outside/config.json",
        "escape",
        str(models / "escape"),
        "/etc/passwd",
        "bad\0name",
    ]
    messages = {refusal(ref, [models]) for ref in refs}
    assert len(messages) == 1, messages
    (message,) = messages
    assert message.startswith(
        "unknown model '<ref>': no config.json or GGUF of that name under the model "
        f"directories ({models.resolve()})"
    )


def test_it_reads_no_path_at_all_when_no_model_dir_is_configured(dirs):
    models, _ = dirs
    assert "model directories (none configured)" in refusal(str(models / "tiny"), [])
    assert (
        load_model_within("/anywhere/Qwen3-32B", []).name == "Qwen3-32B"
    )  # a path's last part names the model


def test_it_refuses_a_binary_file_in_the_model_dir_without_quoting_it(dirs):
    models, outside = dirs
    (models / "db.sqlite3").write_bytes((outside / "db.sqlite3").read_bytes())
    message = refusal(str(models / "db.sqlite3"), [models])
    assert "not UTF-8 text, so not a config.json" in message and SECRET not in message


# ---- through the dashboard's plan request -----------------------------------------------------------------
@pytest.mark.django_db
def test_it_plans_a_model_path_only_under_model_dirs_and_reports_the_rest_cleanly(dirs, settings, caplog):
    models, outside = dirs
    settings.MODEL_DIRS = [models]
    seed_server()
    inside = deploy.run_plan_request(PlanRequest.objects.create(model_ref=str(models / "tiny")).pk)
    assert (
        inside.status == PlanStatus.DONE and inside.result["model"]["layers"] == CONFIG["num_hidden_layers"]
    )
    (models / "copy.sqlite3").write_bytes((outside / "db.sqlite3").read_bytes())
    for ref in (str(outside / "db.sqlite3"), str(outside / "config.json"), str(models / "copy.sqlite3")):
        row = deploy.run_plan_request(PlanRequest.objects.create(model_ref=ref).pk)
        assert row.status == PlanStatus.FAILED and ref in row.error and SECRET not in row.error
    assert SECRET not in caplog.text


@pytest.mark.django_db
def test_it_ends_a_plan_request_that_raises_anything_and_logs_only_the_type(settings, caplog, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    seed_server()
    leak = SECRET.encode() * 1000

    def unreadable(row):
        return leak.decode("ascii", errors="strict") + b"\xff".decode("utf-8")

    monkeypatch.setattr(deploy, "compute_plans", unreadable)
    row = PlanRequest.objects.create(model_ref="Qwen3-32B")
    with caplog.at_level(logging.INFO):
        assert tasks.plan_request(row.pk) == PlanStatus.FAILED
    row.refresh_from_db()
    assert (
        row.error == "planning failed on the server (UnicodeDecodeError); the Celery worker's log says where"
    )
    assert (
        "UnicodeDecodeError" in caplog.text and "unreadable" in caplog.text
    )  # the type and where, not the bytes
    assert SECRET not in caplog.text and len(caplog.text) < 5000
