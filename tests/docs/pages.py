"""The pages whose code blocks the tests run: the README and every docs page."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
# A block whose first line starts so is not run; the reader sees the line and why.
SKETCH = "# sketch:"
