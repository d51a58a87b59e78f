"""The CLI tests' helpers live in signal_helpers.py (importable from here)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/cli only, for signal_helpers
