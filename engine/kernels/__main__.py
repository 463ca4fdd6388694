"""`python -m qwen3_tts_native.engine.kernels build`: prebuild the extension into the cache (image build)."""

from __future__ import annotations

import argparse
import sys

from . import loader


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_tts_native.engine.kernels")
    parser.add_argument(
        "command", choices=["build", "where"], help="build: compile now; where: print the cache dir"
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to build", file=sys.stderr)
        return 1
    capability = torch.cuda.get_device_capability()
    if args.command == "where":
        print(loader.cache_dir(capability))
        return 0
    module = loader.build(verbose=args.verbose)
    print(f"built {module.__name__} in {loader.cache_dir(capability)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
