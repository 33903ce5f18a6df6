"""The paste parser for nvidia-smi topology matrices, P2P matrices and summary tables (agents/topo.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agents.topo import TopologyParseError, format_human, links_by_pair, parse_topology, read_topology
from tests.fixtures import REPO, fixture_files, read_fixture

TOPO_FIXTURES = fixture_files("topo")
EXPECTED_DIR = Path(__file__).parents[1] / "data" / "topo_expected"
MATRIX_FIXTURES = [path for path in TOPO_FIXTURES if "_smi-" not in path.name]

NV4_PAIR = "        GPU0    GPU1    CPU Affinity    NUMA Affinity\nGPU0     X      NV4     0-5     0\nGPU1    NV4      X      0-5     0\n"
NV4_PAIR_RESULT = {
    "kind": "matrix",
    "gpus": [
        {"name": "GPU0", "cpu_affinity": "0-5", "numa_affinity": "0"},
        {"name": "GPU1", "cpu_affinity": "0-5", "numa_affinity": "0"},
    ],
    "nics": [],
    "links": [{"a": "GPU0", "b": "GPU1", "link": "NV4"}],
}
WITH_NICS = (
    "\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tSYS\tPIX\tSYS\t0-15\t0\n"
    "GPU1\tSYS\t X \tSYS\tPIX\t16-31\t1\n"
    "NIC0\tPIX\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tPIX\tSYS\t X \n"
)


def expected_for(path: Path) -> dict:
    return json.loads((EXPECTED_DIR / f"{path.stem}.json").read_text(encoding="utf-8"))


def body_of(path: Path) -> str:
    return read_fixture(path)[1]


def parse_error(text: str) -> TopologyParseError:
    with pytest.raises(TopologyParseError) as caught:
        parse_topology(text)
    return caught.value


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agents.topo", *args]
    return subprocess.run(command, cwd=REPO, input=stdin, capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------- every real paste, cell by cell


def test_it_has_one_hand_checked_expectation_per_fixture() -> None:
    assert len(TOPO_FIXTURES) == 43
    assert sorted(p.stem for p in EXPECTED_DIR.glob("*.json")) == [p.stem for p in TOPO_FIXTURES]


@pytest.mark.parametrize("path", TOPO_FIXTURES, ids=lambda p: p.stem[:3])
def test_it_parses_every_fixture_exactly(path: Path) -> None:
    assert parse_topology(body_of(path)) == expected_for(path)


@pytest.mark.parametrize("path", TOPO_FIXTURES, ids=lambda p: p.stem[:3])
def test_it_finds_as_many_gpus_as_the_fixture_header_states(path: Path) -> None:
    header, body = read_fixture(path)
    stated = int(re.match(r"\d+", header["gpus"]).group())
    assert len(parse_topology(body)["gpus"]) == stated


@pytest.mark.parametrize("path", MATRIX_FIXTURES, ids=lambda p: p.stem[:3])
def test_it_lists_every_device_pair_exactly_once(path: Path) -> None:
    topo = parse_topology(body_of(path))
    devices = [d["name"] for d in topo["gpus"] + topo["nics"]]
    pairs = [frozenset((link["a"], link["b"])) for link in topo["links"]]
    assert len(pairs) == len(set(pairs)) == len(devices) * (len(devices) - 1) // 2
    assert all(len(pair) == 2 and pair <= set(devices) for pair in pairs)


# ---------------------------------------------------------------- never a matrix that disagrees with its header


def row_lines(path: Path) -> list[int]:
    """0-based indexes of the body lines that are matrix rows, from the expected device names."""
    expected = expected_for(path)
    names = {d["name"] for d in expected["gpus"] + expected["nics"]}
    lines = body_of(path).split("\n")
    return [i for i, line in enumerate(lines) if len(line.split()) > 1 and _is_row(line.split(), names)]


def _is_row(tokens: list[str], names: set[str]) -> bool:
    return tokens[0] in names and tokens[1] not in names


def without_token(line: str, position: int) -> str:
    spans = [m.span() for m in re.finditer(r"\S+", line)]
    start = spans[position - 1][1] if position else spans[0][0]
    return line[:start] + line[spans[position][1] :]


def device_count(path: Path) -> int:
    return len(expected_for(path)["gpus"]) + len(expected_for(path)["nics"])


def refused_or_affinity_left_unknown(path: Path, mutated: list[str], index: int, position: int) -> None:
    """A check_env paste ("NVIDIA Topology:") reads its affinity columns leniently (issue #14, 1.8): a
    damaged affinity cell leaves that row's affinity unknown, with a note naming the line, and the link
    matrix exactly as expected. Everything else, and any damaged link cell, is refused at the row's line."""
    try:
        topo, notes = read_topology("\n".join(mutated))
    except TopologyParseError as error:
        assert error.line_no == index + 1, (index, position)
        return
    assert "NVIDIA Topology:" in body_of(path) and position > device_count(path), (index, position)
    assert topo["links"] == expected_for(path)["links"]
    name = lines_name(mutated[index])
    assert next(g for g in topo["gpus"] if g["name"] == name)["cpu_affinity"] is None
    assert any(note.startswith(f"line {index + 1}: row {name}") for note in notes)


def lines_name(line: str) -> str:
    return line.split()[0]


@pytest.mark.parametrize("path", MATRIX_FIXTURES, ids=lambda p: p.stem[:3])
def test_it_refuses_any_row_with_a_cell_missing(path: Path) -> None:
    lines = body_of(path).split("\n")
    for index in row_lines(path):
        for position in range(1, len(lines[index].split())):
            mutated = [*lines[:index], without_token(lines[index], position), *lines[index + 1 :]]
            refused_or_affinity_left_unknown(path, mutated, index, position)


@pytest.mark.parametrize("path", MATRIX_FIXTURES, ids=lambda p: p.stem[:3])
def test_it_refuses_any_row_with_an_extra_cell_or_a_missing_name(path: Path) -> None:
    lines = body_of(path).split("\n")
    for index in row_lines(path):
        longer = [*lines[:index], lines[index].rstrip() + "\tSYS", *lines[index + 1 :]]
        refused_or_affinity_left_unknown(path, longer, index, len(lines[index].split()))
        nameless = [*lines[:index], without_token(lines[index], 0), *lines[index + 1 :]]
        parse_error("\n".join(nameless))


@pytest.mark.parametrize("path", MATRIX_FIXTURES, ids=lambda p: p.stem[:3])
def test_it_refuses_rows_whose_cells_were_swapped(path: Path) -> None:
    lines = body_of(path).split("\n")
    device_count = len(expected_for(path)["gpus"]) + len(expected_for(path)["nics"])
    for index in row_lines(path):
        cells = lines[index].split()[1 : device_count + 1]
        swap = next(((i, j) for i in range(len(cells)) for j in range(i) if cells[i] != cells[j]), None)
        if swap is None:
            continue
        swapped = list(cells)
        swapped[swap[0]], swapped[swap[1]] = swapped[swap[1]], swapped[swap[0]]
        row = "\t".join([lines[index].split()[0], *swapped, *lines[index].split()[device_count + 1 :]])
        parse_error("\n".join([*lines[:index], row, *lines[index + 1 :]]))


def test_it_refuses_a_header_with_a_column_too_many_naming_the_first_row() -> None:
    text = (
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\t0-31\t0\nGPU1\tPHB\t X \t0-31\t0\n"
    )
    error = parse_error(text)
    assert error.line_no == 2
    assert str(error) == "line 2: row GPU0 has 4 cells, header has 5 columns"


def test_it_refuses_an_asymmetric_matrix() -> None:
    error = parse_error(NV4_PAIR.replace("GPU1    NV4 ", "GPU1    SYS "))
    assert error.line_no == 3
    assert "'SYS'" in str(error) and "'NV4'" in str(error)


def test_it_refuses_rows_out_of_order() -> None:
    lines = WITH_NICS.splitlines()
    swapped = "\n".join([lines[0], lines[1], lines[3], lines[2], lines[4]])
    assert str(parse_error(swapped)) == "line 3: expected row GPU1, found row NIC0"


def test_it_refuses_a_row_that_is_not_in_the_header() -> None:
    error = parse_error(NV4_PAIR + "NIC0    SYS     SYS      X\n")
    assert error.line_no == 4 and "NIC0" in str(error)


def test_it_refuses_unknown_labels_and_mixed_families() -> None:
    assert "unknown link label 'QPI'" in str(parse_error(NV4_PAIR.replace("NV4", "QPI")))
    mixed = "        GPU0    GPU1    GPU2\n GPU0   X       OK      SYS\n GPU1   OK      X       OK\n GPU2   SYS     OK      X\n"
    assert parse_error(mixed).line_no == 2


def test_it_refuses_x_off_the_diagonal_and_labels_on_it() -> None:
    assert "diagonal" in str(parse_error(NV4_PAIR.replace("GPU0     X ", "GPU0    SYS")))
    error = parse_error(NV4_PAIR.replace("GPU1    NV4 ", "GPU1     X  "))
    assert error.line_no == 3 and "only the diagonal" in str(error)


def test_it_refuses_affinity_values_it_cannot_read() -> None:
    error = parse_error(NV4_PAIR.replace("0-5     0\nGPU1", "0-5     zero\nGPU1"))
    assert str(error) == "line 2: row GPU0: 'zero' is not a NUMA Affinity value"


def test_it_refuses_two_matrices_in_one_paste() -> None:
    assert parse_error(NV4_PAIR + "\n" + NV4_PAIR).line_no == 5


def test_it_refuses_a_matrix_and_an_smi_table_together() -> None:
    smi = body_of(next(p for p in TOPO_FIXTURES if p.name.startswith("057")))
    assert "both" in str(parse_error(NV4_PAIR + smi))


def test_it_refuses_a_nic_legend_for_a_column_that_does_not_exist() -> None:
    error = parse_error(WITH_NICS + "\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC7: mlx5_7\n")
    assert str(error) == "line 10: NIC legend names NIC7, which is not a matrix column"


# ---------------------------------------------------------------- truncated, empty, garbage


def test_it_names_the_line_where_a_truncated_matrix_stops() -> None:
    lines = WITH_NICS.splitlines()
    error = parse_error("\n".join(lines[:3]))
    assert str(error) == "line 4: matrix is cut short: row NIC0 is missing"
    assert parse_error("\n".join(lines[:3]) + "\n\nLegend:\n\n  X    = Self\n").line_no == 4


def test_it_refuses_an_smi_table_whose_memory_line_is_cut_off() -> None:
    body = body_of(next(p for p in TOPO_FIXTURES if p.name.startswith("057")))
    lines = body.split("\n")
    cut = next(i for i, line in enumerate(lines) if "00000000:03:00.0" in line)
    assert parse_error("\n".join(lines[: cut + 1])).line_no == cut + 2


def test_it_refuses_empty_and_blank_input_with_a_line_number() -> None:
    assert parse_error("").line_no == 1
    assert parse_error("\n  \n\t\n").line_no == 1


def test_it_refuses_garbage_and_points_at_a_header_without_rows() -> None:
    assert parse_error("hello\nthis is not nvidia-smi output\n").line_no == 1
    error = parse_error("$ nvidia-smi topo -m\n\tGPU0\tGPU1\tCPU Affinity\nsegmentation fault\n")
    assert str(error) == "line 2: header names GPU0 but no GPU0 row follows"


def test_it_raises_a_value_error_carrying_the_line_number() -> None:
    error = parse_error("")
    assert isinstance(error, ValueError)
    assert str(error).startswith("line 1: ")


# ---------------------------------------------------------------- odd pastes


def test_it_strips_ansi_escapes_and_prompts_before_and_after() -> None:
    coloured = NV4_PAIR.replace("NV4 ", "\x1b[1;32mNV4\x1b[0m ").replace(
        "GPU0     X", "\x1b[7mGPU0\x1b[0m     X"
    )
    paste = (
        "\x1b]0;user@gpu01: ~\x07\x1b[01;32muser@gpu01\x1b[00m:~$ nvidia-smi topo -m\n"
        + coloured
        + "user@gpu01:~$ exit\n"
    )
    assert parse_topology(paste) == NV4_PAIR_RESULT


def test_it_reads_crlf_and_bare_cr_line_endings() -> None:
    assert parse_topology(NV4_PAIR.replace("\n", "\r\n")) == NV4_PAIR_RESULT
    assert parse_topology(NV4_PAIR.replace("\n", "\r")) == NV4_PAIR_RESULT


def test_it_reads_a_header_glued_to_the_command_line() -> None:
    glued = "root@node:~# nvidia-smi topo -m" + NV4_PAIR
    assert parse_topology(glued) == NV4_PAIR_RESULT
    p2p = "$ nvidia-smi topo -p2p w\tGPU0\tGPU1\t\n GPU0\tX\tNS\t\n GPU1\tNS\tX\t\n"
    assert parse_topology(p2p)["mode"] == "w"


def test_it_reads_collapsed_whitespace_and_fused_header_columns() -> None:
    collapsed = re.sub(r"[ \t]+", " ", NV4_PAIR)
    assert parse_topology(collapsed) == NV4_PAIR_RESULT
    fused = NV4_PAIR.replace("CPU Affinity    NUMA Affinity", "CPU AffinityNUMA Affinity")
    assert parse_topology(fused) == NV4_PAIR_RESULT


def test_it_splits_an_affinity_fused_to_a_following_n_a() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tPHB\t0-11N/A\tN/A\nGPU1\tPHB\t X \t0-11 N/A N/A\n"
    assert [gpu["numa_affinity"] for gpu in parse_topology(text)["gpus"]] == ["N/A", "N/A"]


def test_it_reads_email_quoted_and_non_breaking_space_pastes() -> None:
    quoted = "".join(f"> {line}\n" for line in NV4_PAIR.splitlines())
    assert parse_topology("On Monday you wrote:\n" + quoted) == NV4_PAIR_RESULT
    assert parse_topology(NV4_PAIR.replace(" ", "\u00a0")) == NV4_PAIR_RESULT


def test_it_skips_warnings_interleaved_between_rows() -> None:
    lines = NV4_PAIR.splitlines()
    noisy = "\n".join([lines[0], lines[1], "WARNING: infoROM is corrupted at gpu 0000:04:00.0", lines[2]])
    assert parse_topology(noisy) == NV4_PAIR_RESULT


def test_it_reads_wrapped_and_headless_nic_legends() -> None:
    wrapped = WITH_NICS + "\nNIC Legend:\n\n  NIC0: mlx5_0  NIC1:\n    mlx5_bond_1\n"
    assert [nic["device"] for nic in parse_topology(wrapped)["nics"]] == ["mlx5_0", "mlx5_bond_1"]
    assert [nic["device"] for nic in parse_topology(WITH_NICS)["nics"]] == ["NIC0", "NIC1"]


def test_it_takes_the_p2p_mode_from_the_last_command_before_the_matrix() -> None:
    body = body_of(next(p for p in TOPO_FIXTURES if p.name.startswith("022")))
    assert parse_topology(body)["mode"] == "p"
    assert parse_topology(body.replace("topo -p2p p\n", "topo -p2p rw\n"))["mode"] == "rw"
    assert parse_topology(body.replace("topo -p2p p\n", "topo\n"))["mode"] is None


def test_it_looks_up_links_by_unordered_pair() -> None:
    pairs = links_by_pair(parse_topology(WITH_NICS))
    assert pairs[frozenset({"GPU1", "NIC1"})] == "PIX"
    assert pairs[frozenset({"NIC1", "GPU0"})] == "SYS"
    assert len(pairs) == 6


# ---------------------------------------------------------------- command line


def fixture_named(prefix: str) -> Path:
    return next(p for p in TOPO_FIXTURES if p.name.startswith(prefix))


def test_it_prints_json_for_a_saved_paste(tmp_path: Path) -> None:
    paste = tmp_path / "topo.txt"
    paste.write_text(body_of(fixture_named("004")), encoding="utf-8")
    result = run_cli(str(paste), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected_for(fixture_named("004"))


def test_it_reads_standard_input_and_utf16_files(tmp_path: Path) -> None:
    assert json.loads(run_cli("-", "--json", stdin=NV4_PAIR).stdout) == NV4_PAIR_RESULT
    powershell = tmp_path / "topo.txt"
    powershell.write_bytes(NV4_PAIR.replace("\n", "\r\n").encode("utf-16"))
    assert json.loads(run_cli(str(powershell), "--json").stdout) == NV4_PAIR_RESULT


def test_it_prints_an_aligned_matrix_and_a_legend_line(tmp_path: Path) -> None:
    paste = tmp_path / "topo.txt"
    paste.write_text(body_of(fixture_named("004")), encoding="utf-8")
    result = run_cli(str(paste))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Topology: 8 GPUs, 4 NICs"
    header, rows = lines[1], lines[2:14]
    device_starts = [header.index(name) for name in ["GPU0", "GPU7", "NIC0", "NIC3"]]
    affinity_starts = [header.index(name) for name in ["CPU Affinity", "NUMA Affinity"]]
    for number, row in enumerate(rows):
        starts = device_starts + (affinity_starts if number < 8 else [])
        assert all(row[start] != " " and row[start - 1] == " " for start in starts), row
    assert rows[0].split() == ["GPU0", "X", *["NV12"] * 7, *["SYS"] * 4, "0-63,128-191", "0"]
    assert rows[11].split() == ["NIC3", *["SYS"] * 8, "SYS", "SYS", "PIX", "X"]
    assert lines[14].startswith("Legend: X = self, NV12 = 12 bonded NVLinks, PIX = ")
    assert lines[14].endswith("NICs: NIC0 = mlx5_0, NIC1 = mlx5_1, NIC2 = mlx5_2, NIC3 = mlx5_3")


def test_it_prints_p2p_and_smi_summaries() -> None:
    p2p = format_human(parse_topology(body_of(fixture_named("051"))))
    assert p2p.splitlines()[0] == "P2P status (mode r): 8 GPUs"
    assert "OK = P2P works" in p2p.splitlines()[-1]
    smi = format_human(parse_topology(body_of(fixture_named("054")))).splitlines()
    assert smi[0] == "nvidia-smi: 4 GPUs"
    assert smi[2].split() == ["0", "Tesla", "V100-PCIE...", "32480", "MiB"]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("", 1),
        ("complete garbage\n\x00\x01\n", 1),
        ("\tGPU0\tGPU1\tGPU2\n GPU0\tX\tOK\tOK\n GPU1\tOK\tX\tOK\n", 4),
    ],
    ids=["empty", "garbage", "truncated"],
)
def test_it_exits_1_naming_the_line_and_prints_no_matrix(tmp_path: Path, text: str, line: int) -> None:
    paste = tmp_path / "paste.txt"
    paste.write_text(text, encoding="utf-8")
    for args in ([str(paste)], [str(paste), "--json"]):
        result = run_cli(*args)
        assert result.returncode == 1
        assert result.stdout == ""
        assert result.stderr.startswith(f"error: line {line}: ")


