"""The simulator tests import their brute-force reference (`simulation_reference`) from this folder."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
