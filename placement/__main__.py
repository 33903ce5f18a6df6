"""`python -m placement plan ...` / `python -m placement check ... -- <command>`."""

from __future__ import annotations

import sys

from placement.cli import main

sys.exit(main())
