"""Shared test setup: the repository root (for `comfy_node`) and tests/ (for the harness
modules) on sys.path, since the tests are imported by path (see pyproject's pytest options)."""

import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
for path in (ROOT, TESTS):
    if path not in sys.path:
        sys.path.insert(0, path)
