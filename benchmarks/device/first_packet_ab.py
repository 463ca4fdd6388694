"""Time to first audio and request time of `synthesize` (packet 0 decoded from frame 0's codes on the device,
launched with the prefill) against the flow it replaced (prefill collected on the host, its codes sent back
for the decode, frame 1 launched beside it; `host_codes_synthesize`, the loop of f248803), one engine,
alternating rounds in one process; fast mode, the bench's 16-frame request (first packet) and 64-frame
request (all packets), each from an idle GPU.

Why: first audio moves by ~1.5 ms between processes of the same code (runs 82, 86, 87), more than the host
round trip the device path removes; only one process running both flows tells them apart.

Usage: python benchmarks/device/first_packet_ab.py --model SNAPSHOT --out DIR
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
RUNS = 10
REQUEST_FRAMES = 64


def device_codes_flow(engine: VoiceDesignEngine, seed: int) -> None:
    """`synthesize` until its first packet (then closed: frame 1 stays in flight, as in `measure_ttfa`)."""
    packets = engine.synthesize(make_request(16, seed=seed))
    next(packets)
    packets.close()


def host_codes_flow(engine: VoiceDesignEngine, seed: int) -> None:
    """The replaced flow: frame 0 collected on the host, its codes uploaded for the decode, frame 1 launched
    beside the decode, the packet collected (frame 1 left in flight, as a closed `synthesize` leaves it)."""
    session = engine.start_session(make_request(16, seed=seed))
    try:
        result = engine.prefill(session)
        assert result.codes is not None
        decode = engine.launch_decode([session], [result.codes.unsqueeze(0)])
        engine.launch_step([session])
        engine.collect_decode(decode)
    finally:
        engine.release(session)


def host_codes_synthesize(engine: VoiceDesignEngine, request: SynthesisRequest) -> Iterator[AudioPacket]:
    """`VoiceDesignEngine.synthesize` as of f248803 (packets of 1 then 4 frames), through the engine's API."""
    session = engine.start_session(request)
    try:
        sequence = first_frame = 0
        buffer: list[Tensor] = []
        held: tuple[int, int, PendingDecode] | None = None
        result, pending = engine.prefill(session), None
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
                frames = torch.stack(buffer)
                if session.frames_emitted < EOS_BAN_FRAMES:
                    decode = engine.launch_decode([session], [frames])
                    if pending is None and engine.can_launch(session):
                        pending = engine.launch_step([session])
                    pcm = engine.collect_decode(decode)[0]
                    yield AudioPacket(sequence, first_frame, len(buffer), pcm, False, None)
                    sequence += 1
                else:
                    held = (first_frame, len(buffer), engine.launch_decode([session], [frames]))
                first_frame, buffer = first_frame + len(buffer), []
            result, pending = engine._solo_next(session, pending)
        if buffer:
            pcm = engine.decode_packet(session, torch.stack(buffer))
            yield AudioPacket(sequence, first_frame, len(buffer), pcm, True, result.finish_reason)
        elif held is not None:
            pcm = engine.collect_decode(held[2])[0]
            yield AudioPacket(sequence, held[0], held[1], pcm, True, result.finish_reason)
    finally:
        engine.release(session)


def device_codes_request(engine: VoiceDesignEngine, seed: int) -> None:
    for _ in engine.synthesize(make_request(REQUEST_FRAMES, seed=seed)):
        pass


def host_codes_request(engine: VoiceDesignEngine, seed: int) -> None:
    for _ in host_codes_synthesize(engine, make_request(REQUEST_FRAMES, seed=seed)):
        pass


def main() -> int:
    args = measurement_parser(__doc__, modes=False).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    engine = load_timing_engine(zero_eos_copy(args.model), "fast", 1)
    flows = {
        "first_packet_device_codes": device_codes_flow,
        "first_packet_host_codes": host_codes_flow,
        "request_device_codes": device_codes_request,
        "request_host_codes": host_codes_request,
    }
    for flow in flows.values():
        median_request_ms(engine, flow, RUNS)  # warm every path (the codec's 1-frame graph, the threads)
    rounds: dict[str, list[float]] = {name: [] for name in flows}
    for _ in range(ROUNDS):
        for name, flow in flows.items():
            rounds[name].append(round(median_request_ms(engine, flow, RUNS), 3))
    result = modes_result()
    result["modes"] = {
        name: {"median_ms": statistics.median(values), "round_medians_ms": values}
        for name, values in rounds.items()
    }
    print(json.dumps(result["modes"], indent=1), flush=True)
    (args.out / "first-packet-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
