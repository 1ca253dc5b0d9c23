"""ComfyUI in this process, for the check scripts that a test runs under each ComfyUI version's
Python (`python tests/X_check.py COMFY_DIR ...`; their folder is first on sys.path)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_comfy(comfy_dir, *comfy_args):
    """Makes ComfyUI (in `comfy_dir`) and this repository importable and lets ComfyUI parse only
    `comfy_args`: comfy.cli_args reads sys.argv when it is first imported."""
    sys.path[:0] = [comfy_dir, ROOT]
    sys.argv = [sys.argv[0], *comfy_args]
    import comfy.options

    comfy.options.enable_args_parsing()
