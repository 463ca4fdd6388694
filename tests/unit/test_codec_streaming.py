"""Streaming codec decode == one-shot decode, for any packet schedule, beyond 300 frames, batched.

Two pass structures (codec.py, Passes). The CPU default passes one frame at a time: every frame runs the
same products whatever the schedule, so streamed == one-shot bit for bit, in float32 too (the foundation
contract, <= 1e-6). A CUDA decoder passes whole packets; the `decoder*` fixtures here do the same on CPU
(`pass_frames = PASS_FRAMES`), so streamed packets and the one-shot decode compute the same function with
differently shaped kernels (a pass's GEMMs, convs and attention see N = B * n frames' columns). float64
proves that streaming logic exact: streamed == one-shot to 1e-12 (measured 1.6e-14 on 400 frames), where a
state mistake (a wrong history length, window, mask or position) would show as an O(0.01..1) difference.

float32 with packet passes is not exact: this CPU's kernels (MKL GEMMs, oneDNN convs) round a column
differently for a different N (MKL takes other code paths below N = 9), and the decoder amplifies those
ulps. Measured on 400 tiny frames: up to 9.3e-6 (packets of 2s; 7.6e-6 for 1 then 4s), the same size as
the float32 decode's own error against float64 (5.7e-6); the float32 checks use FP32_SCHEDULE, two thirds
of one PCM16 step. bfloat16 differs at its own rounding (3% relative L2, like bfloat16 against float32).

Batched calls round the same way: CPU GEMM and conv kernels round a row differently when the batch size
changes, so several streams decoded in one call match each decoded alone within rounding (float32:
FP32_BATCH).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import torch
from torch import Tensor

from qwen3_tts_native.engine.config import SpeechDecoderConfig, VoiceDesignConfig, parse_speech_decoder_config
from qwen3_tts_native.engine.kernels import ops, reference
from qwen3_tts_native.engine.model.codec import (
    PASS_FRAMES,
    CodecStreamState,
    DecoderBlock,
    SnakeBeta,
    SpeechDecoder,
)
from qwen3_tts_native.engine.runtime.codec_graphs import _gather
from qwen3_tts_native.engine.snapshot import expected_speech_decoder_tensors

DATA = Path(__file__).resolve().parents[1] / "data"
FRAMES = 400
EXACT = 1e-12  # float64: streamed vs one-shot, batched vs alone
CONTRACT = 1e-6  # the foundation issue's float32 streamed vs one-shot bound (one frame per pass)
FP32_SCHEDULE = 2e-5  # float32 streamed vs one-shot, two thirds of one PCM16 step
FP32_BATCH = 2e-5  # float32 batched vs alone
BF16_RELATIVE = 0.06  # bfloat16 streamed vs one-shot, relative L2 (measured 0.03)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny shapes gain nothing from threads, and on a shared CPU the thread pools mostly contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_tensors(config: SpeechDecoderConfig, seed: int) -> dict[str, Tensor]:
    """Seeded `decoder.*` weights that keep every stage O(1) (see tests/parity/official_codec.py for why)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (shape, _dtype) in expected_speech_decoder_tensors(config).items():
        values = torch.randn(shape, generator=generator)
        if name.endswith("cluster_usage"):
            values = torch.rand(shape, generator=generator) + 0.5
        elif name.endswith("norm.weight"):
            values = 1.0 + 0.1 * values
        elif name.endswith((".alpha", ".beta")):
            values = 0.3 * values
        elif name.endswith(("layer_scale.scale", ".gamma")):
            values = 0.3 + 0.1 * values
        elif name.endswith("embedding_sum"):
            values = 0.25 * values
        elif len(shape) == 1:
            values = 0.02 * values
        elif ".block.1.conv." in name:  # waveform ConvTranspose1d [in, out, 2 * stride]: fan-in 2 * in
            values = 0.5 * values / (2 * shape[0]) ** 0.5
        elif ".upsample." in name and name.endswith(".0.conv.weight"):  # kernel = stride: fan-in = in
            values = values / shape[0] ** 0.5
        else:
            fan_in = shape[1] * (shape[2] if len(shape) == 3 else 1)
            values = values * (0.3 if name.endswith("conv2.conv.weight") else 1.0) / fan_in**0.5
        tensors[name] = values
    return tensors


def packet_passes(decoder: SpeechDecoder) -> SpeechDecoder:
    """The decoder with CUDA's pass structure: a whole packet (up to PASS_FRAMES frames) per pass."""
    decoder.pass_frames = PASS_FRAMES
    return decoder


