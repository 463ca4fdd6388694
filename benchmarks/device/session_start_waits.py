"""Which host step of opening a session waits for the CUDA stream: each step of `start_session` runs behind
a spinning kernel (`torch.cuda._sleep`) and reports whether that kernel was still running when it returned.

Why: the server opens a newcomer's session while other sessions' frames are on the stream. A step that waits
for the stream (a pageable upload, an allocation that synchronizes) makes the GPU idle through the rest of
the admission; `tests/device/test_scheduler_on_cuda.py` asserts that `start_session` as a whole does not.
Uses a tiny random snapshot made here.

Usage: python benchmarks/device/session_start_waits.py
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from qwen3_tts_native.engine.checkpoint import write_random_snapshot
from qwen3_tts_native.engine.prompt import build_prompt_plan
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.request import SynthesisRequest
from qwen3_tts_native.engine.runtime.sampling import SamplingRows

SPIN_CYCLES = 1_000_000_000


def probe(name: str, step: Callable[[], Any]) -> Any:
    """Run `step` behind a spinning kernel; print whether it returned while the kernel still ran."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN_CYCLES)
    start = time.perf_counter()
    out = step()
    host_ms = (time.perf_counter() - start) * 1e3
    verdict = "waited for the stream" if torch.cuda.current_stream().query() else "did not wait"
    print(f"{name:<28} {verdict:<22} {host_ms:8.2f} ms", flush=True)
    torch.cuda.synchronize()
    return out


def main() -> int:
    folder = Path(tempfile.mkdtemp())
    write_random_snapshot(folder, "tiny", 0)
    engine = VoiceDesignEngine.load(folder, device="cuda", dtype=torch.bfloat16, max_sessions=4)
    request = SynthesisRequest("A newcomer.", "A calm voice.", seed=3, max_frames=4)
    list(engine.synthesize(request))
    tokenizer = engine.tokenizer
    assert tokenizer is not None
    probe("nothing", lambda: None)
    plan = probe(
        "build_prompt_plan",
        lambda: build_prompt_plan(
            tokenizer,
            engine.config,
            request.text,
            request.voice_description,
            request.language,
            request.text_mode,
        ),
    )
    probe("prompt_embeddings", lambda: engine.talker.prompt_embeddings(plan))
    probe("pinned upload", lambda: torch.tensor([1.0]).pin_memory().to("cuda", non_blocking=True))
    probe(
        "SamplingRows.single",
        lambda: SamplingRows.single(greedy=False, temperature=0.9, top_k=50, top_p=1.0, device=engine.device),
    )
    backend = engine.codec_backend
    if backend is not None:
        probe("codec reset", lambda: backend.reset(0))
    probe("cb0 history zero", lambda: engine.slot_state.cb0_history[0].zero_())
    for attempt in ("start_session", "start_session again"):
        engine.release(probe(attempt, lambda: engine.start_session(request)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
