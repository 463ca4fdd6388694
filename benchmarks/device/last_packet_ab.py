"""A solo request's wall time with `synthesize`'s last packet decoded from the last frame's device codes
(launched right behind that frame) against the flow it replaced (the last frame collected on the host, then
its packet decoded; `collected_last_synthesize`, the loop of 1e841b6), one engine, alternating rounds in one
process; fast mode, the bench's 64-frame request, each from an idle GPU. The seeded requests' PCM of both
flows is compared too (the same packets, bit for bit, when the last frame is not EOS).

Why: the profiled tail after the last frame fell 1.99 -> 1.31 ms (run 92), but one process per tree could
not resolve the request time: a process's host speed varies by up to 2x between processes (run 91).

Usage: python benchmarks/device/last_packet_ab.py --model SNAPSHOT --out DIR
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator

import torch
from common import load_timing_engine, measurement_parser, median_request_ms, modes_result
from torch import Tensor

from qwen3_tts_native.commands.bench import make_request, zero_eos_copy
from qwen3_tts_native.engine.runtime.engine import PendingDecode, VoiceDesignEngine
from qwen3_tts_native.engine.runtime.request import AudioPacket, SynthesisRequest
from qwen3_tts_native.engine.runtime.sampling import EOS_BAN_FRAMES

ROUNDS = 6
RUNS = 8
REQUEST_FRAMES = 64


def collected_last_synthesize(engine: VoiceDesignEngine, request: SynthesisRequest) -> Iterator[AudioPacket]:
    """`VoiceDesignEngine.synthesize` as of 1e841b6 (1-frame first packet from frame 0's device codes, then
    4-frame packets, the last one decoded after its last frame is collected), through the engine's API."""
    session = engine.start_session(request)
    try:
        sequence = first_frame = 0
        buffer: list[Tensor] = []
        held: tuple[int, int, PendingDecode] | None = None
        launched, pending = engine.launch_prefill([session]), None
        early: PendingDecode | None = engine.launch_decode([session], [launched.device_codes.clone()])
        if engine.can_launch(session):
            pending = engine.launch_step([session])
        result = engine._all(engine.collect_step(launched))[0]
        while True:
            if result.codes is not None:
                if held is not None:
                    pcm = engine.collect_decode(held[2])[0]
                    yield AudioPacket(sequence, held[0], held[1], pcm, False, None)
                    sequence, held = sequence + 1, None
                buffer.append(result.codes)
            if result.finish_reason is not None:
                break
            if len(buffer) == (1 if sequence == 0 else 4):
                if early is None:
                    early = engine.launch_decode([session], [torch.stack(buffer)])
                decode, early = early, None
                if session.frames_emitted < EOS_BAN_FRAMES:
                    if pending is None and engine.can_launch(session):
                        pending = engine.launch_step([session])
                    pcm = engine.collect_decode(decode)[0]
                    yield AudioPacket(sequence, first_frame, len(buffer), pcm, False, None)
                    sequence += 1
                else:
                    held = (first_frame, len(buffer), decode)
                first_frame, buffer = first_frame + len(buffer), []
            result, pending = engine._solo_next(session, pending)
        if early is not None:
            pcm = engine.collect_decode(early)[0]
            yield AudioPacket(sequence, first_frame, len(buffer), pcm, True, result.finish_reason)
        elif buffer:
            pcm = engine.decode_packet(session, torch.stack(buffer))
            yield AudioPacket(sequence, first_frame, len(buffer), pcm, True, result.finish_reason)
        elif held is not None:
            pcm = engine.collect_decode(held[2])[0]
            yield AudioPacket(sequence, held[0], held[1], pcm, True, result.finish_reason)
    finally:
        engine.release(session)


def device_codes_request(engine: VoiceDesignEngine, seed: int) -> list[AudioPacket]:
    return list(engine.synthesize(make_request(REQUEST_FRAMES, seed=seed)))


def collected_request(engine: VoiceDesignEngine, seed: int) -> list[AudioPacket]:
    return list(collected_last_synthesize(engine, make_request(REQUEST_FRAMES, seed=seed)))


def main() -> int:
    args = measurement_parser(__doc__, modes=False).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    engine = load_timing_engine(zero_eos_copy(args.model), "fast", 1)
    flows = {"last_packet_device_codes": device_codes_request, "last_packet_collected": collected_request}
    same = all(device_codes_request(engine, seed) == collected_request(engine, seed) for seed in range(2))
    rounds: dict[str, list[float]] = {name: [] for name in flows}
    for _ in range(ROUNDS):
        for name, flow in flows.items():
            rounds[name].append(round(median_request_ms(engine, flow, RUNS), 3))
    result = modes_result()
    result["same_packets"] = same
    result["modes"] = {
        name: {"median_ms": statistics.median(values), "round_medians_ms": values}
        for name, values in rounds.items()
    }
    print(json.dumps({"same_packets": same, **result["modes"]}, indent=1), flush=True)
    (args.out / "last-packet-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
