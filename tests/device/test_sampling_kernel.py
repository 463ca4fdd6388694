"""The one-kernel sampler picks exactly `sampling.sample_with_uniform`'s token for the same uniform, over
>= 1,000,000 randomized rows (ties, penalties, bans, greedy, temperature, top-k, top-p, extreme u).

Both run on the GPU. The reference draws from the unnormalized weights exp(s - max) with float64 running
sums (runtime/sampling.py says why), which is what the kernel computes, so the gate is zero mismatches.
The counts go to sampling-kernel.json in QWEN3_TTS_REPORT_DIR.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from qwen3_tts_native.engine.kernels import ops
from qwen3_tts_native.engine.runtime import sampling

CASES = 1_000_000
CHUNK = 62_500
EOS = 2150


def random_case(rows: int, vocab: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    kind = torch.randint(0, 4, (rows, 1), generator=g, device="cuda")
    normal = torch.randn(rows, vocab, generator=g, device="cuda") * 3
    ties = torch.randint(-4, 5, (rows, vocab), generator=g, device="cuda").float()  # many exact ties
    coarse = torch.round(normal * 2) / 2
    peaked = normal * 10
    logits = torch.where(
        kind == 0, normal, torch.where(kind == 1, ties, torch.where(kind == 2, coarse, peaked))
    )
    u = torch.rand(rows, generator=g, device="cuda", dtype=torch.float64)
    extreme = torch.rand(rows, generator=g, device="cuda") < 0.02
    u = torch.where(extreme, torch.where(u < 0.5, u * 1e-12, 1 - (1 - u) * 1e-12), u).clamp(max=1 - 2**-53)
    greedy = torch.rand(rows, generator=g, device="cuda") < 0.1
    temperature = torch.tensor([0.5, 0.9, 1.0, 1.3], device="cuda")[
        torch.randint(0, 4, (rows,), generator=g, device="cuda")
    ]
    top_k = torch.tensor([0, 1, 5, 50, vocab], device="cuda")[
        torch.randint(0, 5, (rows,), generator=g, device="cuda")
    ]
    top_p = torch.tensor([1.0, 1.0, 0.95, 0.8, 0.3], device="cuda", dtype=torch.float64)[
        torch.randint(0, 5, (rows,), generator=g, device="cuda")
    ]
    penalty = torch.tensor([1.0, 1.05, 1.3], device="cuda")[
        torch.randint(0, 3, (rows,), generator=g, device="cuda")
    ]
    history = torch.rand(rows, vocab, generator=g, device="cuda") < 0.02
    frames = torch.randint(0, 4, (rows,), generator=g, device="cuda")
    return logits, u, greedy, temperature, top_k.long(), top_p, penalty, history, frames


def test_sampling_kernel_matches_reference_on_a_million_rows(ext, report_dir: Path) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator(device="cuda").manual_seed(1234)
    mismatches = {"talker": 0, "predictor": 0}
    examples = []
    done = 0
    while done < CASES:
        for role, vocab in (("talker", 3072), ("predictor", 2048)):
            logits, u, greedy, temperature, top_k, top_p, penalty, history, frames = random_case(
                CHUNK // 2, vocab, g
            )
            params = sampling.SamplingRows(greedy, temperature, top_k, top_p, penalty)
            if role == "talker":
                banned = sampling.talker_banned_tokens(frames, vocab, EOS)
                expected = sampling.sample_with_uniform(logits, u, params, history, banned)
                got = ops.sample_talker(logits, u, params, history, frames, EOS)
            else:
                # Every other chunk as the frame gives them: bfloat16 logits (their top-k path selects on the
                # logits' 16 bits before the temperature).
                if (done // CHUNK) % 2:
                    logits = logits.to(torch.bfloat16)
                expected = sampling.sample_with_uniform(logits.float(), u, params)
                got = ops.sample_predictor(logits, u, params)
            bad = (got != expected).nonzero().flatten()
            mismatches[role] += int(bad.numel())
            if bad.numel():
                for i in bad[:3].tolist():
                    examples.append(
                        {"role": role, "u": float(u[i]), "got": int(got[i]), "expected": int(expected[i])}
                    )
            done += CHUNK // 2
    record = {
        "cases": done,
        "mismatches": mismatches,
        "examples": examples,
    }
    (report_dir / "sampling-kernel.json").write_text(json.dumps(record, indent=2))
    print(record)
    assert sum(mismatches.values()) == 0, record


def test_sampling_kernel_is_deterministic(ext) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator(device="cuda").manual_seed(5)
    logits, u, greedy, temperature, top_k, top_p, penalty, _history, _frames = random_case(4096, 2048, g)
    params = sampling.SamplingRows(greedy, temperature, top_k, top_p, penalty)
    first = ops.sample_predictor(logits, u, params)
    for _ in range(3):
        assert torch.equal(ops.sample_predictor(logits, u, params), first)


def test_sampling_kernel_reads_bf16_logits_and_gathers_the_next_input(ext) -> None:  # type: ignore[no-untyped-def]
    """bfloat16 logits give the tokens of their float32 values, and the gathered rows are the table's rows of
    those tokens, bit for bit (the frame's codebook steps and its cb0 draw use both)."""
    g = torch.Generator(device="cuda").manual_seed(11)
    mismatches = 0
    for _ in range(8):
        logits, u, greedy, temperature, top_k, top_p, penalty, _history, _frames = random_case(8192, 2048, g)
        params = sampling.SamplingRows(greedy, temperature, top_k, top_p, penalty)
        half = logits.to(torch.bfloat16)
        table = torch.randn(2048, 1024, generator=g, device="cuda").to(torch.bfloat16)
        codes, embedded = ops.sample_predictor_and_embed(half, u, params, table)
        mismatches += int((codes != sampling.sample_with_uniform(half.float(), u, params)).sum())
        assert torch.equal(codes, ops.sample_predictor(half.float(), u, params))
        assert torch.equal(embedded, table[codes])
        talker_logits, u, greedy, temperature, top_k, top_p, penalty, history, frames = random_case(
            4096, 3072, g
        )
        params = sampling.SamplingRows(greedy, temperature, top_k, top_p, penalty)
        half = talker_logits.to(torch.bfloat16)
        cb0 = ops.sample_talker(half, u, params, history, frames, EOS)
        assert torch.equal(cb0, ops.sample_talker(half.float(), u, params, history, frames, EOS))
        codec_table = torch.randn(3072, 2048, generator=g, device="cuda").to(torch.bfloat16)
        drawn, drawn_embed = ops.sample_talker_and_embed(half, u, params, history, frames, EOS, codec_table)
        assert torch.equal(drawn, cb0)
        assert torch.equal(drawn_embed, codec_table[cb0])
    assert mismatches == 0


def test_sampling_kernel_records_the_draws_in_the_rows_slots(ext) -> None:  # type: ignore[no-untyped-def]
    """`ops.DrawRecord` in the kernel: the cb0 draw sets its bit of each row's slot history and writes its
    embedding into every second row of a pair buffer; the last draw copies each row's codes (its own column
    and the ones written before it) to its slot's last frame. Every padded row shares the scratch slot, whose
    bits are all set and whose codes are padded rows' codes."""
    g = torch.Generator(device="cuda").manual_seed(21)
    rows, live, slots_total, width = 64, 40, 80, 16
    scratch = slots_total - 1
    logits, u, greedy, temperature, top_k, top_p, penalty, history, frames = random_case(rows, 3072, g)
    params = sampling.SamplingRows(greedy, temperature, top_k, top_p, penalty)
    half = logits.to(torch.bfloat16)
    slots = torch.cat(
        [
            torch.randperm(scratch, generator=g, device="cuda")[:live],
            torch.full((rows - live,), scratch, device="cuda"),
        ]
    )
    table = torch.rand(slots_total, 3072, generator=g, device="cuda") < 0.01
    codec_table = torch.randn(3072, 2048, generator=g, device="cuda").to(torch.bfloat16)
    codes = torch.randint(0, 2048, (rows, width), generator=g, device="cuda")
    pair = torch.zeros(rows, 2, 2048, device="cuda", dtype=torch.bfloat16)
    recorded = table.clone()
    cb0, embedded = ops.sample_talker_and_embed(
        half,
        u,
        params,
        history,
        frames,
        EOS,
        codec_table,
        out=codes[:, 0],
        embed_out=pair[:, 1],
        record=ops.DrawRecord(slots, history=recorded),
    )
    assert torch.equal(cb0, ops.sample_talker(half, u, params, history, frames, EOS))
    assert torch.equal(pair[:, 1], codec_table[cb0]) and not pair[:, 0].any()
    assert embedded.data_ptr() == pair[:, 1].data_ptr()
    expected = table.clone()
    expected[slots, cb0] = True
    assert torch.equal(recorded, expected)
    predictor_logits = logits[:, :2048].contiguous()
    last_codes = torch.full((slots_total, width), -1, device="cuda")
    drawn = ops.sample_predictor(
        predictor_logits,
        u,
        params,
        out=codes[:, width - 1],
        record=ops.DrawRecord(slots, last_codes=last_codes, frame_codes=codes),
    )
    assert torch.equal(drawn, ops.sample_predictor(predictor_logits, u, params))
    assert torch.equal(last_codes[slots[:live]], codes[:live])
    untouched = torch.ones(slots_total, dtype=torch.bool, device="cuda")
    untouched[slots] = False
    assert (last_codes[untouched] == -1).all()
    # The padded rows' blocks write the scratch row at once: each of its codes is some padded row's.
    assert (codes[live:] == last_codes[scratch]).any(dim=0).all()