def test_it_exits_1_when_the_file_cannot_be_read(tmp_path: Path) -> None:
    result = run_cli(str(tmp_path / "missing.txt"))
    assert result.returncode == 1 and "cannot read" in result.stderr


# ---------------------------------------------------------------- issue #14 1.8: check_env and reflowed pastes

CHECK_ENV_FUSED = next(p for p in TOPO_FIXTURES if p.name.startswith("044_"))
REFLOWED = next(p for p in TOPO_FIXTURES if p.name.startswith("045_"))
CHECK_ENV_H20 = next(p for p in TOPO_FIXTURES if p.name.startswith("041_"))


def test_it_reads_check_env_links_and_leaves_run_together_affinities_unknown_with_a_note() -> None:
    topo, notes = read_topology(body_of(CHECK_ENV_FUSED))
    assert [g["numa_affinity"] for g in topo["gpus"]] == [None] * 4 + ["1"] * 4
    assert [note.split(":")[0] for note in notes] == ["line 43", "line 44", "line 45", "line 46"]
    assert "'0-45,92-1370 N/A'" in notes[0]


def test_it_refuses_the_same_run_together_row_outside_check_env_output() -> None:
    body = body_of(CHECK_ENV_FUSED).replace("NVIDIA Topology: \n", "")
    assert parse_error(body).line_no == 42
    assert "row GPU0 has 20 cells, header has 21 columns" in str(parse_error(body))


