"""One captured codec packet's replay time at 1, 4, 16 and 64 streams (4 frames; and the 1-frame first packet
of one stream), float32 (exact) and bf16 (fast) codecs, and the waveforms of one fixed set of codes, for the
code on PYTHONPATH. Run it for two trees in one call to compare them on one machine (`--compare`).

Why: a codec change that restructures the decoder (a bias carried instead of added, a kernel in place of a
GEMM) cannot be switched inside one process the way `codec_unfold_ab.py` switches one op. Four streams: a
batch where a routing by grid size (`triton_conv.suits`) sends some of a packet's convs each way.

Usage: python benchmarks/device/codec_packet_time.py --model SNAPSHOT --out DIR --tag NAME
       python benchmarks/device/codec_packet_time.py --compare DIR BASE NEW
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BATCHES = (1, 4, 16, 64)
FRAMES = 4


def measure(args: argparse.Namespace) -> int:
    import torch
    from common import load_timing_engine, modes_result

    from qwen3_tts_native.commands.bench import replay_ms
    from qwen3_tts_native.engine.runtime.codec_graphs import CodecGraphs

    result = modes_result()
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 2048, (max(BATCHES), 16, FRAMES), generator=generator).cuda()
    waves: dict[str, torch.Tensor] = {}
    for mode in args.modes:
        engine = load_timing_engine(args.model, mode, max(BATCHES))
        backend = CodecGraphs(engine.decoder, max(BATCHES))
        figures: dict[str, float] = {}
        for batch in BATCHES:
            backend.capture_all([batch])
            for frames in (1, FRAMES) if batch == 1 else (FRAMES,):
                packet = backend._packets[(backend._bucket(batch), frames)]
                figures[f"b{batch}_{frames}f_ms"] = min(replay_ms(packet.graph, 20) for _ in range(3))
            for slot in range(batch):
                backend.reset(slot)
            with torch.cuda.stream(backend.stream):
                waves[f"{mode}_b{batch}"] = backend.decode(list(range(batch)), codes[:batch]).float().cpu()
            torch.cuda.synchronize()
        result["modes"][mode] = figures
        print(args.tag, mode, json.dumps(figures), flush=True)
        del backend, engine
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"codec-packet-{args.tag}.json").write_text(json.dumps(result, indent=2))
    torch.save(waves, args.out / f"codec-waves-{args.tag}.pt")
    return 0


def compare(folder: Path, base: str, new: str, prefix: str = "codec-packet") -> int:
    """Per mode: both trees' figures (`<prefix>-<tag>.json`) side by side, and the largest waveform
    difference between them where both wrote waveforms (`codec-waves-<tag>.pt`); written to
    `<prefix>-compare-<base>-<new>.json`, a file a pair (ab_trees.sh compares several trees in a folder)."""
    import torch

    timings = {tag: json.loads((folder / f"{prefix}-{tag}.json").read_text()) for tag in (base, new)}
    wave_files = {tag: folder / f"codec-waves-{tag}.pt" for tag in (base, new)}
    with_waves = prefix == "codec-packet" and all(path.exists() for path in wave_files.values())
    waves = {tag: torch.load(path) for tag, path in wave_files.items()} if with_waves else {}
    report: dict[str, dict[str, object]] = {}
    for mode, figures in timings[new]["modes"].items():
        rows: dict[str, object] = {}
        for key, value in figures.items():
            rows[key] = {base: timings[base]["modes"][mode][key], new: value}
        for name in [n for n in waves.get(new, {}) if n.startswith(mode)]:
            rows[f"{name.removeprefix(mode + '_')}_max_abs_wave_difference"] = float(
                (waves[new][name] - waves[base][name]).abs().max()
            )
        report[mode] = rows
    (folder / f"{prefix}-compare-{base}-{new}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=1))
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        return compare(Path(sys.argv[2]), sys.argv[3], sys.argv[4])
    from common import measurement_parser

    parser = measurement_parser(__doc__)
    parser.add_argument("--tag", required=True, help="names the JSON and the waveforms written")
    return measure(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
