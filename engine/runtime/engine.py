"""VoiceDesignEngine: sessions in, frames and PCM packets out (docs/architecture.md, "the frame loop").

Frame accounting (model.md §2.6): `prefill_many` runs the prompts and produces frame 0 of each session;
each `step` feeds a session's previous frame (+ its text-stream element) to the talker, samples the next cb0
and, unless it is EOS, completes the frame with the predictor. EOS ends a session with "stop" and yields no
frame; the frame that brings a session to `max_frames` ends it with "length", so no talker step is wasted
after it.

One frame ahead (`launch_step` / `collect_step`): a step's host work (bookkeeping, the launch, building
results) is time the device idles if every step waits for its codes before the next is enqueued. Nothing a
frame's inputs need comes from the host: the last codes, the cb0 history and the uniforms are the per-slot
device buffers below, which the previous frame's enqueued ops update, and the positions and text elements
are known in advance. Only the decision to stop needs the codes, so the loops launch frame k+1 before they
collect frame k; `step` is the two back to back. A frame launched for a session whose previous frame turns
out to be EOS is computed and ignored (see `launch_step` for why its writes are harmless).

Host work per call: on CUDA it, not the device, is what a small batch waits for, so the per-row state
lives on the device in per-slot buffers that each call updates in place: the last frame's codes, the cb0
history and a block of uniforms. A call gathers its B rows with one index op per buffer instead of stacking
B tensors, and records its frames with one scatter per buffer instead of B writes; the per-row integers
go over in one copy, the codes come back in one, and the batch's concatenated sampling rows are reused
while its sessions stay the same.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..audio import pcm16_bytes, pcm16_samples
from ..config import SAMPLES_PER_FRAME, VoiceDesignConfig, load_config
from ..errors import EngineError, InvalidRequestError
from ..model.codec import CodecStreamState, SpeechDecoder
from ..model.predictor import CodePredictor
from ..model.talker import PromptPlanLike, Talker
from ..prompt import build_prompt_plan
from ..snapshot import load_speech_decoder_tensors, load_voice_design_tensors
from ..tokenizer import TextTokenizer
from ..transfer import upload
from .codec_graphs import CodecGraphs, fp32_codec
from .graphs import SCRATCH_SLOTS
from .modes import Mode, resolve_mode
from .request import AudioPacket, FrameResult, SynthesisRequest, validate_request
from .sampling import EOS_BAN_FRAMES, SamplingRows
from .session import UNIFORM_BLOCK_FRAMES, Session
from .step import EagerFrameBackend, FrameBackend, SlotState, StepIndex


@dataclass(frozen=True)
class PendingStep:
    """A launched batch: its sessions, the frame each was launched for, and the frames' codes [B, 16] on
    their way to the host (pinned memory on CUDA), there once `ready` (None on CPU) has completed.
    `device_codes`: the same codes where the frames ran, the backend's buffer: valid for work enqueued
    before the next launch."""

    sessions: tuple[Session, ...]
    frames: tuple[int, ...]
    codes: Tensor
    ready: torch.cuda.Event | None
    device_codes: Tensor


@dataclass(frozen=True)
class PendingDecode:
    """Enqueued packet decodes of `count` sessions: per batch, the sessions' indices and their PCM16 samples
    [B, samples] (int16) on their way to the host (pinned memory on CUDA), there once `ready` (None on CPU)
    has completed."""

    count: int
    batches: tuple[tuple[tuple[int, ...], Tensor], ...]
    ready: torch.cuda.Event | None

    def done(self) -> bool:
        """Whether `collect_decode` would return without waiting."""
        return self.ready is None or self.ready.query()


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
        fp8_cache: bool = False,
    ) -> None:
        self.config = config
        self.talker = talker
        self.predictor = predictor
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.max_sessions = max_sessions
        self.max_context = max_context
        self.device = talker.codec_embedding.device
        self.cache = talker.new_cache(max_sessions + scratch_slots, max_context, fp8=fp8_cache)
        """KV pool: slots 0..max_sessions-1 belong to sessions; `scratch_slots` more (the graphs' padding
        rows) are allocated up front when the engine will be accelerated, and the pool is e4m3 from the start
        (`fp8_cache`) when its mode keeps one (`Mode.kv_cache_fp8`), so installing the graphs reallocates
        nothing: no second pool beside the first while the graphs are installed."""
        self.slot_state = SlotState.zeros(
            max_sessions + scratch_slots,
            config.talker.num_code_groups,
            config.talker.vocab_size,
            max_sessions * UNIFORM_BLOCK_FRAMES,
            self.device,
        )
        """Per KV slot: its session's last frame and cb0 history (cleared when a session opens on the
        slot); per session slot, `UNIFORM_BLOCK_FRAMES` rows of uniforms for the frames of its current block
        (frame f at row slot * UNIFORM_BLOCK_FRAMES + f % UNIFORM_BLOCK_FRAMES), refilled when f reaches a
        new block."""
        self._sampling: tuple[tuple[Session, ...], SamplingRows, SamplingRows] | None = None
        """The last batch's sessions and their concatenated (talker, predictor) sampling rows."""
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

        on_cuda = torch.device(device).type == "cuda"
        accelerated = on_cuda if accelerate is None else accelerate
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
            fp8_cache=on_cuda and accelerated and isinstance(chosen, Mode) and chosen.kv_cache_fp8,
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
        generator = torch.Generator().manual_seed(request.seed)
        codec_state: CodecStreamState | None = None
        if self.decoder is not None and self.codec_backend is None:
            codec_state = self.decoder.new_stream_state()
        slot = self._free_slots.pop(0)
        try:
            self.slot_state.cb0_history[slot].zero_()
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
            generator=generator,
            device=self.device,
            codec_state=codec_state,
        )

    def prefill(self, session: Session) -> FrameResult:
        """Run the prompt, sample cb0 of frame 0 (EOS is banned there) and complete frame 0."""
        return self.prefill_many([session])[0]

    def prefill_many(self, sessions: list[Session]) -> list[FrameResult]:
        """`prefill` for B fresh sessions in one backend call: their prompts and their frame 0 together
        (on CUDA the prompt passes of `graphs.prompt_passes` and one frame-0 graph, instead of B of each)."""
        if not sessions:
            return []
        return self._all(self.collect_step(self.launch_prefill(sessions)))

    @torch.no_grad()
    def launch_prefill(self, sessions: list[Session]) -> PendingStep:
        """Enqueue `prefill_many`'s work without waiting for the device, as `launch_step` does for a frame;
        `collect_step` gives the frame 0 results."""
        self._check_distinct(sessions)
        for session in sessions:
            if session.released or session.prompt is None:
                raise EngineError("prefill needs fresh sessions")
        index = self._step_index(sessions, [0] * len(sessions))
        prompts = [s.prompt for s in sessions if s.prompt is not None]
        codes = self.frame_backend.prefill_frames(
            self.talker,
            self.predictor,
            self.cache,
            self.slot_state,
            index,
            prompts,
            self._batch_sampling(sessions),
        )
        for session in sessions:
            session.position = session.prompt_length
            session.prompt = None
        launched = self._launched(sessions, codes)
        if self.codec_backend is not None:
            # Here, not in open_session: the host resets the slots' codec streams while the GPU runs the
            # prompt pass, instead of before it can start (a solo request's start is host-bound), and still
            # ahead of any decode of these sessions on the codec stream.
            for session in sessions:
                self.codec_backend.reset(session.slot)
        return launched

    def step(self, sessions: list[Session]) -> list[FrameResult]:
        """ONE batched forward: a talker token + 15 predictor steps for every session; +1 frame each.

        `collect_step(launch_step(sessions))`: the sessions must have no frame in flight."""
        return self._all(self.collect_step(self.launch_step(sessions)))

    def can_launch(self, session: Session) -> bool:
        """Whether `launch_step` takes the session: prefilled, unreleased, not known to have ended, with
        fewer than `max_frames` frames launched. Its last launched frame may still turn out to be EOS."""
        return (
            session.prefilled
            and not session.released
            and not session.finished
            and session.frames_launched < session.request.max_frames
        )

    @torch.no_grad()
    def launch_step(self, sessions: list[Session]) -> PendingStep:
        """Enqueue one batched frame for every session, without waiting for the device: its inputs, the
        frame, the per-slot buffer updates and the copy of its codes to the host; `collect_step` waits.

        The sessions' launch counters advance as if the frame were not EOS. The codes are copied and the
        buffers updated before returning because a graph backend's next replay overwrites its output:
        later launches are ordered after these ops on the stream.

        A frame launched for a session whose previous frame turns out to be EOS (or that is released
        before the frame is collected) is computed and ignored: `collect_step` gives None for it. Its
        writes are harmless to the next session opened on the slot, whose setup is enqueued after it
        (the slot is freed only once the session has ended, after this launch): `open_session` clears
        the slot's cb0 history, `launch_prefill` resets its codec graph state (the frame never reaches a
        codec), the prefill overwrites the slot's last codes and draws frame 0's uniform block afresh, and the
        KV entry it wrote at position p is overwritten by the new session at p before anything reads it (a
        row attends to its keys 0..its own position only). It stays within the slot's context: a frame
        is launched only below `max_frames`, whose positions `open_session` checked.
        """
        if not sessions:
            empty = torch.empty(0, self.slot_state.last_codes.shape[1], dtype=torch.int64)
            return PendingStep((), (), empty, None, empty)
        self._check_distinct(sessions)
        for session in sessions:
            if not self.can_launch(session):
                raise EngineError(
                    "launch_step needs prefilled, unreleased sessions that have not ended and have frames "
                    "left to launch"
                )
        index = self._step_index(sessions, [s.position for s in sessions])
        codes = self.frame_backend.decode_frames(
            self.talker,
            self.predictor,
            self.cache,
            self.slot_state,
            index,
            [s.text_element() for s in sessions],
            self._batch_sampling(sessions),
        )
        for session in sessions:
            session.position += 1
        return self._launched(sessions, codes)

    def collect_step(self, pending: PendingStep) -> list[FrameResult | None]:
        """Wait for a launched batch's codes and build its results, in launch order per session.

        None for a session that ended at an earlier frame or was released since the launch: the frame
        was speculative, and no result follows a session's final one. Otherwise as the frame ends it:
        EOS gives (None, "stop"), the `max_frames`-th frame its codes and "length"."""
        if pending.ready is not None:
            pending.ready.synchronize()
        eos = self.config.talker.codec_eos_token_id
        results: list[FrameResult | None] = []
        host = pending.codes
        for session, frame, codes, cb0 in zip(
            pending.sessions, pending.frames, host.unbind(), host[:, 0].tolist(), strict=True
        ):
            ended = session.finished or session.released
            if not ended and frame != session.frames_emitted:
                raise EngineError("a session's steps must be collected once each, in launch order")
            session.frames_in_flight -= 1
            if ended:
                results.append(None)
            elif cb0 == eos:
                session.finish_reason = "stop"
                results.append(FrameResult(None, "stop"))
            else:
                session.frames_emitted += 1
                if session.frames_emitted >= session.request.max_frames:
                    session.finish_reason = "length"
                results.append(FrameResult(codes, session.finish_reason))
        return results

    def decode_packet(self, session: Session, frames: Tensor) -> bytes:
        """Frames [n, 16] -> PCM16 LE, continuing the session's codec stream."""
        return self.decode_packets([session], [frames])[0]

    def decode_packets(self, sessions: list[Session], frames: list[Tensor]) -> list[bytes]:
        """`decode_packet` for several sessions at once: frames[i] [n_i, 16] continues sessions[i]'s stream.

        `collect_decode(launch_decode(...))`: see there."""
        return self.collect_decode(self.launch_decode(sessions, frames))

    @torch.no_grad()
    def launch_decode(self, sessions: list[Session], frames: list[Tensor]) -> PendingDecode:
        """Enqueue the decode of one packet per session (frames[i] [n_i, 16] continues sessions[i]'s codec
        stream), its conversion to PCM16 (`pcm16_samples`: on CUDA, on the GPU for a whole batch) and the copy
        of the samples to the host, without waiting: on CUDA the codec runs on its own stream while the caller
        launches frames; `collect_decode` waits and returns the PCM. Packets of one session are decoded in
        launch order.

        On CUDA, sessions whose packets have the same frame count are decoded as one batch (one graph
        replay with a codec backend, one batched forward over `CodecStreamState.cat` without), and the
        samples come back to the host in one copy per batch; a session's samples may then differ from
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
        cuda = self.device.type == "cuda"
        for index, packet in enumerate(frames):
            groups.setdefault(packet.shape[0] if cuda else index, []).append(index)
        batches = []
        ready = None
        with fp32_codec() if cuda else nullcontext(), self._codec_stream(frames):
            for members in groups.values():
                stacked = torch.stack([frames[i] for i in members])
                codes = (stacked if stacked.is_cuda else upload(stacked, self.device)).transpose(1, 2)
                samples = pcm16_samples(self._decode_batch([sessions[i] for i in members], codes))
                host = torch.empty(samples.shape, dtype=samples.dtype, pin_memory=cuda)
                host.copy_(samples, non_blocking=cuda)
                batches.append((tuple(members), host))
            if cuda:
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(self.device))
        return PendingDecode(len(sessions), tuple(batches), ready)

    def collect_decode(self, pending: PendingDecode) -> list[bytes]:
        """Wait for a launched decode; the PCM16 LE packets in the order of its sessions."""
        if pending.ready is not None:
            pending.ready.synchronize()
        out: list[bytes] = [b""] * pending.count
        for members, samples in pending.batches:
            for row, index in enumerate(members):
                out[index] = pcm16_bytes(samples[row])
        return out

    def _codec_stream(self, frames: list[Tensor]) -> AbstractContextManager[object]:
        """The codec graphs' own stream (codec_graphs.py), where a packet's decode overlaps the frame launched
        ahead of it. Codes handed over on the GPU were made on the current stream, so the codec stream waits
        for the work enqueued there so far (not for what is launched after), and the codes' memory is kept
        from reuse until the codec stream has read them (`record_stream`)."""
        backend = self.codec_backend
        if backend is None:
            return nullcontext()
        on_device = [f for f in frames if f.is_cuda]
        if on_device:
            backend.stream.wait_stream(torch.cuda.current_stream())
            for tensor in on_device:
                tensor.record_stream(backend.stream)
        return torch.cuda.stream(backend.stream)

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
    ) -> Generator[AudioPacket, None, None]:
        """Solo loop: packets of `first_packet_frames`, then up to `packet_frames` frames.

        A full packet is held back until the next frame result says whether it is the last one, so every
        packet has at least one frame and exactly the last one has `is_final`. A held packet's decode is
        launched when the packet fills and collected when it goes out, so on CUDA the codec works beside the
        next frame instead of stopping the loop (as the server's scheduler does). A packet that ends while
        the EOS ban still holds (fewer than 2 frames emitted) goes out as soon as it is decoded: the next
        step cannot end the session without a frame, so it is not the last (time to first audio does not wait
        for frame 1). Frames are stepped one ahead (`_solo_next`).

        A one-frame first packet is decoded from frame 0's codes where they were made, launched with the
        prefill (frame 0 cannot be EOS: the ban), and frame 1 right after it, so the GPU runs prompt, frame 0,
        then packet 0 beside frame 1 without waiting for the host to collect frame 0 and send its codes back:
        a 64-frame fast request 0.96 ms shorter (155.56 -> 154.60 ms), first audio 0.29 ms later (6.98 ->
        7.26 ms; the packet now shares the GPU with frame 1 from its start), H200, medians of 6 alternating
        rounds in one process (benchmarks/results/2026-12-02-run89).

        The last packet is decoded the same way on CUDA: once the last frame `max_frames` allows is launched,
        the decode of the frames collected since the last packet plus that frame's device codes is launched
        behind it, so no host round trip follows the last frame: a 64-frame fast request 154.58 -> 154.01 ms,
        every round of 6 in one process (benchmarks/results/2026-12-02-run93).
        If that frame turns out to be EOS, the packet is the collected frames' samples of that decode (the
        decoder is strictly causal; they match a decode of those frames alone to the float rounding of the
        other packet size's graph, within one PCM16 step in the device test).
        """
        session = self.start_session(request)
        try:
            sequence = first_frame = 0
            buffer: list[Tensor] = []
            held: tuple[int, int, PendingDecode] | None = None  # (first frame, frames, decode), a full packet
            launched, pending = self.launch_prefill([session]), None
            early: PendingDecode | None = None  # packet 0's decode when it is frame 0 alone
            final: PendingDecode | None = None  # the last packet, launched before its last frame ends
            on_device = self.codec_backend is not None
            if first_packet_frames == 1:
                early = self.launch_decode([session], [launched.device_codes.clone()])
                if self.can_launch(session):
                    pending = self.launch_step([session])
            result = self._all(self.collect_step(launched))[0]
            while True:
                if result.codes is not None:
                    if held is not None:
                        pcm = self.collect_decode(held[2])[0]
                        yield AudioPacket(sequence, held[0], held[1], pcm, False, None)
                        sequence, held = sequence + 1, None
                    buffer.append(result.codes)
                if result.finish_reason is not None:
                    break
                if len(buffer) == (first_packet_frames if sequence == 0 else packet_frames):
                    if early is None:
                        early = self.launch_decode([session], [torch.stack(buffer)])
                    decode, early = early, None
                    if session.frames_emitted < EOS_BAN_FRAMES:
                        if pending is None and self.can_launch(session):
                            pending = self.launch_step([session])
                        pcm = self.collect_decode(decode)[0]
                        yield AudioPacket(sequence, first_frame, len(buffer), pcm, False, None)
                        sequence += 1
                    else:
                        held = (first_frame, len(buffer), decode)
                    first_frame, buffer = first_frame + len(buffer), []
                if final is None and pending is not None and not self.can_launch(session) and on_device:
                    final = self.launch_decode([session], [self._final_packet_codes(buffer, pending)])
                result, pending = self._solo_next(session, pending)
            if early is not None:  # frame 0 was the last frame
                pcm = self.collect_decode(early)[0]
                yield AudioPacket(sequence, first_frame, len(buffer), pcm, True, result.finish_reason)
            elif final is not None and buffer:
                # The decode of buffer + the last frame; when that frame was EOS, the buffer's own samples
                # (the decoder is strictly causal: its first frames do not depend on the next one).
                pcm = self.collect_decode(final)[0][: len(buffer) * SAMPLES_PER_FRAME * 2]
                yield AudioPacket(sequence, first_frame, len(buffer), pcm, True, result.finish_reason)
            elif buffer:
                pcm = self.decode_packet(session, torch.stack(buffer))
                yield AudioPacket(sequence, first_frame, len(buffer), pcm, True, result.finish_reason)
            elif held is not None:
                pcm = self.collect_decode(held[2])[0]
                yield AudioPacket(sequence, held[0], held[1], pcm, True, result.finish_reason)
        finally:
            self.release(session)

    def _final_packet_codes(self, buffer: list[Tensor], last: PendingStep) -> Tensor:
        """The codes [n + 1, 16] of the collected frames `buffer` and the frame in flight `last` (on the
        device, where it is being made), for a decode launched before `last` is collected. An EOS cb0 (not a
        codec code) is clamped into the codebook: the samples of that frame are then dropped unread."""
        tail = last.device_codes.clamp(max=self.config.speech_decoder.codebook_size - 1)
        if not buffer:
            return tail
        return torch.cat([upload(torch.stack(buffer), self.device), tail])

    def generate_codes(self, request: SynthesisRequest) -> Tensor:
        """All frames of one request, solo: LongTensor[T, 16] (EOS excluded)."""
        return self.run_to_end(self.start_session(request))

    def run_to_end(self, session: Session) -> Tensor:
        """Prefill and step one opened session alone until it ends, then release it: LongTensor[T, 16]."""
        try:
            frames: list[Tensor] = []
            result, pending = self.prefill(session), None
            while True:
                if result.codes is not None:
                    frames.append(result.codes)
                if result.finish_reason is not None:
                    break
                result, pending = self._solo_next(session, pending)
            return torch.stack(frames)
        finally:
            self.release(session)

    def _solo_next(
        self, session: Session, pending: PendingStep | None
    ) -> tuple[FrameResult, PendingStep | None]:
        """The next result of a session running alone, with the frame after it launched before it is
        collected (when `max_frames` allows one): the frame in flight to pass back in."""
        current = self.launch_step([session]) if pending is None else pending
        following = self.launch_step([session]) if self.can_launch(session) else None
        return self._all(self.collect_step(current))[0], following

    @staticmethod
    def _check_distinct(sessions: list[Session]) -> None:
        if len({id(s) for s in sessions}) != len(sessions):
            raise EngineError("a session appears twice in one batch")

    def _uniform_index(self, session: Session) -> int:
        """The row of `slot_state.uniforms` holding the uniforms of the session's next frame to launch (a
        new block is drawn from its generator first when that frame starts one, so blocks are drawn in
        launch order)."""
        block, frame = UNIFORM_BLOCK_FRAMES, session.frames_launched
        start = session.slot * block
        if frame % block == 0:
            uniforms = self.slot_state.uniforms[start : start + block]
            uniforms.copy_(upload(session.draw_uniform_block(), self.device))
        return start + frame % block

    def _step_index(self, sessions: list[Session], positions: list[int]) -> Tensor:
        """The batch's `StepIndex` table on the host."""
        return StepIndex.host_table(
            positions,
            [s.slot for s in sessions],
            [s.frames_launched for s in sessions],
            [self._uniform_index(s) for s in sessions],
        )

    def _batch_sampling(self, sessions: list[Session]) -> tuple[SamplingRows, SamplingRows]:
        """The batch's talker and predictor sampling rows, the same objects while the batch stays the same
        (a graph backend copies them only when they change)."""
        key = tuple(sessions)
        if self._sampling is None or self._sampling[0] != key:  # Session compares by identity
            self._sampling = (
                key,
                SamplingRows.cat([s.talker_sampling for s in sessions]),
                SamplingRows.cat([s.predictor_sampling for s in sessions]),
            )
        return self._sampling[1], self._sampling[2]

    def _launched(self, sessions: list[Session], codes: Tensor) -> PendingStep:
        """Start the copy of the batch's new frames codes [B, 16] (recorded in `slot_state` by the backend)
        to the host, enqueued; count the frames as launched."""
        cuda = self.device.type == "cuda"
        # A copy on CPU too: `codes` may be the backend's buffer, which its next call overwrites.
        host = torch.empty(codes.shape, dtype=codes.dtype, pin_memory=cuda)
        host.copy_(codes, non_blocking=cuda)
        ready = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        frames = tuple(s.frames_launched for s in sessions)
        for session in sessions:
            session.frames_in_flight += 1
        return PendingStep(tuple(sessions), frames, host, ready, codes)

    @staticmethod
    def _all(results: list[FrameResult | None]) -> list[FrameResult]:
        """The results of a batch collected right after its launch: none can be None."""
        complete = [r for r in results if r is not None]
        if len(complete) != len(results):
            raise EngineError("a session ended before the frame launched for it")
        return complete
