"""Lane-level emulation of `attention-tensor-cores.patch`'s `attend_warp_mma` (its fragment index math only)
against the direct attention of the same 16 keys, over e4m3 codes and over a bf16 cache (the queries and
probabilities as bf16 high and low parts): run on the CPU before the patch meets a device.

Why: the patch's risk is its fragment layouts, which nothing here can execute. The emulation follows the
kernel line for line (which bytes a lane loads, which halves go into which register, which lanes shuffle
what) and the m16n8k16 layouts as `engine/kernels/csrc/tensor_core_linear.cu` uses them on the device: A
registers (row g, k 2t..2t+1), (row g + 8, same k), (row g, k + 8), (row g + 8, k + 8); B (k 2t..2t+1,
column g), (k + 8); C (row g, columns 2t, 2t + 1), (row g + 8, same columns). Codes are stood in for by
float64 values (the kernel's codes are exact in f16), so the result must equal the direct computation to
rounding.

Usage: python benchmarks/device/pending/attention_mma_emulation.py
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

D, HEADS, WARP_KEYS, LANES = 128, 2, 16, 32
Pair = tuple[float, float]
Fragments = dict[int, list[float]]


def mma(a_of: list[list[Pair]], b_of: list[tuple[Pair, Pair]], c: Fragments) -> Fragments:
    """D = A B + C for one m16n8k16 tile, the lanes' registers in, the lanes' accumulators out."""
    a, b = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(LANES):
        g, t = lane >> 2, lane & 3
        (a[g, 2 * t], a[g, 2 * t + 1]), (a[g + 8, 2 * t], a[g + 8, 2 * t + 1]) = a_of[lane][0], a_of[lane][1]
        (a[g, 2 * t + 8], a[g, 2 * t + 9]), (a[g + 8, 2 * t + 8], a[g + 8, 2 * t + 9]) = (
            a_of[lane][2],
            a_of[lane][3],
        )
        (b[2 * t, g], b[2 * t + 1, g]), (b[2 * t + 8, g], b[2 * t + 9, g]) = b_of[lane]
    product = a @ b
    return {
        lane: [
            c[lane][0] + product[lane >> 2, 2 * (lane & 3)],
            c[lane][1] + product[lane >> 2, 2 * (lane & 3) + 1],
            c[lane][2] + product[(lane >> 2) + 8, 2 * (lane & 3)],
            c[lane][3] + product[(lane >> 2) + 8, 2 * (lane & 3) + 1],
        ]
        for lane in range(LANES)
    }


def round_bf16(x: float) -> float:
    """x rounded to bf16 (nearest even), as the kernel's `round_bf` rounds it."""
    bits = int(np.array(x, dtype=np.float32).view(np.uint32))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def parts(x: float, codes: bool) -> list[float]:
    """The operand parts the kernel multiplies: x itself (e4m3 cache, f16), or its bf16 high and low parts."""
    return [x] if codes else [round_bf16(x), x - round_bf16(x)]


def value_dim(g: int, mt: int, codes: bool) -> int:
    """The first of the two dims that P.V tile mt's rows g and g + 8 stand for (the kernel's `value_dim`)."""
    if codes:
        return 16 * g + 2 * mt
    return 8 * g + 2 * mt if mt < 4 else 64 + 8 * g + 2 * (mt - 4)


