"""Where one 4-frame codec packet of B streams spends its GPU time, op by op with input shapes: the eager
decoder pass (the same ops a packet graph replays), profiled once after a warm pass, per mode.

Why: the graph's profile (bench `profile-*-codec-b64.txt`) names kernels but not the ops or shapes behind
them: the generic copy and elementwise kernels of a 64-stream packet (~1.5 ms of ~9.4 ms in fast mode, run
33) could be residual adds, reorders of the transposed convs' outputs or the state's gathers.

Usage: python benchmarks/device/codec_packet_profile.py --model SNAPSHOT --out DIR [--streams 64]
"""

from __future__ import annotations

import torch
from common import load_timing_engine, measurement_parser
from torch.profiler import ProfilerActivity, profile

from qwen3_tts_native.engine.runtime.codec_graphs import fp32_codec

FRAMES = 4


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--streams", type=int, default=64)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tables = []
    for mode in args.modes:
        engine = load_timing_engine(args.model, mode, args.streams)
        decoder = engine.decoder
        codes = torch.randint(0, 2048, (args.streams, 16, FRAMES), device="cuda")
        with fp32_codec():
            state = decoder.new_stream_state(args.streams)
            decoder(codes, state, compact=False)
            torch.cuda.synchronize()
            activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
            with profile(activities=activities, record_shapes=True) as prof:
                decoder(codes, state, compact=False)
                torch.cuda.synchronize()
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by="cuda_time_total", row_limit=45, max_name_column_width=40, max_shapes_column_width=90
        )
        tables.append(f"# {mode}: one eager {FRAMES}-frame packet of {args.streams} streams\n{table}\n")
        print(tables[-1], flush=True)
        del engine, decoder, state
        torch.cuda.empty_cache()
    (args.out / "codec-packet-profile.txt").write_text("\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
