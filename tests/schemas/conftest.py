"""tests/schemas: their shared strategies importable."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/schemas only, for schema_strategies