@pytest.fixture(scope="module")
def frame_passes32(tiny_voice_design_config: VoiceDesignConfig) -> SpeechDecoder:
    """float32 with the CPU default: one frame per pass."""
    config = tiny_voice_design_config.speech_decoder
    return SpeechDecoder.from_tensors(config, random_tensors(config, seed=3))


@pytest.fixture(scope="module")
def decoder32(tiny_voice_design_config: VoiceDesignConfig) -> SpeechDecoder:
    config = tiny_voice_design_config.speech_decoder
    return packet_passes(SpeechDecoder.from_tensors(config, random_tensors(config, seed=3)))


@pytest.fixture(scope="module")
def decoder64(tiny_voice_design_config: VoiceDesignConfig) -> SpeechDecoder:
    config = tiny_voice_design_config.speech_decoder
    tensors = {name: t.double() for name, t in random_tensors(config, seed=3).items()}
    return packet_passes(SpeechDecoder.from_tensors(config, tensors))


@pytest.fixture(scope="module")
def decoder16(tiny_voice_design_config: VoiceDesignConfig) -> SpeechDecoder:
    config = tiny_voice_design_config.speech_decoder
    tensors = {name: t.bfloat16() for name, t in random_tensors(config, seed=3).items()}
    return packet_passes(SpeechDecoder.from_tensors(config, tensors))


