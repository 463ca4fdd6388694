"""Imports the project's scripts (benchmarks/, which are not packages) as modules for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """Import the script at `path` as module `name` (default: its file's stem), with its folder first on
    sys.path as when it runs: its sibling imports (benchmarks/device and benchmarks/peers each have a
    `common`) resolve to its own folder's modules."""
    name = name or path.stem
    folder = str(path.parent)
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
