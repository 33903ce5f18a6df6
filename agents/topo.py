"""Parse pasted `nvidia-smi topo -m`, `nvidia-smi topo -p2p MODE` and plain `nvidia-smi` output.

Usable on its own by operators: `python -m agents.topo FILE [--json]` (FILE may be `-`).
Pure standard library. The parser finds the matrix or table inside whatever surrounds it
(prompts, ANSI colours, e-mail quoting, legends) and refuses, naming the line, anything it
cannot read exactly: a wrong matrix is worse than none.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SELF = "X"
TOPO_LABEL_RE = re.compile(r"NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")
P2P_LABELS = frozenset({"OK", "CNS", "GNS", "TNS", "NS", "DR", "U"})

ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
INVISIBLE_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b\ufeff]")
QUOTE_PREFIX_RE = re.compile(r"^[ \t]*(?:>[ \t]?)+")

GPU_TOKEN_RE = re.compile(r"GPU\d+(?!\w)")
GPU_NAME_RE = re.compile(r"GPU\d+")
NIC_NAME_RE = re.compile(r"NIC\d+")
RAW_NIC_RE = re.compile(r"[a-z][a-z0-9_]*\d")
ATTR_RE = re.compile(r"CPU\s*Affinity|NUMA\s*Affinity|GPU\s*NUMA\s*ID")
ATTR_NAMES = {"CPUAffinity": "CPU Affinity", "NUMAAffinity": "NUMA Affinity", "GPUNUMAID": "GPU NUMA ID"}
CPU_LIST = r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*|N/A"
ATTR_VALUE_RES = {
    "CPU Affinity": re.compile(CPU_LIST),
    "NUMA Affinity": re.compile(CPU_LIST),
    "GPU NUMA ID": re.compile(r"\d+|N/A"),
}
LEGEND_RE = re.compile(r"\s*(?:NIC\s+)?Legend\s*:", re.IGNORECASE)
NIC_LEGEND_RE = re.compile(r"\b(NIC\d+)\s*:\s*(?!NIC\d+\s*:)([A-Za-z][\w.-]*)")
TOPO_COMMAND_RE = re.compile(r"\btopo\b")
# `python3 -m sglang.check_env` (and lmdeploy's) print the matrix under this title; their pastes run the CPU
# affinity into the NUMA column on some rows and fuse link cells at wide columns ("NODENODE").
CHECK_ENV_RE = re.compile(r"NVIDIA Topology:\s*$")
FUSED_LABELS_RE = re.compile(r"(?:NV\d+|PIX|PXB|PHB|NODE|SYS|SOC){2,}")
LABEL_PIECE_RE = re.compile(r"NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")
P2P_MODE_RE = re.compile(r"\btopo\s+(?:-p2p|--p2pstatus)\s+([rwnap]+)(?!\S)")

SMI_BANNER_RE = re.compile(r"NVIDIA-SMI\s+\d")
SMI_START_RE = re.compile(r"NVIDIA-SMI\s+\d|\|\s*GPU\s+Name\b")
SMI_END_RE = re.compile(r"\b(?:Processes|MIG devices)\s*:")
BUS_ID_RE = re.compile(r"\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
SMI_NAME_CELL_RE = re.compile(r"\s*(\d+)\s+(.*?)\s+(?:On|Off|N/A|WDDM|TCC)\s*")
SMI_MEMORY_RE = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")


class TopologyParseError(ValueError):
    """Input that is not (or not exactly) a topology paste; `line_no` is 1-based, or None."""

    def __init__(self, message: str, line_no: int | None = None) -> None:
        self.line_no = line_no
        self.reason = message
        super().__init__(f"line {line_no}: {message}" if line_no is not None else message)


@dataclass
class Header:
    line_no: int
    prefix: str  # whatever precedes GPU0 on the header line, e.g. a glued command
    devices: list[str]
    attrs: list[str]
    lenient: bool = False  # check_env output: unreadable affinity columns are left unknown, not refused

    @property
    def gpus(self) -> list[str]:
        return [name for name in self.devices if GPU_NAME_RE.fullmatch(name)]

    @property
    def nics(self) -> list[str]:
        return [name for name in self.devices if not GPU_NAME_RE.fullmatch(name)]


@dataclass
class Row:
    line_no: int
    name: str
    cells: list[str]
    attrs: dict[str, str]
    unread: str | None = None  # why this row's affinity columns were left unknown (check_env pastes only)


# ---------------------------------------------------------------- cleaning


def clean_lines(text: str) -> list[str]:
    """The paste as lines, without ANSI escapes, control characters or e-mail quoting."""
    text = ANSI_RE.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return [QUOTE_PREFIX_RE.sub("", INVISIBLE_RE.sub("", line)) for line in text.split("\n")]


def _next_filled(lines: list[str], index: int) -> int | None:
    """Index of the first non-blank line at or after `index`."""
    for position in range(index, len(lines)):
        if lines[position].strip():
            return position
    return None


# ---------------------------------------------------------------- matrix header


def find_header(lines: list[str], start: int = 0) -> Header | None:
    """The first matrix header at or after `start`: a line naming GPU0.. followed by the row GPU0."""
    for index in range(start, len(lines)):
        for match in GPU_TOKEN_RE.finditer(lines[index]):
            if _opens_matrix(lines, index, match.group()):
                header = _parse_header(lines[index], index + 1, match.start())
                header.lenient = _under_check_env_title(lines, index, header.prefix)
                return header
    return None


def _under_check_env_title(lines: list[str], index: int, prefix: str) -> bool:
    if CHECK_ENV_RE.search(prefix):
        return True
    before = [line for line in lines[:index] if line.strip()]
    return bool(before) and bool(CHECK_ENV_RE.search(before[-1])) and not prefix.strip()


def _opens_matrix(lines: list[str], index: int, first_device: str) -> bool:
    following = _next_filled(lines, index + 1)
    if following is None:
        return False
    tokens = lines[following].split()
    return (
        tokens[0] == first_device
        and len(tokens) > 1
        and (tokens[1] == SELF or _label_kind(tokens[1]) is not None)
    )


def _parse_header(line: str, line_no: int, start: int) -> Header:
    text = line[start:]
    attr_match = ATTR_RE.search(text)
    split_at = attr_match.start() if attr_match else len(text)
    devices = text[:split_at].split()
    _check_devices(devices, line_no)
    return Header(line_no, line[:start], devices, _parse_attr_names(text[split_at:], line_no))


def _check_devices(devices: list[str], line_no: int) -> None:
    seen_nic = False
    for name in devices:
        is_gpu = bool(GPU_NAME_RE.fullmatch(name))
        if not (is_gpu or NIC_NAME_RE.fullmatch(name) or RAW_NIC_RE.fullmatch(name)):
            raise TopologyParseError(f"header column '{name}' is not a GPU, NIC or attribute name", line_no)
        if is_gpu and seen_nic:
            raise TopologyParseError(f"header lists GPU column {name} after a NIC column", line_no)
        seen_nic = seen_nic or not is_gpu
    duplicates = sorted({name for name in devices if devices.count(name) > 1})
    if duplicates:
        raise TopologyParseError(f"header repeats column {duplicates[0]}", line_no)


def _parse_attr_names(text: str, line_no: int) -> list[str]:
    names = [ATTR_NAMES[re.sub(r"\s", "", match.group())] for match in ATTR_RE.finditer(text)]
    leftover = ATTR_RE.sub(" ", text).split()
    if leftover:
        raise TopologyParseError(f"unknown header column '{' '.join(leftover)}'", line_no)
    if len(set(names)) != len(names):
        raise TopologyParseError("header repeats an affinity column", line_no)
    return names


# ---------------------------------------------------------------- matrix rows


def read_rows(lines: list[str], header: Header) -> tuple[list[Row], int]:
    """One row per header device, in header order; returns them and the index after the last."""
    rows: list[Row] = []
    index = header.line_no
    for position, name in enumerate(header.devices):
        index = _seek_row(lines, index, name)
        rows.append(_parse_row(lines[index].split(), index + 1, header, position))
        index += 1
    return rows, index


def _seek_row(lines: list[str], index: int, name: str) -> int:
    """Skip noise (blank lines, interleaved warnings) up to the row `name`; refuse anything else."""
    for position in range(index, len(lines)):
        tokens = lines[position].split()
        if tokens and tokens[0] == name:
            return position
        if tokens and _looks_like_row(tokens):
            raise TopologyParseError(f"expected row {name}, found row {tokens[0]}", position + 1)
        if LEGEND_RE.match(lines[position]):
            break
    raise TopologyParseError(f"matrix is cut short: row {name} is missing", index + 1)


def _looks_like_row(tokens: list[str]) -> bool:
    name = tokens[0]
    is_device = GPU_NAME_RE.fullmatch(name) or NIC_NAME_RE.fullmatch(name) or RAW_NIC_RE.fullmatch(name)
    return bool(is_device) and len(tokens) > 1 and _label_kind(tokens[1]) is not None


def _parse_row(tokens: list[str], line_no: int, header: Header, position: int) -> Row:
    if header.lenient:
        tokens = split_fused_labels(tokens)
    name, width = tokens[0], len(header.devices)
    cells, extra = tokens[1 : width + 1], _unglue_na(tokens[width + 1 :])
    expected_attrs = header.attrs if name in header.gpus else []
    short = len(extra) < len(expected_attrs) and header.lenient
    if len(cells) < width or (len(extra) != len(expected_attrs) and not short):
        total = len(cells) + len(extra)
        columns = width + len(expected_attrs)
        raise TopologyParseError(f"row {name} has {total} cells, header has {columns} columns", line_no)
    _check_cells(cells, name, header.devices, position, line_no)
    if header.lenient and not _attrs_read(expected_attrs, extra):
        unread = f"line {line_no}: row {name}: affinity columns '{' '.join(extra)}' do not match the header's"
        return Row(line_no, name, cells, {}, unread + f" {', '.join(expected_attrs)}; left unknown")
    attrs = dict(zip(expected_attrs, extra, strict=True))
    _check_attrs(attrs, name, line_no)
    return Row(line_no, name, cells, attrs)


def split_fused_labels(tokens: list[str]) -> list[str]:
    """'NODENODE' -> 'NODE', 'NODE': link cells that ran together; each piece is still checked as a cell."""
    found = []
    for token in tokens:
        found += LABEL_PIECE_RE.findall(token) if FUSED_LABELS_RE.fullmatch(token) else [token]
    return found


def _attrs_read(expected: list[str], values: list[str]) -> bool:
    return len(values) == len(expected) and all(
        ATTR_VALUE_RES[column].fullmatch(value) for column, value in zip(expected, values, strict=True)
    )


def _unglue_na(tokens: list[str]) -> list[str]:
    """Split affinity values fused to a following N/A ('0-11N/A')."""
    return [piece for token in tokens for piece in re.split(r"(N/A)", token) if piece]


def _check_cells(cells: list[str], name: str, devices: list[str], position: int, line_no: int) -> None:
    for column, (device, cell) in enumerate(zip(devices, cells, strict=True)):
        if column == position and cell != SELF:
            raise TopologyParseError(f"row {name} has '{cell}' on the diagonal, expected X", line_no)
        if column != position and cell == SELF:
            raise TopologyParseError(
                f"row {name} column {device} is X, which only the diagonal may be", line_no
            )
        if column != position and _label_kind(cell) is None:
            raise TopologyParseError(f"row {name} column {device}: unknown link label '{cell}'", line_no)


def _check_attrs(attrs: dict[str, str], name: str, line_no: int) -> None:
    for column, value in attrs.items():
        if not ATTR_VALUE_RES[column].fullmatch(value):
            raise TopologyParseError(f"row {name}: '{value}' is not a {column} value", line_no)


def _label_kind(label: str) -> str | None:
    if TOPO_LABEL_RE.fullmatch(label):
        return "matrix"
    return "p2p" if label in P2P_LABELS else None


# ---------------------------------------------------------------- matrix assembly


def _matrix_kind(rows: list[Row], header: Header, command: str | None) -> str:
    """`matrix` or `p2p` from the labels, which must all belong to one of the two families."""
    kind = None
    for row in rows:
        for device, cell in zip(header.devices, row.cells, strict=True):
            cell_kind = _label_kind(cell)
            if cell_kind and kind and cell_kind != kind:
                message = f"row {row.name} column {device}: '{cell}' mixes P2P statuses with link types"
                raise TopologyParseError(message, row.line_no)
            kind = kind or cell_kind
    if kind == "p2p" and header.attrs:
        raise TopologyParseError("P2P status matrix with affinity columns", header.line_no)
    if kind is None:  # a single device: nothing but the diagonal
        kind = "p2p" if command and P2P_MODE_RE.search(command) else "matrix"
    return kind


def _links(rows: list[Row], devices: list[str]) -> list[dict[str, str]]:
    """Every unordered pair once, row-major over the upper triangle; the lower one must agree."""
    links = []
    for i, row in enumerate(rows):
        for j in range(i + 1, len(devices)):
            mirror = rows[j].cells[i]
            if mirror != row.cells[j]:
                message = (
                    f"row {rows[j].name} column {row.name} is '{mirror}' but row {row.name} "
                    f"column {rows[j].name} (line {row.line_no}) is '{row.cells[j]}'"
                )
                raise TopologyParseError(message, rows[j].line_no)
            links.append({"a": row.name, "b": devices[j], "link": row.cells[j]})
    return links


def _last_topo_command(lines: list[str], header: Header) -> str | None:
    """The last `... topo ...` command before the matrix (possibly glued to the header line)."""
    candidates = [*lines[: header.line_no - 1], header.prefix]
    for line in reversed(candidates):
        if TOPO_COMMAND_RE.search(line):
            return line
    return None


def _nic_devices(lines: list[str], start: int, nics: list[str]) -> dict[str, str]:
    """NIC legend entries ('NIC0: mlx5_0') after the matrix, wrapped or not; raw names map to themselves."""
    text = "\n".join(lines[start:])
    devices = {name: name for name in nics}
    from_legend: dict[str, str] = {}
    for match in NIC_LEGEND_RE.finditer(text):
        name, device = match.groups()
        line_no = start + text.count("\n", 0, match.start()) + 1
        if name not in devices:
            raise TopologyParseError(f"NIC legend names {name}, which is not a matrix column", line_no)
        if from_legend.get(name, device) != device:
            raise TopologyParseError(
                f"NIC legend gives {name} twice ({from_legend[name]}, {device})", line_no
            )
        from_legend[name] = device
    return devices | from_legend


def _parse_matrix(lines: list[str], header: Header) -> dict[str, Any]:
    rows, end = read_rows(lines, header)
    _refuse_trailing_rows(lines, end)
    return assemble_matrix(lines, header, rows, end)


def assemble_matrix(lines: list[str], header: Header, rows: list[Row], end: int) -> dict[str, Any]:
    """The protocol object from checked rows; `end` is the index of the first line after the matrix."""
    command = _last_topo_command(lines, header)
    kind = _matrix_kind(rows, header, command)
    links = _links(rows, header.devices)
    gpus = [_gpu_entry(row) for row in rows if row.name in header.gpus]
    nic_devices = _nic_devices(lines, end, header.nics)
    result: dict[str, Any] = {"kind": kind}
    if kind == "p2p":
        mode = P2P_MODE_RE.search(command or "")
        result["mode"] = mode.group(1) if mode else None
    result["gpus"] = gpus
    result["nics"] = [{"name": name, "device": nic_devices[name]} for name in header.nics]
    result["links"] = links
    return result


def _gpu_entry(row: Row) -> dict[str, str | None]:
    return {
        "name": row.name,
        "cpu_affinity": row.attrs.get("CPU Affinity"),
        "numa_affinity": row.attrs.get("NUMA Affinity"),
    }


def _refuse_trailing_rows(lines: list[str], end: int) -> None:
    following = _next_filled(lines, end)
    if following is not None and _looks_like_row(lines[following].split()):
        name = lines[following].split()[0]
        raise TopologyParseError(f"row {name} is not a column of the header", following + 1)


# ---------------------------------------------------------------- plain nvidia-smi table


def find_smi_table(lines: list[str]) -> int | None:
    for index, line in enumerate(lines):
        if SMI_START_RE.search(line):
            return index
    return None


def _table_cells(line: str) -> list[str]:
    if "|" not in line:
        return []
    return line[line.index("|") + 1 :].split("|")


def _parse_smi(lines: list[str], start: int) -> dict[str, Any]:
    gpus: list[dict[str, Any]] = []
    for index in range(start, len(lines)):
        if SMI_END_RE.search(lines[index]):
            break
        cells = _table_cells(lines[index])
        if len(cells) >= 2 and BUS_ID_RE.match(cells[1]):
            gpus.append(_smi_gpu(lines, index, cells[0]))
    if not gpus:
        raise TopologyParseError("nvidia-smi table has no GPU rows", start + 1)
    banners = [index for index, line in enumerate(lines) if SMI_BANNER_RE.search(line)]
    if len(banners) > 1:
        raise TopologyParseError("a second nvidia-smi table starts here; paste one at a time", banners[1] + 1)
    indexes = [gpu["index"] for gpu in gpus]
    if len(set(indexes)) != len(indexes):
        raise TopologyParseError("nvidia-smi table lists a GPU index twice", start + 1)
    return {"kind": "smi", "gpus": gpus, "nics": [], "links": []}


def _smi_gpu(lines: list[str], index: int, name_cell: str) -> dict[str, Any]:
    match = SMI_NAME_CELL_RE.fullmatch(name_cell)
    if not match:
        raise TopologyParseError(f"cannot read GPU index and name from '{name_cell.strip()}'", index + 1)
    memory_cells = _table_cells(lines[index + 1]) if index + 1 < len(lines) else []
    memory = SMI_MEMORY_RE.search(memory_cells[1]) if len(memory_cells) >= 2 else None
    if not memory:
        raise TopologyParseError(f"GPU {match.group(1)} has no 'used / total MiB' memory cell", index + 2)
    return {"index": int(match.group(1)), "name": match.group(2), "memory_total_mib": int(memory.group(2))}


# ---------------------------------------------------------------- entry points


def parse_topology(text: str) -> dict[str, Any]:
    """Parse one pasted matrix, P2P matrix or nvidia-smi table into the JSON object of the agent protocol."""
    return read_topology(text)[0]


def read_topology(text: str) -> tuple[dict[str, Any], list[str]]:
    """parse_topology plus notes on what was read leniently (affinity columns of check_env pastes)."""
    lines = clean_lines(text)
    try:
        topo = _parse_lines(lines)
    except TopologyParseError as error:
        from agents.topo_stream import parse_commented_stream

        topo = parse_commented_stream(lines)
        if topo is None:
            raise error from None
        return topo, []
    return topo, _unread_notes(lines)


def _unread_notes(lines: list[str]) -> list[str]:
    header = find_header(lines)
    if header is None or not header.lenient:
        return []
    return [row.unread for row in read_rows(lines, header)[0] if row.unread]


def _parse_lines(lines: list[str]) -> dict[str, Any]:
    if _next_filled(lines, 0) is None:
        raise TopologyParseError(
            "empty input: expected nvidia-smi topo -m, topo -p2p or nvidia-smi output", 1
        )
    header, smi_start = find_header(lines), find_smi_table(lines)
    if header and smi_start is not None:
        second = max(header.line_no, smi_start + 1)
        raise TopologyParseError("paste holds both a topology matrix and an nvidia-smi table", second)
    if smi_start is not None:
        return _parse_smi(lines, smi_start)
    if header is None:
        raise _no_matrix_error(lines)
    second_header = find_header(lines, header.line_no)
    if second_header:
        raise TopologyParseError("a second matrix starts here; paste one at a time", second_header.line_no)
    return _parse_matrix(lines, header)


def _no_matrix_error(lines: list[str]) -> TopologyParseError:
    for index, line in enumerate(lines):
        match = GPU_TOKEN_RE.search(line)
        if match and re.match(r"GPU\d+\s+(?:GPU\d+|NIC\d+|CPU)", line[match.start() :]):
            return TopologyParseError(
                f"header names {match.group()} but no {match.group()} row follows", index + 1
            )
    return TopologyParseError("no topology matrix (header starting GPU0) or nvidia-smi GPU table found", 1)


def links_by_pair(topo: dict[str, Any]) -> dict[frozenset[str], str]:
    """Link label per unordered device pair, e.g. result[frozenset({'GPU0', 'GPU1'})] == 'NV12'."""
    return {frozenset((link["a"], link["b"])): link["link"] for link in topo["links"]}


# ---------------------------------------------------------------- human output

LABEL_MEANINGS = {
    "X": "self",
    "PIX": "one PCIe bridge",
    "PXB": "several PCIe bridges",
    "PHB": "through a PCIe host bridge",
    "NODE": "between host bridges in one NUMA node",
    "SYS": "across NUMA nodes",
    "SOC": "across CPU sockets",
    "OK": "P2P works",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}


def format_human(topo: dict[str, Any]) -> str:
    if topo["kind"] == "smi":
        return _format_smi(topo)
    return "\n".join([_title(topo), *_aligned(_matrix_table(topo)), _legend(topo)])


def _title(topo: dict[str, Any]) -> str:
    counts = _plural(len(topo["gpus"]), "GPU") + (
        f", {_plural(len(topo['nics']), 'NIC')}" if topo["nics"] else ""
    )
    if topo["kind"] == "p2p":
        return f"P2P status (mode {topo['mode'] or 'not shown'}): {counts}"
    return f"Topology: {counts}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _matrix_table(topo: dict[str, Any]) -> list[list[str]]:
    devices = [gpu["name"] for gpu in topo["gpus"]] + [nic["name"] for nic in topo["nics"]]
    pairs = links_by_pair(topo)
    affinity_keys = [
        key for key in ("cpu_affinity", "numa_affinity") if any(gpu[key] for gpu in topo["gpus"])
    ]
    affinities = {gpu["name"]: [gpu[key] or "" for key in affinity_keys] for gpu in topo["gpus"]}
    titles = {"cpu_affinity": "CPU Affinity", "numa_affinity": "NUMA Affinity"}
    table = [["", *devices, *(titles[key] for key in affinity_keys)]]
    for row in devices:
        cells = [SELF if row == column else pairs[frozenset((row, column))] for column in devices]
        table.append([row, *cells, *affinities.get(row, [])])
    return table


def _aligned(table: list[list[str]]) -> list[str]:
    """Rows padded into columns; rows may be shorter than the header (NIC rows have no affinity)."""
    widths = [max(len(row[column]) for row in table if column < len(row)) for column in range(len(table[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip()
        for row in table
    ]


def _legend(topo: dict[str, Any]) -> str:
    labels = sorted({link["link"] for link in topo["links"]}, key=_closeness)
    meanings = [f"{label} = {_meaning(label)}" for label in [SELF, *labels]]
    nics = [f"{nic['name']} = {nic['device']}" for nic in topo["nics"] if nic["device"] != nic["name"]]
    return "Legend: " + ", ".join(meanings) + (f"; NICs: {', '.join(nics)}" if nics else "")


def _closeness(label: str) -> tuple[int, int]:
    """Legend order: NVLink (more links first), then PCIe paths from nearest to farthest, then P2P statuses."""
    if label.startswith("NV"):
        return (0, -int(label[2:]))
    return (1, list(LABEL_MEANINGS).index(label))


def _meaning(label: str) -> str:
    if label.startswith("NV"):
        return f"{label[2:]} bonded NVLinks"
    return LABEL_MEANINGS.get(label, label)


def _format_smi(topo: dict[str, Any]) -> str:
    table = [["GPU", "Name", "Memory"]]
    table += [[str(gpu["index"]), gpu["name"], f"{gpu['memory_total_mib']} MiB"] for gpu in topo["gpus"]]
    return "\n".join([f"nvidia-smi: {len(topo['gpus'])} GPUs", *_aligned(table)])


def decode_paste(data: bytes) -> str:
    """Text of a saved paste; PowerShell redirects write UTF-16 with a byte-order mark."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    return data.decode("utf-8-sig", errors="replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.topo", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="saved paste, or - for standard input")
    parser.add_argument("--json", action="store_true", help="print the parsed topology as JSON")
    args = parser.parse_args(argv)
    try:
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        topo, notes = read_topology(decode_paste(data))
    except OSError as error:
        print(f"error: cannot read {args.file}: {error.strerror}", file=sys.stderr)
        return 1
    except TopologyParseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(json.dumps(topo, indent=2) if args.json else format_human(topo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