def attend(
    q: NDArray[np.float64],
    k: NDArray[np.float64],
    v: NDArray[np.float64],
    key_scale: NDArray[np.float64],
    value_scale: NDArray[np.float64],
    keys: int,
    codes: bool,
) -> tuple[NDArray[np.float64], list[float], list[float]]:
    """attend_warp_mma's unnormalised P.V [heads, D], max and sum per head, as its lanes compute them, over
    e4m3 codes (`codes`) or a bf16 cache."""
    zero: Pair = (0.0, 0.0)
    scores: Fragments = {lane: [0.0] * 4 for lane in range(LANES)}
    for step in range(8):  # k-step s: dims b + {0, 1} as k (2t, 2t+1), b + {2, 3} as (2t + 8, 2t + 9)
        a_of, b_of = [], []
        for lane in range(LANES):
            g, t = lane >> 2, lane & 3
            base = 32 * t + 4 * step if codes else 8 * t + 32 * (step // 2) + 4 * (step % 2)
            a_of.append(
                [
                    (k[row, base + hi], k[row, base + hi + 1])
                    for hi, row in ((0, g), (0, g + 8), (2, g), (2, g + 8))
                ]
            )
            b_of.append(
                ((q[g, base], q[g, base + 1]), (q[g, base + 2], q[g, base + 3]))
                if g < HEADS
                else (zero, zero)
            )
        for part in range(1 if codes else 2):  # the queries' parts, one product each
            b_part = [tuple((parts(x, codes)[part], parts(y, codes)[part]) for x, y in b) for b in b_of]
            scores = mma(a_of, b_part, scores)  # type: ignore[arg-type]
    score: Fragments = {}
    for lane in range(LANES):
        g = lane >> 2
        live = [g < keys, g < keys, g + 8 < keys, g + 8 < keys]
        scale = [key_scale[g], key_scale[g], key_scale[g + 8], key_scale[g + 8]]
        score[lane] = [s * f if ok else -np.inf for s, f, ok in zip(scores[lane], scale, live, strict=True)]
    same_t = {lane: [other for other in range(LANES) if other & 3 == lane & 3] for lane in range(LANES)}
    m = {
        lane: [max(max(score[o][h], score[o][2 + h]) for o in same_t[lane]) for h in range(2)]
        for lane in range(LANES)
    }
    p = {
        lane: [
            0.0 if score[lane][i] == -np.inf else float(np.exp(score[lane][i] - m[lane][i % 2]))
            for i in range(4)
        ]
        for lane in range(LANES)
    }
    total = {
        lane: [sum(p[o][h] + p[o][2 + h] for o in same_t[lane]) for h in range(2)] for lane in range(LANES)
    }
    key_g_word = {
        lane: (p[lane][0] * value_scale[lane >> 2], p[lane][1] * value_scale[lane >> 2])
        for lane in range(LANES)
    }
    key_g8_word = {
        lane: (p[lane][2] * value_scale[(lane >> 2) + 8], p[lane][3] * value_scale[(lane >> 2) + 8])
        for lane in range(LANES)
    }
    probabilities: list[tuple[Pair, Pair]] = []
    for lane in range(LANES):
        g, t = lane >> 2, lane & 3
        if g >= HEADS:
            probabilities.append((zero, zero))
            continue
        x0, x1, y0, y1 = key_g_word[8 * t], key_g_word[8 * t + 4], key_g8_word[8 * t], key_g8_word[8 * t + 4]
        probabilities.append(((x0[g], x1[g]), (y0[g], y1[g])))
    out = np.full((HEADS, D), np.nan)
    for mt in range(8):  # tile mt's rows g, g + 8: dims value_dim and + 1
        a_of = []
        for lane in range(LANES):
            g, t = lane >> 2, lane & 3
            pairs = []
            for i in range(4):
                key = 2 * t + (i & 1) + 8 * (i >> 1)
                dim = value_dim(g, mt, codes)
                pairs.append((v[key, dim], v[key, dim + 1]) if key < keys else zero)
            a_of.append(
                [
                    (pairs[0][0], pairs[1][0]),
                    (pairs[0][1], pairs[1][1]),
                    (pairs[2][0], pairs[3][0]),
                    (pairs[2][1], pairs[3][1]),
                ]
            )
        acc: Fragments = {lane: [0.0] * 4 for lane in range(LANES)}
        for part in range(1 if codes else 2):  # P' parts, one product each
            b_part = [
                tuple((parts(x, codes)[part], parts(y, codes)[part]) for x, y in b) for b in probabilities
            ]
            acc = mma(a_of, b_part, acc)  # type: ignore[arg-type]
        for g in range(8):
            lane, dim = 4 * g, value_dim(g, mt, codes)
            out[0, dim], out[0, dim + 1] = acc[lane][0], acc[lane][2]
            out[1, dim], out[1, dim + 1] = acc[lane][1], acc[lane][3]
    return out, m[0], total[0]


def main() -> int:
    rng = np.random.default_rng(0)
    for codes in (True, False):
        for keys in (1, 5, 9, 16):
            k, v = rng.standard_normal((WARP_KEYS, D)), rng.standard_normal((WARP_KEYS, D))
            ones = np.ones(WARP_KEYS)  # a bf16 cache has no scales
            key_scale = rng.uniform(0.5, 2.0, WARP_KEYS) if codes else ones
            value_scale = rng.uniform(0.5, 2.0, WARP_KEYS) if codes else ones
            q = rng.standard_normal((HEADS, D))
            out, m, total = attend(q, k, v, key_scale, value_scale, keys, codes)
            s = (q @ k[:keys].T) * key_scale[:keys]
            p = np.exp(s - s.max(1, keepdims=True))
            expected = (p * value_scale[:keys]) @ v[:keys]
            error = float(np.abs(out - expected).max())
            assert np.allclose(out, expected) and np.allclose(m, s.max(1)) and np.allclose(total, p.sum(1))
            cache = "e4m3" if codes else "bf16"
            print(
                f"{cache}, {keys} keys: the lanes' P.V, max and sum match the direct attention ({error:.1e})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
