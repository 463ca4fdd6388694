"""The codec's GEMM inputs unfolded by our kernel (`ops.unfold_columns`: one copy from the history and the
new samples) or by torch (the concatenation, then a copy of the permuted unfold view, as before): one
captured 4-frame packet's replay time at 1, 16 and 64 streams, float32 (exact) and bf16 (fast) codecs, in
one process, and the kernel's waveform against torch's (the GEMMs get the same bits, so they must be equal).

Why: at 64 streams those copies and concatenations were 9 of a 15.5 ms bf16 packet (run 23's profile).

Usage: python benchmarks/device/codec_unfold_ab.py --model SNAPSHOT --out DIR
"""

from __future__ import annotations

import json

import torch
from common import load_timing_engine, measurement_parser, modes_result

from qwen3_tts_native.commands.bench import replay_ms
from qwen3_tts_native.engine.kernels import ops, reference
from qwen3_tts_native.engine.runtime.codec_graphs import CodecGraphs

VARIANTS = {"torch": reference.unfold_columns, "kernel": ops.unfold_columns}
BATCHES = (1, 16, 64)
FRAMES = 4


def main() -> int:
    parser = measurement_parser(__doc__)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = modes_result()
    shipped = ops.unfold_columns
    codes = torch.randint(0, 2048, (max(BATCHES), 16, FRAMES), device="cuda", generator=None)
    for mode in args.modes:
        engine = load_timing_engine(args.model, mode, max(BATCHES))
        assert engine.decoder is not None
        figures: dict[str, dict[str, list[float]]] = {}
        waves: dict[tuple[str, int], torch.Tensor] = {}
        try:
            for _ in range(2):  # twice, alternating
                for name, unfold in VARIANTS.items():
                    ops.unfold_columns = unfold  # type: ignore[assignment]
                    backend = CodecGraphs(engine.decoder, max(BATCHES))
                    for batch in BATCHES:
                        backend.capture_all([batch])
                        packet = backend._packets[(backend._bucket(batch), FRAMES)]
                        figures.setdefault(name, {}).setdefault(f"b{batch}_ms", []).append(
                            replay_ms(packet.graph, 20)
                        )
                        for slot in range(batch):
                            backend.reset(slot)
                        with torch.cuda.stream(backend.stream):
                            waves[(name, batch)] = backend.decode(list(range(batch)), codes[:batch]).float()
                        torch.cuda.synchronize()
                    print(mode, name, json.dumps(figures[name]), flush=True)
                    del backend
                    torch.cuda.empty_cache()
        finally:
            ops.unfold_columns = shipped  # type: ignore[assignment]
        figures["kernel_wave_equals_torch"] = {
            f"b{batch}": [float(torch.equal(waves[("kernel", batch)], waves[("torch", batch)]))]
            for batch in BATCHES
        }
        result["modes"][mode] = figures
        del engine
        torch.cuda.empty_cache()
    (args.out / "codec-unfold-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
