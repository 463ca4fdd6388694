"""The sampling rules (model.md §4) and the inverse-CDF draw that the CUDA sampler must reproduce."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from qwen3_tts_native.engine.runtime.sampling import (
    SamplingRows,
    apply_repetition_penalty,
    filter_scores,
    pick_with_uniform,
    sample_with_uniform,
    talker_banned_tokens,
    top_k_filter,
    top_p_filter,
)

EOS = 2150
VOCAB = 3072
INF = float("inf")


def rows(
    greedy: list[bool],
    temperature: list[float],
    top_k: list[int],
    top_p: list[float],
    penalty: list[float] | None = None,
) -> SamplingRows:
    return SamplingRows(
        greedy=torch.tensor(greedy),
        temperature=torch.tensor(temperature, dtype=torch.float32),
        top_k=torch.tensor(top_k, dtype=torch.int64),
        top_p=torch.tensor(top_p, dtype=torch.float64),
        repetition_penalty=torch.tensor(penalty or [1.0] * len(greedy), dtype=torch.float32),
    )


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    scores = torch.tensor([[2.0, -2.0, 3.0, 0.0]])
    penalized = torch.tensor([[True, True, False, True]])
    out = apply_repetition_penalty(scores, penalized, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 3.0, 0.0]]


def test_suppression_and_eos_ban() -> None:
    banned = talker_banned_tokens(torch.tensor([0, 1, 2, 50]), VOCAB, EOS)
    assert not banned[:, :2048].any(), "codes 0..2047 are never banned"
    control = torch.ones(VOCAB - 2048, dtype=torch.bool)
    control[EOS - 2048] = False
    assert torch.equal(
        banned[:, 2048:] & ~control, torch.tensor([[True], [True], [False], [False]]) & ~control
    )
    assert banned[:, 2048:][:, control].all(), "1023 control ids are suppressed on every frame"
    assert banned[:, EOS].tolist() == [True, True, False, False]


def test_eos_cannot_win_before_frame_two() -> None:
    logits = torch.randn(3, VOCAB)
    logits[:, EOS] = 100.0
    frames = torch.tensor([0, 1, 2])
    banned = talker_banned_tokens(frames, VOCAB, EOS)
    for greedy in (True, False):
        params = rows([greedy] * 3, [0.9] * 3, [50] * 3, [1.0] * 3)
        for u in (0.0, 0.5, 0.999):
            tokens = sample_with_uniform(
                logits, torch.full((3,), u, dtype=torch.float64), params, None, banned
            )
            assert tokens[0] != EOS and tokens[1] != EOS and tokens[2] == EOS
            assert (tokens[:2] < 2048).all()


def test_greedy_takes_the_lowest_index_of_a_tie() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, -1.0]])
    params = rows([True], [0.0], [0], [1.0])
    assert sample_with_uniform(logits, torch.tensor([0.9], dtype=torch.float64), params).item() == 1


def test_top_k_keeps_ties_and_zero_is_off() -> None:
    scores = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0], [5.0, 3.0, 3.0, 3.0, 1.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    out = top_k_filter(scores, torch.tensor([2, 0, 9]))
    assert out[0].tolist() == [5.0, 3.0, 3.0, 3.0, -INF]
    assert torch.equal(out[1], scores[1])
    assert torch.equal(out[2], scores[2]), "k above the vocabulary keeps everything"


def test_top_p_edges() -> None:
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]] * 4)
    scores = probs.log()
    out = top_p_filter(scores, torch.tensor([1.0, 1e-9, 0.75, 0.65], dtype=torch.float64))
    assert torch.equal(out[0], scores[0]), "top_p = 1.0 is off"
    assert out[1].isinf().tolist() == [True, True, True, False], "a tiny top_p keeps the largest token"
    assert out[2].isinf().tolist() == [True, False, False, False], "tokens with cumulative mass <= 1 - p go"
    assert out[3].isinf().tolist() == [True, True, False, False]


def test_top_p_stable_ties_drop_the_lower_index_first() -> None:
    scores = torch.zeros(1, 4)  # four equal tokens: 0.25 each; with p = 0.5 two of them go
    out = top_p_filter(scores, torch.tensor([0.5], dtype=torch.float64))
    assert out[0].isinf().tolist() == [True, True, False, False]


def test_inverse_cdf_in_index_order() -> None:
    scores = torch.tensor([0.25, 0.25, 0.5]).log().expand(6, 3)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.5, 0.75, 1 - 2**-53], dtype=torch.float64)
    assert pick_with_uniform(scores, u).tolist() == [0, 0, 1, 2, 2, 2]


def test_inverse_cdf_never_picks_a_filtered_token() -> None:
    scores = torch.tensor([[-INF, 1.0, -INF, 2.0, -INF]]).expand(5, 5)
    u = torch.tensor([0.0, 0.3, 0.6, 0.999, 1 - 2**-53], dtype=torch.float64)
    assert set(pick_with_uniform(scores, u).tolist()) <= {1, 3}
    assert pick_with_uniform(scores, u)[0].item() == 1 and pick_with_uniform(scores, u)[-1].item() == 3


def test_draw_frequencies_follow_the_filtered_distribution() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, -1.0]])
    params = rows([False], [0.5], [3], [1.0])
    _, warped = filter_scores(logits, params)
    expected = torch.softmax(warped, dim=-1)[0]
    grid = (torch.arange(10_000, dtype=torch.float64) + 0.5) / 10_000
    tokens = pick_with_uniform(warped.expand(grid.shape[0], -1), grid)
    counts = torch.bincount(tokens, minlength=5).float() / grid.shape[0]
    assert counts[0] == 0 and counts[4] == 0, "top-3 keeps tokens 1, 2 and 3 only"
    assert torch.allclose(counts, expected, atol=2e-4)


def test_rows_are_independent_and_keep_their_own_parameters() -> None:
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 2048, generator=generator) * 3
    u = torch.rand(4, generator=generator, dtype=torch.float64)
    params = rows([True, False, False, False], [1.0, 0.9, 0.5, 1.3], [50, 50, 0, 5], [1.0, 1.0, 0.8, 0.95])
    batched = sample_with_uniform(logits, u, params)
    for index in range(4):
        single = SamplingRows(*(getattr(params, f)[index : index + 1] for f in params.__dataclass_fields__))
        alone = sample_with_uniform(logits[index : index + 1], u[index : index + 1], single)
        assert alone.item() == batched[index].item()
    assert batched[0].item() == logits[0].argmax().item()


def test_same_uniforms_same_tokens_different_uniforms_differ() -> None:
    logits = torch.randn(1, 2048, generator=torch.Generator().manual_seed(3)).expand(64, -1)
    params = SamplingRows.cat([SamplingRows.single(greedy=False, temperature=1.0, top_k=0, top_p=1.0)] * 64)

    def draw(seed: int) -> Tensor:
        u = torch.rand(64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return sample_with_uniform(logits, u, params)

    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))


@pytest.mark.parity
def test_filtering_equals_transformers_processors() -> None:
    """Our processed/warped scores equal transformers 4.57.3's processor chain for the talker, bit for bit."""
    logits_process = pytest.importorskip("transformers.generation.logits_process")
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(4, VOCAB, generator=generator) * 3
    histories = [[], [5, 5, 9], [1, 2, 3, 2047, 5], list(range(0, 2048, 7))]
    settings = [(0.9, 50, 1.0, 1.05), (0.7, 0, 0.8, 1.3), (1.3, 5, 0.95, 1.0), (1.0, 2048, 0.5, 1.05)]
    params = rows(
        [False] * 4,
        [s[0] for s in settings],
        [int(s[1]) for s in settings],
        [s[2] for s in settings],
        [s[3] for s in settings],
    )
    penalized = torch.zeros(4, VOCAB, dtype=torch.bool)
    for index, history in enumerate(histories):
        penalized[index, history] = True
    frames = torch.tensor([len(h) for h in histories])
    _, warped = filter_scores(logits, params, penalized, talker_banned_tokens(frames, VOCAB, EOS))
    suppress = [i for i in range(VOCAB - 1024, VOCAB) if i != EOS]
    for index, (temperature, top_k, top_p, penalty) in enumerate(settings):
        chain = [
            logits_process.RepetitionPenaltyLogitsProcessor(penalty),
            logits_process.MinNewTokensLengthLogitsProcessor(0, 2, EOS),
            logits_process.SuppressTokensLogitsProcessor(suppress),
            logits_process.TemperatureLogitsWarper(temperature),
        ]
        if top_k:
            chain.append(logits_process.TopKLogitsWarper(top_k))
        if top_p < 1.0:
            chain.append(logits_process.TopPLogitsWarper(top_p))
        input_ids = torch.tensor([histories[index]], dtype=torch.long)
        expected = logits[index : index + 1].clone()
        for processor in chain:
            expected = processor(input_ids, expected)
        assert torch.equal(warped[index : index + 1], expected), f"row {index}"


@pytest.mark.parametrize(
    ("greedy", "temperature", "top_k", "top_p", "penalty"),
    [(False, 0.7, 50, 0.95, 1.05), (True, 1e300, 3072, 1.0, 1.0), (False, 1e-3, 0, 0.1 + 0.2, 2.0 / 3.0)],
)
def test_a_packed_single_row_equals_five_separate_tensors(
    greedy: bool, temperature: float, top_k: int, top_p: float, penalty: float
) -> None:
    """`SamplingRows.single` uploads one packed buffer and views its fields: each field has the dtype, shape
    and value (each float rounded to float32 as `torch.tensor` rounds it) of the tensor made on its own."""
    single = SamplingRows.single(
        greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=penalty
    )
    expected = rows([greedy], [temperature], [top_k], [top_p], [penalty])
    for name in ("greedy", "temperature", "top_k", "top_p", "repetition_penalty"):
        got, want = getattr(single, name), getattr(expected, name)
        assert got.dtype == want.dtype and got.shape == want.shape == (1,), name
        assert torch.equal(got, want), name
    batch = SamplingRows.cat([single, expected])
    assert batch.top_p.tolist() == [top_p, top_p] and batch.greedy.tolist() == [greedy, greedy]