def test_it_splits_link_cells_that_ran_together_in_check_env_output_only() -> None:
    lines = body_of(CHECK_ENV_H20).split("\n")
    gpu1 = next(i for i, line in enumerate(lines) if line.startswith("GPU1"))
    fused = lines[gpu1].replace("NODE    NODE", "NODENODE", 1)
    assert fused != lines[gpu1]
    pasted = "\n".join([*lines[:gpu1], fused, *lines[gpu1 + 1 :]])
    assert parse_topology(pasted) == expected_for(CHECK_ENV_H20)
    assert parse_error(pasted.replace("NVIDIA Topology:\n", "")).line_no == gpu1


def test_it_refuses_run_together_cells_that_split_into_a_wrong_row() -> None:
    lines = body_of(CHECK_ENV_H20).split("\n")
    gpu1 = next(i for i, line in enumerate(lines) if line.startswith("GPU1"))
    lines[gpu1] = lines[gpu1].replace("NODE    NODE", "NODENODENODE", 1)
    assert parse_error("\n".join(lines)).line_no == gpu1 + 1


def reflowed_matrix_tokens() -> list[tuple[int, int]]:
    """(line index, token position) of every token from the header's GPU0 to the last row's N/A."""
    lines = body_of(REFLOWED).split("\n")
    found = []
    for index, line in enumerate(lines[1:11], start=1):
        found += [(index, position) for position in range(1, len(line.split()))]
    return found


def test_it_reads_a_reflowed_comment_paste_as_a_stream_and_refuses_it_with_any_token_missing() -> None:
    lines = body_of(REFLOWED).split("\n")
    assert parse_topology(body_of(REFLOWED)) == expected_for(REFLOWED)
    for index, position in reflowed_matrix_tokens():
        mutated = [*lines[:index], without_token(lines[index], position), *lines[index + 1 :]]
        parse_error("\n".join(mutated))


def test_it_refuses_a_reflowed_paste_whose_cells_were_swapped() -> None:
    body = body_of(REFLOWED).replace("// X      PIX     NODE", "// X      NODE    PIX", 1)
    parse_error(body)


def test_it_prints_check_env_notes_on_stderr(tmp_path: Path) -> None:
    saved = tmp_path / "check_env.txt"
    saved.write_text(body_of(CHECK_ENV_FUSED), encoding="utf-8")
    done = run_cli(str(saved))
    assert done.returncode == 0
    assert done.stderr.count("note: line ") == 4 and "left unknown" in done.stderr
    assert "GPU4  NV18" in done.stdout
