"""A `nvidia-smi topo -m` paste kept in source comments and reflowed by a code formatter.

clang-format or black rewrap comment lines, so a physical line may hold the end of one row and the label of
the next, and the header may wrap ("CPU Affinity    NUMA" / "Affinity   GPU NUMA ID"). The paste is then read
as one stream of tokens: the header gives the device columns and the affinity columns, and every row must
be exactly its label, one valid cell per device (X on the diagonal) and, for GPU rows, one value per affinity
column. Used only when the line-by-line parser refused the paste and the matrix sits in comment lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agents.topo import (
    ATTR_NAMES,
    ATTR_VALUE_RES,
    GPU_NAME_RE,
    LEGEND_RE,
    NIC_NAME_RE,
    RAW_NIC_RE,
    SELF,
    Header,
    Row,
    TopologyParseError,
    _check_cells,
    _label_kind,
    _unglue_na,
    assemble_matrix,
)

COMMENT_RE = re.compile(r"^[ \t]*(?://+|#+|;+|--)[ \t]?")
ATTR_WORDS = {("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID")}


@dataclass(frozen=True)
class Token:
    text: str
    line_no: int


def parse_commented_stream(lines: list[str]) -> dict[str, Any] | None:
    """The matrix read as a token stream, or None when the paste is not a commented matrix or does not read
    exactly (the caller then reports its own line-by-line error)."""
    stripped = [COMMENT_RE.sub("", line) for line in lines]
    if stripped == lines or not any(COMMENT_RE.match(line) and "GPU0" in line for line in lines):
        return None
    tokens = _tokens(stripped)
    try:
        for start, token in enumerate(tokens):
            if token.text == "GPU0":
                found = _read_from(stripped, tokens, start)
                if found is not None:
                    return found
    except TopologyParseError:
        return None
    return None


def _tokens(lines: list[str]) -> list[Token]:
    found = []
    for index, line in enumerate(lines):
        if LEGEND_RE.match(line):
            break
        found += [Token(text, index + 1) for text in line.split()]
    return found


def _read_from(lines: list[str], tokens: list[Token], start: int) -> dict[str, Any] | None:
    devices, at = _devices(tokens, start)
    attrs, at = _attr_names(tokens, at)
    if len(devices) < 2 or at + 1 >= len(tokens) or tokens[at].text != devices[0]:
        return None
    if tokens[at + 1].text != SELF:
        return None
    header = Header(tokens[start].line_no, "", devices, attrs)
    rows, at = _rows(tokens, at, header)
    if at < len(tokens) and _is_device(tokens[at].text):
        raise TopologyParseError(f"row {tokens[at].text} is not a column of the header", tokens[at].line_no)
    return assemble_matrix(lines, header, rows, rows[-1].line_no)


def _is_device(text: str) -> bool:
    return bool(GPU_NAME_RE.fullmatch(text) or NIC_NAME_RE.fullmatch(text) or RAW_NIC_RE.fullmatch(text))


def _devices(tokens: list[Token], at: int) -> tuple[list[str], int]:
    devices: list[str] = []
    while at < len(tokens) and _is_device(tokens[at].text) and tokens[at].text not in devices:
        devices.append(tokens[at].text)
        at += 1
    return devices, at


def _attr_names(tokens: list[Token], at: int) -> tuple[list[str], int]:
    names = []
    while True:
        words = next((w for w in ATTR_WORDS if _words_at(tokens, at, w)), None)
        if words is None:
            return names, at
        names.append(ATTR_NAMES["".join(words)])
        at += len(words)


def _words_at(tokens: list[Token], at: int, words: tuple[str, ...]) -> bool:
    return tuple(t.text for t in tokens[at : at + len(words)]) == words


def _rows(tokens: list[Token], at: int, header: Header) -> tuple[list[Row], int]:
    rows = []
    width = len(header.devices)
    for position, name in enumerate(header.devices):
        if at >= len(tokens) or tokens[at].text != name:
            where = tokens[at].line_no if at < len(tokens) else tokens[-1].line_no
            raise TopologyParseError(f"expected row {name}", where)
        line_no = tokens[at].line_no
        cells = [t.text for t in tokens[at + 1 : at + 1 + width]]
        if len(cells) < width or any(_label_kind(c) is None and c != SELF for c in cells):
            raise TopologyParseError(f"row {name} is cut short or holds a non-label cell", line_no)
        _check_cells(cells, name, header.devices, position, line_no)
        at += 1 + width
        attrs, at = _row_attrs(tokens, at, header.attrs if name in header.gpus else [], name)
        rows.append(Row(line_no, name, cells, attrs))
    return rows, at


def _row_attrs(tokens: list[Token], at: int, columns: list[str], name: str) -> tuple[dict[str, str], int]:
    values = _unglue_na([t.text for t in tokens[at : at + len(columns)]])[: len(columns)]
    for column, value in zip(columns, values, strict=False):
        if not ATTR_VALUE_RES[column].fullmatch(value):
            raise TopologyParseError(f"row {name}: '{value}' is not a {column} value", tokens[at].line_no)
    if len(values) != len(columns):
        raise TopologyParseError(f"row {name} is missing affinity values", tokens[at - 1].line_no)
    return dict(zip(columns, values, strict=True)), at + len(columns)
