"""How far the torch reference (the foundation engine: `accelerate=False`, cuBLAS in bf16 on the GPU)
reproduces its own greedy codes when only its batch changes: a request alone, the same request again alone,
and the same request stepped beside two others. On random weights the logits have near-ties that a change
of summation order flips, so this bounds what "reproduces the reference's greedy codes" can mean for any
implementation that does not sum in cuBLAS's order (ours sums in the GEMV's, whatever the batch).

Usage: python benchmarks/device/reference_batch_invariance.py --model SNAPSHOT --out DIR
"""

from __future__ import annotations

import json

import torch
from common import measurement_parser

from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.request import PredictorSampling, SynthesisRequest, TalkerSampling

FRAMES = 200
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."
VOICES = ("A deep, slow male voice.", "A bright young female voice.", "An old man, whispering.")


def greedy(voice: str) -> SynthesisRequest:
    return SynthesisRequest(
        TEXT,
        voice,
        language="english",
        max_frames=FRAMES,
        talker_sampling=TalkerSampling(greedy=True),
        predictor_sampling=PredictorSampling(greedy=True),
    )


def together(engine: VoiceDesignEngine, requests: list[SynthesisRequest]) -> torch.Tensor:
    """The first request's codes [T, 16] when all are stepped as one batch until it ends."""
    sessions = [engine.start_session(r) for r in requests]
    try:
        frames: list[torch.Tensor] = []
        results = engine.prefill_many(sessions)
        active = list(sessions)
        while True:
            result = results[active.index(sessions[0])]
            if result.codes is not None:
                frames.append(result.codes)
            if result.finish_reason is not None:
                return torch.stack(frames)
            active = [s for s, r in zip(active, results, strict=True) if r.finish_reason is None]
            results = engine.step(active)
    finally:
        for session in sessions:
            engine.release(session)


def identical_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[0], b.shape[0])
    differs = (a[:n] != b[:n]).any(dim=1).nonzero()
    return int(differs[0]) if differs.numel() else n


def main() -> int:
    args = measurement_parser(__doc__, modes=False).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    engine = VoiceDesignEngine.load(
        args.model, device="cuda", dtype=torch.bfloat16, max_sessions=4, max_context=512, accelerate=False
    )
    alone = engine.generate_codes(greedy(VOICES[0]))
    again = engine.generate_codes(greedy(VOICES[0]))
    beside_two = together(engine, [greedy(v) for v in VOICES])
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "frames": [alone.shape[0], again.shape[0], beside_two.shape[0]],
        "alone_vs_alone_identical_prefix_frames": identical_prefix(alone, again),
        "alone_vs_batch_of_3_identical_prefix_frames": identical_prefix(alone, beside_two),
        "alone_vs_batch_of_3_frames_differing": int(
            (alone[: beside_two.shape[0]] != beside_two[: alone.shape[0]]).any(dim=1).sum()
        ),
    }
    print(json.dumps(result, indent=1))
    (args.out / "reference-batch-invariance.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
