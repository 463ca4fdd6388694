"""A/B, in one process on a full random snapshot: the L2 persisting window over the code predictor's weights
(runtime/l2_residency.py) and the solo loop's held-packet decode overlap (`VoiceDesignEngine.synthesize`).

Per mode:
- frame graph replay at 1 and 64 streams, one backend per L2 set-aside (none, a quarter, half, all the device
  allows; the window's hit ratio follows it), each captured once, replayed back to back in rounds;
- a 4-frame codec packet of 1 and of 64 sessions (`decode_packets`, wall time) with the L2 set aside and
  without: the set-aside shrinks the L2 left to the codec's GEMMs;
- single-stream RTF of `synthesize` (64 frames, as `qwen3-tts bench`) and of the frame loop with the L2 set
  aside and without, and `synthesize` with each packet's decode waited for at once (`blocking`, the loop as
  it was) against collected when the packet goes out (`overlapped`).

Usage: python benchmarks/device/l2_residency_ab.py --model SNAPSHOT --out DIR [--modes exact,fast]
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from common import measurement_parser, record_medians

from qwen3_tts_native.commands.bench import FRAME_SECONDS, make_request, replay_ms, zero_eos_copy
from qwen3_tts_native.engine.kernels import ops
from qwen3_tts_native.engine.runtime import codec_graphs, graphs
from qwen3_tts_native.engine.runtime.engine import PendingDecode, VoiceDesignEngine
from qwen3_tts_native.engine.runtime.modes import resolve_mode

ROUNDS = 5
STREAMS = 64
FRAMES = 64


def decode_wall_ms(engine: VoiceDesignEngine, sessions: list[Any], runs: int = 10) -> float:
    codes = [torch.randint(0, 2048, (4, 16), device=engine.device) for _ in sessions]
    engine.decode_packets(sessions, codes)
    values = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.decode_packets(sessions, codes)
        values.append((time.perf_counter() - start) * 1000)
    return statistics.median(values)


def blocking(launch_decode: Callable[..., PendingDecode]) -> Callable[..., PendingDecode]:
    """`launch_decode` that waits for the decode before returning: the solo loop as it was before the
    overlap, which decoded each packet with `decode_packet`."""

    def launch(sessions: list[Any], frames: list[torch.Tensor]) -> PendingDecode:
        pending = launch_decode(sessions, frames)
        if pending.ready is not None:
            pending.ready.synchronize()
        return pending

    return launch


def synthesize_rtf(engine: VoiceDesignEngine, seed: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    frames = sum(p.frame_count for p in engine.synthesize(make_request(FRAMES, seed=seed)))
    return (time.perf_counter() - start) / (frames * FRAME_SECONDS)


def loop_rtf(engine: VoiceDesignEngine, seed: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    codes = engine.generate_codes(make_request(FRAMES, seed=seed))
    return (time.perf_counter() - start) / (codes.shape[0] * FRAME_SECONDS)


def main() -> int:
    parser = measurement_parser(__doc__)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    limits = ops.l2_persisting_limits()
    assert limits is not None, "the CUDA extension did not load"
    l2, most, largest_window = limits
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "l2_bytes": l2,
        "max_persisting_l2_bytes": most,
        "max_access_window_bytes": largest_window,
        "modes": {},
    }
    print(json.dumps(result), flush=True)
    for mode_name in [m for m in args.modes.split(",") if m]:
        mode = resolve_mode(mode_name)
        engine = VoiceDesignEngine.load(
            timing_model,
            device="cuda",
            dtype=torch.bfloat16,
            codec_dtype=mode.codec_dtype,
            max_sessions=STREAMS,
            max_context=512,
            accelerate=False,
        )
        solo = engine.start_session(make_request(300, seed=7))
        crowd = [engine.start_session(make_request(300, seed=100 + i)) for i in range(STREAMS - 1)]
        backends: dict[str, graphs.GraphFrameBackend] = {}
        for label, size in (("none", 0), ("quarter", most // 4), ("half", most // 2), ("all", most)):
            backend = graphs.GraphFrameBackend(
                engine.talker, engine.predictor, mode, buckets=(1, STREAMS), l2_set_aside=size
            )
            graphs.install(engine, backend)
            if not backends:
                engine.prefill(solo)
                engine.prefill_many(crowd)
            engine.step([solo])
            engine.step([solo, *crowd])
            backends[label] = backend
        samples: dict[str, dict[str, list[float]]] = {}
        for _ in range(ROUNDS):
            for label, backend in backends.items():
                residency = backend.residency
                ops.set_l2_persisting_size(0 if residency is None else residency.set_aside)
                figures = samples.setdefault(f"set_aside_{label}", {})
                figures.setdefault("replay_ms_b1", []).append(replay_ms(backend.decode_graph(1), 30))
                crowd_ms = replay_ms(backend.decode_graph(STREAMS), 10)
                figures.setdefault(f"replay_ms_b{STREAMS}", []).append(crowd_ms)
        engine.release(solo)
        for session in crowd:
            engine.release(session)
        best = backends["all"]
        graphs.install(engine, best)
        assert engine.decoder is not None
        codec = codec_graphs.CodecGraphs(engine.decoder, engine.cache.k.shape[1], (1, STREAMS))
        codec_graphs.install(engine, codec)
        set_aside = 0 if best.residency is None else best.residency.set_aside
        launch_decode = engine.launch_decode
        blocking_launch = blocking(launch_decode)
        synthesize_rtf(engine, 0)  # captures the 1-frame and 4-frame packets of bucket 1
        for round_index in range(ROUNDS):
            for on in (True, False):
                ops.set_l2_persisting_size(set_aside if on else 0)
                figures = samples.setdefault(f"l2_{'on' if on else 'off'}", {})
                sessions = [engine.start_session(make_request(8, seed=i)) for i in range(STREAMS)]
                figures.setdefault("codec_4_frame_ms_b1", []).append(decode_wall_ms(engine, sessions[:1]))
                crowd_ms = decode_wall_ms(engine, sessions)
                figures.setdefault(f"codec_4_frame_ms_b{STREAMS}", []).append(crowd_ms)
                for session in sessions:
                    engine.release(session)
                figures.setdefault("loop_rtf", []).append(loop_rtf(engine, 200 + round_index))
                for overlapped in (True, False):
                    chosen = launch_decode if overlapped else blocking_launch
                    engine.launch_decode = chosen  # type: ignore[method-assign]
                    key = "synthesize_rtf_overlapped" if overlapped else "synthesize_rtf_blocking"
                    figures.setdefault(key, []).append(synthesize_rtf(engine, 100 + round_index))
                engine.launch_decode = launch_decode  # type: ignore[method-assign]
        record_medians(result, mode_name, samples)
        result["modes"][mode_name]["hit_ratio"] = None if best.residency is None else best.residency.hit_ratio
        result["modes"][mode_name]["window_bytes"] = (
            None if best.residency is None else best.residency.region.numel()
        )
        del engine, backends, best
        torch.cuda.empty_cache()
        ops.set_l2_persisting_size(0)
    (args.out / "l2-residency-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