@pytest.fixture(scope="module")
def codes() -> Tensor:
    return torch.randint(0, 2048, (1, 16, FRAMES), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def one_shot64(decoder64: SpeechDecoder, codes: Tensor) -> Tensor:
    return decoder64.decode(codes, clamp=False)[0]


@pytest.fixture(scope="module")
def one_shot32(decoder32: SpeechDecoder, codes: Tensor) -> Tensor:
    return decoder32.decode(codes, clamp=False)[0]


@pytest.fixture(scope="module")
def one_shot16(decoder16: SpeechDecoder, codes: Tensor) -> Tensor:
    return decoder16.decode(codes, clamp=False)[0]


SCHEDULES = {
    "1-then-4s": lambda: itertools.chain([1], itertools.repeat(4)),
    "mixed": lambda: itertools.cycle([1, 4, 2, 3, 4, 1, 3, 2]),
    "all-1s": lambda: itertools.repeat(1),
    "one-packet": lambda: iter([FRAMES]),
}


def stream(
    decoder: SpeechDecoder, codes: Tensor, sizes: Iterator[int], state: CodecStreamState | None = None
) -> Tensor:
    """Decode codes [B, 16, T] packet by packet (the last packet is cut to fit) and concatenate; [B, T * hop].

    Without `state`, B fresh streams."""
    state = decoder.new_stream_state(codes.shape[0]) if state is None else state
    packets, start = [], 0
    for size in sizes:
        if start >= codes.shape[-1]:
            break
        packets.append(decoder(codes[..., start : start + size], state, clamp=False))
        start += size
    return torch.cat(packets, dim=1)


def max_abs(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_streaming_equals_one_shot_float64(
    decoder64: SpeechDecoder, codes: Tensor, one_shot64: Tensor, schedule: str
) -> None:
    """The streaming logic is exact: any schedule computes what the one-shot decode computes."""
    streamed = stream(decoder64, codes, SCHEDULES[schedule]())[0]
    assert one_shot64.dtype == torch.float64 and one_shot64.shape == (FRAMES * 1920,)
    assert max_abs(streamed, one_shot64) <= EXACT


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_streaming_equals_one_shot_float32(
    decoder32: SpeechDecoder, codes: Tensor, one_shot32: Tensor, schedule: str
) -> None:
    streamed = stream(decoder32, codes, SCHEDULES[schedule]())[0]
    assert one_shot32.dtype == torch.float32 and one_shot32.abs().max() > 0.5
    assert max_abs(streamed, one_shot32) <= FP32_SCHEDULE


@pytest.mark.parametrize("schedule", ["1-then-4s", "mixed"])
def test_one_frame_passes_meet_the_foundation_contract(
    frame_passes32: SpeechDecoder, codes: Tensor, schedule: str
) -> None:
    """The CPU default: streamed == one-shot in float32, bit for bit (so within the contract's 1e-6)."""
    one_shot = frame_passes32.decode(codes[..., :200], clamp=False)[0]
    streamed = stream(frame_passes32, codes[..., :200], SCHEDULES[schedule]())[0]
    assert max_abs(streamed, one_shot) <= CONTRACT
    assert torch.equal(streamed, one_shot)


def test_a_single_pass_schedule_is_the_one_shot_decode(
    decoder32: SpeechDecoder, codes: Tensor, one_shot32: Tensor
) -> None:
    """Where the passes are the same (one packet of all frames is cut into PASS_FRAMES passes, as `decode`
    cuts it), so are the bits."""
    assert torch.equal(stream(decoder32, codes, SCHEDULES["one-packet"]())[0], one_shot32)
    assert torch.equal(stream(decoder32, codes, itertools.repeat(PASS_FRAMES))[0], one_shot32)


@pytest.mark.parametrize("schedule", ["1-then-4s", "mixed"])
def test_streaming_equals_one_shot_bfloat16(
    decoder16: SpeechDecoder, codes: Tensor, one_shot16: Tensor, schedule: str
) -> None:
    streamed = stream(decoder16, codes, SCHEDULES[schedule]())[0]
    assert one_shot16.dtype == torch.float32 and one_shot16.abs().max() > 0.5  # computed in bf16
    assert ((streamed - one_shot16).norm() / one_shot16.norm()).item() <= BF16_RELATIVE


def test_decode_stream_is_forward_on_one_stream(
    decoder64: SpeechDecoder, codes: Tensor, one_shot64: Tensor
) -> None:
    """The engine's `decode_stream` ([n, 16] packets of one stream) is the same computation."""
    state, start, packets = decoder64.new_stream_state(), 0, []
    for size in itertools.chain([1], itertools.repeat(4, 40)):
        packets.append(decoder64.decode_stream(codes[0, :, start : start + size].T, state, clamp=False))
        start += size
    assert max_abs(torch.cat(packets), one_shot64[: start * 1920]) <= EXACT


@pytest.mark.parametrize("frames", [1, 2, 33, 71, 72, 73, 145, 301])
def test_every_length_around_the_window(
    decoder64: SpeechDecoder,
    decoder32: SpeechDecoder,
    codes: Tensor,
    one_shot64: Tensor,
    one_shot32: Tensor,
    frames: int,
) -> None:
    """A prefix decodes to the prefix of the whole decode (causality) at the window edges (71/72/73 frames;
    145 = two layers of 72 after the k=3 pre-conv), past a pass (33) and past 300."""
    for decoder, whole, tolerance in ((decoder64, one_shot64, EXACT), (decoder32, one_shot32, FP32_SCHEDULE)):
        prefix = decoder.decode(codes[..., :frames], clamp=False)[0]
        assert prefix.shape == (frames * 1920,)
        assert max_abs(prefix, whole[: frames * 1920]) <= tolerance


@pytest.mark.parametrize("pass_frames", [1, 7, PASS_FRAMES])
def test_attention_window_is_72_frames_including_the_current_one(
    decoder64: SpeechDecoder, codes: Tensor, pass_frames: int
) -> None:
    """Two layers of 72-frame windows after the k=3 pre-conv: transformer output t depends on codes
    t - 144 .. t. Changing frame 0 must move output 144 and leave 145.. bit-identical (a window of 71
    would leave 144 unmoved, one of 73 would move 145 and 146), also where 144 and 145 share a pass
    (7, 32) and the mask, not the cache, hides frame 0's row from 145."""
    base = codes[..., :150].clone()
    changed = base.clone()
    changed[:, :, 0] = (changed[:, :, 0] + 1) % 2048
    latents = []
    for c in (base, changed):
        state, passes = decoder64.new_stream_state(), []
        with torch.no_grad():
            for start in range(0, c.shape[-1], pass_frames):  # the first half of `SpeechDecoder.packet`
                piece = c[..., start : start + pass_frames]
                x = decoder64.pre_conv(decoder64.embed_codes(piece), state)
                passes.append(decoder64.pre_transformer(x.transpose(1, 2), state)[0])
                state.position += piece.shape[-1]
        latents.append(torch.cat(passes))
    moved = (latents[0] - latents[1]).abs().amax(dim=1)
    assert moved[144] > 1e-9
    assert moved[145:].max().item() == 0.0


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("frames", [1, 4, PASS_FRAMES])
@pytest.mark.parametrize("position", [0, 3, 70, 71, 72, 300])
def test_pass_mask_is_each_querys_window(
    tiny_voice_design_config: VoiceDesignConfig, group: int, frames: int, position: int
) -> None:
    """A pass of `frames` frames from `position`: query frame p sees the key at absolute position k iff
    max(0, p - 71) <= k <= p, where the keys are the 71 cached frames (positions position - 71 ..
    position - 1) and then the pass's own; each frame's `group` query rows see the same keys."""
    window = tiny_voice_design_config.speech_decoder.sliding_window
    positions = torch.tensor([position, position + 1])
    mask = reference.codec_window_mask(positions, frames, group, window, torch.float32)
    assert mask.shape == (2, 1, frames * group, window - 1 + frames)
    for row, start in enumerate((position, position + 1)):
        keys = torch.arange(start - (window - 1), start + frames)
        queries = (start + torch.arange(frames)).repeat_interleave(group)
        visible = (keys >= 0) & (keys <= queries[:, None]) & (keys >= queries[:, None] - (window - 1))
        assert torch.equal(mask[row, 0] == 0, visible)
        assert torch.equal(mask[row, 0] == float("-inf"), ~visible)


def test_grouped_kv_heads_eight_layers_stream_exactly(
    deep_grouped_kv_decoder_config: SpeechDecoderConfig,
) -> None:
    """Grouped KV heads (two query heads a KV head, so a pass has `2 n` query rows) and the full depth's
    8 x 71-frame attention field, 400 frames: streamed in the engine's packets == one-shot (float64)."""
    config = deep_grouped_kv_decoder_config
    decoder = SpeechDecoder.from_tensors(
        config, {n: t.double() for n, t in random_tensors(config, 11).items()}
    )
    codes = torch.randint(0, 2048, (1, 16, FRAMES), generator=torch.Generator().manual_seed(5))
    one_shot = decoder.decode(codes, clamp=False)
    assert max_abs(stream(decoder, codes, SCHEDULES["1-then-4s"]()), one_shot) <= EXACT


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_streams_at_different_positions(
    decoder64: SpeechDecoder, decoder32: SpeechDecoder, codes: Tensor, dtype: torch.dtype
) -> None:
    """Two sessions at different frame positions decoded in one call == each decoded alone, within the
    rounding of a different batch size (module docstring)."""
    decoder, tolerance = (decoder64, EXACT) if dtype == torch.float64 else (decoder32, FP32_BATCH)
    first, second = decoder.new_stream_state(), decoder.new_stream_state()
    decoder.decode_stream(codes[0, :, :75].T, first)
    decoder.decode_stream(codes[0, :, 200:203].T, second)
    batch = CodecStreamState.cat([first.select(0), second.select(0)])

    packet = torch.stack([codes[0, :, 75:79], codes[0, :, 203:207]])
    together = decoder(packet, batch, clamp=False)
    alone = [
        decoder.decode_stream(codes[0, :, 75:79].T, first, clamp=False),
        decoder.decode_stream(codes[0, :, 203:207].T, second, clamp=False),
    ]
    assert batch.position.tolist() == [79, 7]
    for row in range(2):
        assert max_abs(together[row], alone[row]) <= tolerance


def test_a_batch_of_streams_is_schedule_independent(decoder64: SpeechDecoder, codes: Tensor) -> None:
    """Two streams at different positions, decoded together as one 60-frame input or in mixed packets,
    give the same waveforms and the same states (float64)."""
    first = decoder64.new_stream_state()
    decoder64.decode_stream(codes[0, :, :75].T, first)
    whole_state, mixed_state = (CodecStreamState.cat([first, decoder64.new_stream_state()]) for _ in range(2))
    pair = torch.stack([codes[0, :, 75:135], codes[0, :, 200:260]])

    whole = decoder64(pair, whole_state, clamp=False)
    mixed = stream(decoder64, pair, SCHEDULES["mixed"](), mixed_state)
    assert max_abs(whole, mixed) <= EXACT
    assert whole_state.position.tolist() == mixed_state.position.tolist() == [135, 60]
    pairs = zip(
        whole_state.kv + list(whole_state.history.values()),
        mixed_state.kv + list(mixed_state.history.values()),
        strict=True,
    )
    assert all(max_abs(a, b) <= EXACT for a, b in pairs)


def test_one_shot_batch_rows_are_independent(decoder64: SpeechDecoder, codes: Tensor) -> None:
    pair = torch.cat([codes[..., :30], codes[..., 100:130]])
    together = decoder64.decode(pair, clamp=False)
    for row in range(2):
        alone = decoder64.decode(pair[row : row + 1], clamp=False)[0]
        assert (together[row] - alone).abs().max().item() <= EXACT


def test_clamp_and_empty_packet(decoder32: SpeechDecoder, codes: Tensor) -> None:
    raw = decoder32.decode(codes[..., :20], clamp=False)
    assert raw.abs().max() > 1.0  # the random waveform clips somewhere, so the clamp is exercised
    assert torch.equal(decoder32.decode(codes[..., :20]), raw.clamp(-1.0, 1.0))

    state = decoder32.new_stream_state()
    empty = decoder32.decode_stream(codes[0, :, :0].T, state)
    assert empty.shape == (0,) and state.position.tolist() == [0]


def test_bfloat16_follows_the_parameters(decoder32: SpeechDecoder, codes: Tensor) -> None:
    bf16 = SpeechDecoder.from_tensors(
        decoder32.config,
        {name: t.bfloat16() for name, t in random_tensors(decoder32.config, seed=3).items()},
    )
    assert bf16.first_codebook.dtype == torch.bfloat16
    reference = decoder32.decode(codes[..., :40], clamp=False)
    one_shot = bf16.decode(codes[..., :40], clamp=False)
    assert one_shot.dtype == torch.float32  # the waveform is returned in at least float32
    relative = (one_shot - reference).norm() / reference.norm()
    assert relative.item() < 0.1


def test_state_owns_its_storage_between_packets(decoder32: SpeechDecoder, codes: Tensor) -> None:
    """Within a packet the state holds views into the frame's activations; `forward` compacts it at the
    end, so a session kept between packets holds only its own state, not the activations around it."""
    state = decoder32.new_stream_state()
    decoder32.decode_stream(codes[0, :, :5].T, state)
    for tensor in state.kv + list(state.history.values()):
        assert tensor.is_contiguous()
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    # Compacting again copies nothing: every entry already owns its storage.
    before = [t.data_ptr() for t in state.kv + list(state.history.values())]
    state.compact()
    assert [t.data_ptr() for t in state.kv + list(state.history.values())] == before


def test_derived_tensors_follow_load_and_conversion(decoder32: SpeechDecoder, codes: Tensor) -> None:
    """What is computed from the weights once (SnakeBeta's e^alpha and 1 / (e^beta + 1e-9), the RoPE
    frequencies, the mask values) is remade by `.to()` from the converted weights, exactly as a load of
    those weights makes it: a converted decoder decodes bit for bit like one loaded from its state dict."""
    converted = copy.deepcopy(decoder32).to(torch.bfloat16)
    snake = cast(SnakeBeta, cast(DecoderBlock, converted.decoder[1]).block[0])
    assert snake.frequency.dtype == torch.bfloat16
    assert torch.equal(snake.frequency, snake.alpha.exp())
    assert torch.equal(snake.inverse_beta, 1.0 / (snake.beta.exp() + 1e-9))
    assert converted.pre_transformer.inv_freq.dtype == torch.float32  # RoPE tables stay >= float32
    with torch.device("meta"):
        loaded = SpeechDecoder(decoder32.config)
    loaded.load_state_dict(converted.state_dict(), assign=True)
    loaded.pass_frames = converted.pass_frames  # a setting, not a weight
    assert torch.equal(converted.decode(codes[..., :6]), loaded.decode(codes[..., :6]))


def test_consumes_exactly_the_real_checkpoint_tensors() -> None:
    """The full config's 271 `decoder.*` tensors, as listed in the real checkpoint's inventory (meta)."""
    config_json = json.loads((DATA / "reference_model" / "speech_tokenizer" / "config.json").read_text())
    config = parse_speech_decoder_config(config_json, "speech_tokenizer/config.json")
    inventory = json.loads((DATA / "speech-tokenizer-model-inventory.json").read_text())
    entries = [t for t in inventory["tensors"] if t["name"].startswith("decoder.")]
    tensors = {t["name"]: torch.empty(t["shape"], device="meta") for t in entries}
    assert len(tensors) == 271

    decoder = SpeechDecoder.from_tensors(config, tensors)
    unused = sum(
        t["parameters"]
        for t in entries
        if t["name"].startswith("decoder.quantizer.")
        and t["name"].endswith(("input_proj.weight", "cluster_usage"))
    )
    used = sum(t.numel() for t in decoder.state_dict().values())
    assert used == sum(t["parameters"] for t in entries) - unused


def test_codec_state_layouts_the_row_copy_kernel_takes(decoder32: SpeechDecoder, codes: Tensor) -> None:
    """After a pass of a whole 4-frame packet (a CUDA decoder's passes) every state tensor has a layout the
    codec graphs' row-copy kernel takes (`ops.row_copy_suits`), except the pre_conv's context: a view of
    the time-major codebook embeddings, its last dim strided, which the scatter leaves to torch (run 57's
    profile). The device test `test_codec_state_tensors_but_one_suit_the_row_copy_kernel` checks the same
    on CUDA's own layouts."""
    state = _gather(decoder32.new_stream_state(2), torch.tensor([1]))
    with torch.no_grad():
        decoder32(codes[..., :4], state, compact=False)
    unsuited = [name for name, t in state.history.items() if not ops.row_copy_suits(t)]
    assert unsuited == ["pre_conv"]
    assert all(ops.row_copy_suits(t) for t in [state.position, *state.kv])
