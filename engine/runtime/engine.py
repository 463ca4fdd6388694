"""VoiceDesignEngine: sessions in, frames and PCM packets out (docs/architecture.md, "the frame loop").

Frame accounting (model.md §2.6): `prefill` runs the prompt and produces frame 0; each `step` feeds a
session's previous frame (+ its text-stream element) to the talker, samples the next cb0 and, unless it is
EOS, completes the frame with the predictor. EOS ends a session with "stop" and yields no frame; the frame
that brings a session to `max_frames` ends it with "length", so no talker step is wasted after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import Tensor

from ..audio import float_to_pcm16
from ..config import VoiceDesignConfig, load_config
from ..errors import EngineError, InvalidRequestError
from ..model.codec import CodecStreamState, SpeechDecoder
from ..model.predictor import CodePredictor
from ..model.talker import PromptPlanLike, Talker
from ..prompt import build_prompt_plan
from ..snapshot import load_speech_decoder_tensors, load_voice_design_tensors
from ..tokenizer import TextTokenizer
from .codec_graphs import CodecGraphs, fp32_codec
from .graphs import SCRATCH_SLOTS
from .modes import Mode, resolve_mode
from .request import AudioPacket, FrameResult, SynthesisRequest, validate_request
from .sampling import EOS_BAN_FRAMES, SamplingRows
from .session import Session
from .step import EagerFrameBackend, FrameBackend, FrameRows


class VoiceDesignEngine:
    """Owns the weights, the talker KV pool (one slot per live session) and the speech decoder.

    Not thread-safe: one engine thread calls it. The KV pool is [layers, max_sessions, kv_heads,
    max_context, head_dim]; a session needs prompt length + max_frames - 1 positions.
    """

    def __init__(
        self,
        config: VoiceDesignConfig,
        talker: Talker,
        predictor: CodePredictor,
        tokenizer: TextTokenizer | None = None,
        decoder: SpeechDecoder | None = None,
        max_sessions: int = 8,
        max_context: int = 4096,
        scratch_slots: int = 0,
    ) -> None:
        self.config = config
        self.talker = talker
        self.predictor = predictor
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.max_sessions = max_sessions
        self.max_context = max_context
        self.device = talker.codec_embedding.device
        self.cache = talker.new_cache(max_sessions + scratch_slots, max_context)
        """KV pool: slots 0..max_sessions-1 belong to sessions; `scratch_slots` more (the graphs' padding
        rows) are allocated up front when the engine will be accelerated, so installing them reallocates
        nothing."""
        self._free_slots = list(range(max_sessions))
        self.frame_backend: FrameBackend = EagerFrameBackend()
        """Computes the frames; runtime/graphs.py swaps in CUDA graphs (and grows the cache by its scratch
        slots, which are never handed to a session)."""
        self.codec_backend: CodecGraphs | None = None
        """Decodes packets; runtime/codec_graphs.py swaps in CUDA graphs over a slot-indexed state pool."""

    @classmethod
    def load(
        cls,
        snapshot_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        codec_dtype: torch.dtype | None = None,
        max_sessions: int = 8,
        max_context: int = 4096,
        *,
        accelerate: bool | None = None,
        mode: Mode | str | None = None,
    ) -> VoiceDesignEngine:
        """Load a snapshot: config, checked tensors, text tokenizer, talker, predictor, speech decoder.

        accelerate (default: on a CUDA device): put the engine on its CUDA graphs of `mode` (default:
        QWEN3_TTS_MODE, else exact) and capture them before returning (runtime/accelerate.py), sized to
        `max_sessions`. codec_dtype (default: the mode's when accelerated, else float32).
        """
        from . import accelerate as fast_paths

        accelerated = torch.device(device).type == "cuda" if accelerate is None else accelerate
        chosen = resolve_mode(mode) if accelerated and not isinstance(mode, Mode) else mode
        if codec_dtype is None:
            codec_dtype = chosen.codec_dtype if isinstance(chosen, Mode) else torch.float32
        config = load_config(snapshot_dir)
        tensors = load_voice_design_tensors(snapshot_dir, config, dtype, device)
        decoder_tensors = load_speech_decoder_tensors(snapshot_dir, config, codec_dtype, device)
        engine = cls(
            config,
            Talker.from_tensors(config, tensors),
            CodePredictor.from_tensors(config, tensors),
            tokenizer=TextTokenizer.from_snapshot(snapshot_dir),
            decoder=SpeechDecoder.from_tensors(config.speech_decoder, decoder_tensors),
            max_sessions=max_sessions,
            max_context=max_context,
            scratch_slots=SCRATCH_SLOTS if accelerated else 0,
        )
        if accelerated:
            fast_paths.accelerate(engine, chosen)
        return engine

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def start_session(self, request: SynthesisRequest) -> Session:
        """Validate and tokenize a request and give it a cache slot; InvalidRequestError on bad input."""
        if self.tokenizer is None:
            raise EngineError("this engine has no text tokenizer; use open_session with a prompt plan")
        plan = build_prompt_plan(
            self.tokenizer,
            self.config,
            request.text,
            request.voice_description,
            request.language,
            request.text_mode,
        )
        return self.open_session(request, plan)

    @torch.no_grad()
    def open_session(self, request: SynthesisRequest, plan: PromptPlanLike) -> Session:
        """`start_session` for an already tokenized prompt (parity tests drive the engine with token ids)."""
        validate_request(request)
        prompt, trailing, tts_pad = self.talker.prompt_embeddings(plan)
        needed = prompt.shape[0] + request.max_frames - 1
        if needed > self.max_context:
            raise InvalidRequestError(
                f"a prompt of {prompt.shape[0]} tokens with max_frames={request.max_frames} needs {needed} "
                f"talker positions; this engine holds {self.max_context}"
            )
        if not self._free_slots:
            raise EngineError(f"all {self.max_sessions} session slots are in use")
        ts, ps = request.talker_sampling, request.predictor_sampling
        tc = self.config.talker
        # Everything that can fail is built before the slot is taken, so a failed open never loses a slot.
        # A top_k above the vocabulary keeps every token (HF clamps it too); clamping keeps it in int64.
        talker_sampling = SamplingRows.single(
            greedy=ts.greedy,
            temperature=ts.temperature,
            top_k=min(ts.top_k, tc.vocab_size),
            top_p=ts.top_p,
            repetition_penalty=ts.repetition_penalty,
            device=self.device,
        )
        predictor_sampling = SamplingRows.single(
            greedy=ps.greedy,
            temperature=ps.temperature,
            top_k=min(ps.top_k, tc.code_predictor.vocab_size),
            top_p=ps.top_p,
            device=self.device,
        )
        cb0_history = torch.zeros(tc.vocab_size, dtype=torch.bool, device=self.device)
        generator = torch.Generator().manual_seed(request.seed)
        codec_state: CodecStreamState | None = None
        if self.decoder is not None and self.codec_backend is None:
            codec_state = self.decoder.new_stream_state()
        slot = self._free_slots.pop(0)
        try:
            if self.codec_backend is not None:
                self.codec_backend.reset(slot)
        except BaseException:
            self._free_slots.insert(0, slot)
            raise
        return Session(
            request=request,
            plan=plan,
            slot=slot,
            prompt=prompt,
            prompt_length=prompt.shape[0],
            trailing_text=trailing,
            tts_pad=tts_pad,
            talker_sampling=talker_sampling,
            predictor_sampling=predictor_sampling,
            cb0_history=cb0_history,
            generator=generator,
            device=self.device,
            codec_state=codec_state,
        )

    @torch.no_grad()
    def prefill(self, session: Session) -> FrameResult:
        """Run the prompt, sample cb0 of frame 0 (EOS is banned there) and complete frame 0."""
        if session.released or session.prompt is None:
            raise EngineError("prefill needs a fresh session")
        slot = torch.tensor([session.slot], device=self.device)
        rows = self._rows([session], torch.zeros(1, dtype=torch.int64, device=self.device))
        codes = self.frame_backend.prefill_frame(
            self.talker, self.predictor, self.cache, session.prompt, slot, rows
        )
        session.position = session.prompt_length
        session.prompt = None
        return self._advance([session], codes)[0]

    @torch.no_grad()
    def step(self, sessions: list[Session]) -> list[FrameResult]:
        """ONE batched forward: a talker token + 15 predictor steps for every session; +1 frame each."""
        if not sessions:
            return []
        if len({id(s) for s in sessions}) != len(sessions):
            raise EngineError("a session appears twice in one step")
        previous = []
        for session in sessions:
            if session.released or session.finished or session.last_codes is None:
                raise EngineError("step needs prefilled, unfinished, unreleased sessions")
            previous.append(session.last_codes)
        text = torch.stack([s.text_element() for s in sessions])
        # One host-to-device copy for the per-row integers (position, slot, frames so far).
        meta = torch.tensor([[s.position, s.slot, s.frames_emitted] for s in sessions], dtype=torch.int64).to(
            self.device
        )
        positions, slots = meta[:, 0], meta[:, 1]
        rows = self._rows(sessions, meta[:, 2])
        codes = self.frame_backend.decode_frames(
            self.talker, self.predictor, self.cache, torch.stack(previous), text, positions, slots, rows
        )
        for session in sessions:
            session.position += 1
        return self._advance(sessions, codes)

    def decode_packet(self, session: Session, frames: Tensor) -> bytes:
        """Frames [n, 16] -> PCM16 LE, continuing the session's codec stream."""
        return self.decode_packets([session], [frames])[0]

    @torch.no_grad()
    def decode_packets(self, sessions: list[Session], frames: list[Tensor]) -> list[bytes]:
        """`decode_packet` for several sessions at once: frames[i] [n_i, 16] continues sessions[i]'s stream.

        On CUDA, sessions whose packets have the same frame count are decoded as one batch (one graph
        replay with a codec backend, one batched forward over `CodecStreamState.cat` without), and the
        waveforms come back to the host in one copy per batch; a session's samples may then differ from
        its solo decode at the float32 rounding level (codec_graphs.py), so a PCM16 sample can move by one
        step. On CPU each session is decoded alone, so the bytes equal `decode_packet`'s exactly: the CPU
        convolutions round differently with the batch size, and the server's byte-equality guarantees
        (streamed == offline, batched == solo) are defined and tested on CPU.
        """
        if self.decoder is None:
            raise EngineError("this engine has no speech decoder")
        if len(sessions) != len(frames) or len({id(s) for s in sessions}) != len(sessions):
            raise EngineError("decode_packets needs one packet per distinct session")
        for session in sessions:
            if session.released or (self.codec_backend is None and session.codec_state is None):
                raise EngineError("decode_packets needs live sessions")
        groups: dict[int, list[int]] = {}
        batched = self.device.type == "cuda"
        for index, packet in enumerate(frames):
            groups.setdefault(packet.shape[0] if batched else index, []).append(index)
        out: list[bytes] = [b""] * len(sessions)
        with fp32_codec() if self.device.type == "cuda" else nullcontext():
            for members in groups.values():
                codes = torch.stack([frames[i] for i in members]).to(self.device).transpose(1, 2)
                wave = self._decode_batch([sessions[i] for i in members], codes).cpu()
                for row, index in enumerate(members):
                    out[index] = float_to_pcm16(wave[row])
        return out

    def _decode_batch(self, sessions: list[Session], codes: Tensor) -> Tensor:
        """codes [B, 16, n] of B sessions -> waveform [B, n * hop] (float32 or wider)."""
        assert self.decoder is not None
        if self.codec_backend is not None:
            return self.codec_backend.decode([s.slot for s in sessions], codes)
        states = [s.codec_state for s in sessions if s.codec_state is not None]
        if len(sessions) == 1:
            return self.decoder.decode_stream(codes[0].T, states[0]).unsqueeze(0)
        batched = CodecStreamState.cat(states)
        wave = self.decoder(codes, batched)
        for index, session in enumerate(sessions):
            session.codec_state = batched.select(index)
        return wave

    def release(self, session: Session) -> None:
        """Free the session's cache slot (idempotent)."""
        if session.released:
            return
        session.released = True
        session.codec_state = None
        self._free_slots.append(session.slot)

    def synthesize(
        self, request: SynthesisRequest, first_packet_frames: int = 1, packet_frames: int = 4
    ) -> Iterator[AudioPacket]:
        """Solo loop: packets of `first_packet_frames`, then up to `packet_frames` frames.

        A full packet is held back until the next frame result says whether it is the last one, so every
        packet has at least one frame and exactly the last one has `is_final`. A packet that ends while the
        EOS ban still holds (fewer than 2 frames emitted) goes out at once: the next step cannot end the
        session without a frame, so it is not the last (time to first audio does not wait for frame 1).
        """
        session = self.start_session(request)
        try:
            sequence = first_frame = 0
            buffer: list[Tensor] = []
            held: tuple[int, int, bytes] | None = None  # (first_frame, frame_count, pcm) of a full packet
            result = self.prefill(session)
            while True:
                if result.codes is not None:
                    if held is not None:
                        yield AudioPacket(sequence, held[0], held[1], held[2], False, None)
                        sequence, held = sequence + 1, None
                    buffer.append(result.codes)
                if result.finish_reason is not None:
                    break
                if len(buffer) == (first_packet_frames if sequence == 0 else packet_frames):
                    pcm = self.decode_packet(session, torch.stack(buffer))
                    if session.frames_emitted < EOS_BAN_FRAMES:
                        yield AudioPacket(sequence, first_frame, len(buffer), pcm, False, None)
                        sequence += 1
                    else:
                        held = (first_frame, len(buffer), pcm)
                    first_frame, buffer = first_frame + len(buffer), []
                result = self.step([session])[0]
            if buffer:
                pcm = self.decode_packet(session, torch.stack(buffer))
                yield AudioPacket(sequence, first_frame, len(buffer), pcm, True, result.finish_reason)
            elif held is not None:
                yield AudioPacket(sequence, held[0], held[1], held[2], True, result.finish_reason)
        finally:
            self.release(session)

    def generate_codes(self, request: SynthesisRequest) -> Tensor:
        """All frames of one request, solo: LongTensor[T, 16] (EOS excluded)."""
        return self.run_to_end(self.start_session(request))

    def run_to_end(self, session: Session) -> Tensor:
        """Prefill and step one opened session alone until it ends, then release it: LongTensor[T, 16]."""
        try:
            frames: list[Tensor] = []
            result = self.prefill(session)
            while True:
                if result.codes is not None:
                    frames.append(result.codes)
                if result.finish_reason is not None:
                    break
                result = self.step([session])[0]
            return torch.stack(frames)
        finally:
            self.release(session)

    def _rows(self, sessions: list[Session], frames_generated: Tensor) -> FrameRows:
        return FrameRows(
            uniforms=torch.stack([s.draw_uniforms() for s in sessions]),
            cb0_history=torch.stack([s.cb0_history for s in sessions]),
            frames_generated=frames_generated,
            talker_sampling=SamplingRows.cat([s.talker_sampling for s in sessions]),
            predictor_sampling=SamplingRows.cat([s.predictor_sampling for s in sessions]),
        )

    def _advance(self, sessions: list[Session], codes: Tensor) -> list[FrameResult]:
        eos = self.config.talker.codec_eos_token_id
        results = []
        for session, frame, on_device in zip(sessions, codes.cpu(), codes, strict=True):
            cb0 = int(frame[0])
            if cb0 == eos:
                session.finish_reason = "stop"
                results.append(FrameResult(None, "stop"))
                continue
            session.frames_emitted += 1
            session.cb0_history[cb0] = True
            session.last_codes = on_device
            if session.frames_emitted >= session.request.max_frames:
                session.finish_reason = "length"
            results.append(FrameResult(frame, session.finish_reason))
        return results
