"""Engine foundation acceptance: our engine vs the official qwen-tts 0.1.1 model on one random snapshot.

Both run in bf16 with greedy talker and predictor for the same prompt token ids (built by OUR tokenizer and
prompt plan; the official wrapper's own tokenization is not trusted, model.md §8.4), in each text mode.
The official model runs in a subprocess whose PYTHONPATH puts the carried transformers 4.57.3 first
(``--ref-pythonpath``); our engine runs in this process with the image's packages.

Reported per text mode: frames each side produced (an early EOS is flagged), the first frame whose 16 codes
differ, and how many of frames x 16 codes match. Then the codec: the official codes of the first mode are
decoded by the official speech-tokenizer decoder (fp32, and bf16 as the wrapper runs it) and by our
SpeechDecoder (fp32, one-shot and as 1+4+4.. streamed packets), compared before the final clamp (max abs,
relative L2) and as PCM16 (max LSB difference).

    python benchmarks/device/foundation_parity.py --out DIR --model /tmp/q3tts/full \
        --ref-pythonpath /tmp/site_ref:/tmp/site_common

writes DIR/foundation-parity.json and prints a short table. Exit 0 when everything was measured (the
verdicts are in the JSON), 1 when a side failed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.machinery
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any

import torch
from common import (
    Terminated,
    add_snapshot_arguments,
    comma_names,
    command_output,
    ensure_snapshot,
    package_version,
    run_commit,
    snapshot_path,
    terminate,
)
from torch import Tensor

TEXT = "Hello there. This sentence checks that two implementations speak with exactly the same codes."
VOICE_DESCRIPTION = "A warm, calm adult voice speaking at a relaxed pace."
LANGUAGE = "english"
REPETITION_PENALTY = 1.05
SAMPLES_PER_FRAME = 1920
MODES = ("non_streaming", "streaming")
COMPARISONS = ("ours_fp32_vs_official_fp32", "ours_fp32_vs_official_bf16", "official_bf16_vs_official_fp32")
ASSISTANT_TAIL = 5  # <|im_end|> \n <|im_start|> assistant \n: the official code slices input_ids[3:-5]


# ----------------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------------


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------------
# The official side (runs in a subprocess: `--worker JOB`)
# ----------------------------------------------------------------------------------------------------


def _import_qwen_tts() -> Any:
    """``qwen_tts``; torchaudio (used only by the 25 Hz tokenizer) is stubbed where absent (model.md §7.1)."""
    try:
        import torchaudio.compliance.kaldi  # noqa: F401
    except Exception:
        for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
            sys.modules[name] = stub
    import qwen_tts

    return qwen_tts


def _official_decode(tokenizer: Any, codes: Tensor) -> tuple[Tensor, Tensor]:
    """Decode [T, 16] codes as the wrapper does; returns (pre-clamp, clamped) fp32 waveforms on the CPU.

    The official decoder clamps inside its forward, so the last conv's output is captured with a hook."""
    captured: list[Tensor] = []
    last_conv = tokenizer.model.decoder.decoder[-1]
    handle = last_conv.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()))
    try:
        wavs, _rate = tokenizer.decode([{"audio_codes": codes}])
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"expected one decoder chunk, the hook saw {len(captured)}")
    pre_clamp = captured[0].float().reshape(-1)[: codes.shape[0] * SAMPLES_PER_FRAME].cpu()
    return pre_clamp, torch.from_numpy(wavs[0]).float()


def run_reference(job_path: Path) -> int:
    """Worker: load the official model, generate each mode's codes greedily, decode the first mode's."""
    job = json.loads(job_path.read_text())
    device, frames = job["device"], job["frames"]
    result: dict[str, Any] = {"modes": {}, "errors": []}
    try:
        qwen_tts = _import_qwen_tts()
        result["versions"] = {
            name: package_version(name)
            for name in ("qwen-tts", "transformers", "tokenizers", "accelerate", "huggingface-hub", "torch")
        }
        started = time.perf_counter()
        wrapper = qwen_tts.Qwen3TTSModel.from_pretrained(
            job["model"], device_map=device, dtype=torch.bfloat16, attn_implementation=job["attention"]
        )
        result["load_s"] = time.perf_counter() - started
        model = wrapper.model
        for entry in job["prompts"]:
            instruct = entry["instruct_ids"]
            sync(device)
            started = time.perf_counter()
            with torch.no_grad():
                codes, _hidden = model.generate(
                    input_ids=[torch.tensor([entry["input_ids"]], device=device)],
                    instruct_ids=[torch.tensor([instruct], device=device) if instruct else None],
                    languages=[job["language"]],
                    non_streaming_mode=entry["mode"] == "non_streaming",
                    do_sample=False,
                    subtalker_dosample=False,
                    repetition_penalty=job["repetition_penalty"],
                    max_new_tokens=frames + 1,  # N sampled cb0 give N - 1 frames (model.md §2.6)
                )
            sync(device)
            result["modes"][entry["mode"]] = {
                "codes": codes[0].long().cpu(),
                "seconds": time.perf_counter() - started,
            }
        first = result["modes"][job["prompts"][0]["mode"]]["codes"]
        speech_dir = str(Path(job["model"]) / "speech_tokenizer")
        fp32_tokenizer = qwen_tts.Qwen3TTSTokenizer.from_pretrained(
            speech_dir, device_map=device, dtype=torch.float32, attn_implementation="sdpa"
        )
        result["codec"] = {
            "bf16": _official_decode(wrapper.model.speech_tokenizer, first),
            "fp32": _official_decode(fp32_tokenizer, first),
            "bf16_dtype": str(wrapper.model.speech_tokenizer.model.dtype),
        }
    except Exception as error:
        result["errors"].append(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
    torch.save(result, job["result"])
    return 0 if not result["errors"] else 1


# ----------------------------------------------------------------------------------------------------
# Our side and the comparison (the main process)
# ----------------------------------------------------------------------------------------------------


def prompt_ids(model: Path, modes: list[str]) -> list[dict[str, Any]]:
    """Per mode: our prompt plan, and the official `generate` inputs that carry exactly its ids."""
    from qwen3_tts_native.engine.config import load_config
    from qwen3_tts_native.engine.prompt import IM_END, IM_START, build_prompt_plan
    from qwen3_tts_native.engine.tokenizer import TextTokenizer

    tokenizer = TextTokenizer.from_snapshot(model)
    config = load_config(model)
    # The whole assistant string, tokenized as prompt.py does; the plan must be its [:3] and [3:-5] slices.
    assistant = [
        tokenizer.token_id(IM_START),
        *tokenizer.encode_plain(f"assistant\n{TEXT}"),
        tokenizer.token_id(IM_END),
        *tokenizer.encode(f"\n{IM_START}assistant\n"),
    ]
    prompts = []
    for mode in modes:
        plan = build_prompt_plan(tokenizer, config, TEXT, VOICE_DESCRIPTION, LANGUAGE, mode)
        if assistant[:3] != plan.role_ids or assistant[3:-ASSISTANT_TAIL] != plan.text_ids:
            raise RuntimeError("the prompt plan is not the [:3] / [3:-5] slicing of the assistant string")
        prompts.append(
            {"mode": mode, "plan": plan, "input_ids": assistant, "instruct_ids": list(plan.instruct_ids)}
        )
    return prompts


def run_ours(
    model: Path, device: str, prompts: list[dict[str, Any]], frames: int
) -> tuple[Any, dict[str, Any]]:
    """Our engine, bf16, greedy: codes per mode (+ load and generation seconds)."""
    from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
    from qwen3_tts_native.engine.runtime.request import PredictorSampling, SynthesisRequest, TalkerSampling

    started = time.perf_counter()
    engine = VoiceDesignEngine.load(
        model, device=device, dtype=torch.bfloat16, max_sessions=1, accelerate=False
    )  # the eager foundation engine: no graph capture
    out: dict[str, Any] = {"load_s": time.perf_counter() - started, "modes": {}}
    for prompt in prompts:
        request = SynthesisRequest(
            text=TEXT,
            voice_description=VOICE_DESCRIPTION,
            language=LANGUAGE,
            max_frames=frames,
            talker_sampling=TalkerSampling(greedy=True, repetition_penalty=REPETITION_PENALTY),
            predictor_sampling=PredictorSampling(greedy=True),
            text_mode=prompt["mode"],
        )
        sync(device)
        started = time.perf_counter()
        codes = engine.run_to_end(engine.open_session(request, prompt["plan"]))
        sync(device)
        out["modes"][prompt["mode"]] = {"codes": codes.long().cpu(), "seconds": time.perf_counter() - started}
    return engine, out


def compare_codes(official: Tensor, ours: Tensor, frames: int) -> dict[str, Any]:
    common = min(official.shape[0], ours.shape[0])
    equal = official[:common] == ours[:common]
    differing = (~equal.all(dim=1)).nonzero()
    first = int(differing[0]) if len(differing) else None
    if first is None and official.shape[0] != ours.shape[0]:
        first = common  # one side stopped (EOS) where the other went on
    return {
        "frames_requested": frames,
        "official_frames": int(official.shape[0]),
        "ours_frames": int(ours.shape[0]),
        "official_eos_early": int(official.shape[0]) < frames,
        "ours_eos_early": int(ours.shape[0]) < frames,
        "first_differing_frame": first,
        "first_differing_codes": None
        if first is None or first >= common
        else {"official": official[first].tolist(), "ours": ours[first].tolist()},
        "codes_matching": int(equal.sum()),
        "codes_total": frames * 16,
        "cb0_matching": int(equal[:, 0].sum()),
        "identical": bool(official.shape == ours.shape and bool(equal.all())),
    }


def _pcm16(wave: Tensor) -> Tensor:
    return torch.round(wave.clamp(-1.0, 1.0) * 32767.0)


def wave_error(ours: Tensor, reference: Tensor) -> dict[str, float]:
    """Pre-clamp max |diff| and relative L2 (against `reference`), and the PCM16 max LSB difference."""
    ours, reference = ours.double(), reference.double()
    diff = ours - reference
    return {
        "max_abs": float(diff.abs().max()),
        "rel_l2": float(diff.norm() / reference.norm().clamp_min(1e-30)),
        "reference_rms": float(reference.pow(2).mean().sqrt()),
        "max_pcm16_lsb": float((_pcm16(ours) - _pcm16(reference)).abs().max()),
    }


def codec_report(engine: Any, codes: Tensor, official: dict[str, Any], device: str) -> dict[str, Any]:
    """Our fp32 SpeechDecoder vs the official decoder (fp32 and bf16) on the same codes, before the clamp."""
    decoder = engine.decoder
    with torch.no_grad():
        ours = decoder.decode(codes.T[None].to(device), clamp=False)[0].float().cpu()
        state = decoder.new_stream_state()
        packets, start = [], 0
        while start < codes.shape[0]:
            size = 1 if start == 0 else 4
            chunk = codes[start : start + size].to(device)
            packets.append(decoder.decode_stream(chunk, state, clamp=False).float().cpu())
            start += size
    streamed = torch.cat(packets)
    official_fp32, official_fp32_clamped = official["fp32"]
    official_bf16, _ = official["bf16"]
    return {
        "frames": int(codes.shape[0]),
        "ours_dtype": str(next(decoder.parameters()).dtype),
        "official_bf16_dtype": official["bf16_dtype"],
        "ours_fp32_vs_official_fp32": wave_error(ours, official_fp32),
        "ours_fp32_vs_official_bf16": wave_error(ours, official_bf16),
        "official_bf16_vs_official_fp32": wave_error(official_bf16, official_fp32),
        "official_fp32_clamp_check_max_abs": float(
            (official_fp32.clamp(-1, 1) - official_fp32_clamped).abs().max()
        ),
        "ours_streamed_vs_one_shot_max_abs": float((streamed - ours).abs().max()),
        "streamed_packets": len(packets),
    }


def machine_facts(device: str) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": None,  # the official side's, filled in from its run
        "main_env_transformers": package_version("transformers"),  # unused by our engine
        "device": device,
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "driver": None,
        "commit": run_commit(),
    }
    facts["driver"] = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return facts


def start_reference(
    args: argparse.Namespace, prompts: list[dict[str, Any]], work: Path
) -> subprocess.Popen[bytes]:
    job = {
        "model": str(args.model),
        "device": args.device,
        "frames": args.frames,
        "language": LANGUAGE,
        "repetition_penalty": REPETITION_PENALTY,
        "attention": args.ref_attention,
        "prompts": [{k: p[k] for k in ("mode", "input_ids", "instruct_ids")} for p in prompts],
        "result": str(work / "reference.pt"),
    }
    (work / "job.json").write_text(json.dumps(job))
    env = dict(os.environ)
    if args.ref_pythonpath:
        env["PYTHONPATH"] = args.ref_pythonpath
    command = [sys.executable, str(Path(__file__).resolve()), "--out", str(args.out)]
    with (work / "reference.log").open("wb") as log:
        return subprocess.Popen(
            [*command, "--worker", str(work / "job.json")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work,
        )


def print_table(report: dict[str, Any]) -> None:
    print(f"\nfoundation parity: {report['machine'].get('gpu') or report['machine']['device']}, bf16, greedy")
    print(f"{'mode':<14}{'official':>9}{'ours':>6}{'first diff':>12}{'codes match':>16}")
    for mode, row in report["codes"].items():
        first = "none" if row["first_differing_frame"] is None else str(row["first_differing_frame"])
        match = f"{row['codes_matching']}/{row['codes_total']}"
        print(f"{mode:<14}{row['official_frames']:>9}{row['ours_frames']:>6}{first:>12}{match:>16}")
    codec = report.get("codec")
    if codec:
        print(f"codec ({codec['frames']} official frames, pre-clamp):  max_abs      rel_l2   max PCM16 LSB")
        for key in COMPARISONS:
            row = codec[key]
            print(f"  {key:<32}{row['max_abs']:>10.3g}{row['rel_l2']:>12.3g}{row['max_pcm16_lsb']:>12.0f}")
        streamed = codec["ours_streamed_vs_one_shot_max_abs"]
        print(f"  ours streamed (1+4+..) vs one-shot max_abs {streamed:.3g}")
    for error in report["errors"]:
        print("ERROR:", error.splitlines()[0])


def finish_reference(
    reference: subprocess.Popen[bytes], work: Path, deadline: float, report: dict[str, Any]
) -> dict[str, Any] | None:
    """Wait for the official side until `deadline` (perf_counter); its result, or None (errors noted)."""
    try:
        reference.wait(timeout=max(1.0, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        report["errors"].append("official: no result in time (--ref-timeout-s)")
    result = work / "reference.pt"
    official: dict[str, Any] | None = torch.load(result) if result.is_file() else None
    if official is None or official["errors"]:
        log = (work / "reference.log").read_text(errors="replace")[-4000:]
        detail = official["errors"][0] if official and official["errors"] else "no result file"
        report["errors"].append(f"official: {detail}\n--- log tail ---\n{log}")
    return official


def measure(args: argparse.Namespace, modes: list[str], report: dict[str, Any], work: Path) -> None:
    """Both sides (the official one in a subprocess, concurrently) and every comparison, into `report`."""
    made = ensure_snapshot(args.model, args.preset, args.seed)
    report["snapshot"] = {"path": str(args.model), "written_here": made}
    if made:
        report["snapshot"].update(preset=args.preset, seed=args.seed)
    prompts = prompt_ids(args.model, modes)
    report["prompt"] = {
        p["mode"]: {"instruct_ids": len(p["instruct_ids"]), "assistant_ids": len(p["input_ids"])}
        for p in prompts
    }
    deadline = time.perf_counter() + args.ref_timeout_s
    reference = start_reference(args, prompts, work)
    engine = ours = None
    try:
        try:
            engine, ours = run_ours(args.model, args.device, prompts, args.frames)
            report["timing_s"]["ours_load"] = ours["load_s"]
        except Exception as error:
            report["errors"].append(f"ours: {type(error).__name__}: {error}\n{traceback.format_exc()}")
        official = finish_reference(reference, work, deadline, report)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    if official is None or ours is None:
        return
    versions = official.get("versions") or {}
    report["machine"].update(reference=versions, transformers=versions.get("transformers"))
    report["timing_s"]["official_load"] = official.get("load_s")
    for mode in modes:
        if mode in official["modes"] and mode in ours["modes"]:
            theirs, mine = official["modes"][mode], ours["modes"][mode]
            row = compare_codes(theirs["codes"], mine["codes"], args.frames)
            report["codes"][mode] = {
                **row,
                "official_seconds": theirs["seconds"],
                "ours_seconds": mine["seconds"],
            }
    if "codec" in official:
        codes = official["modes"][modes[0]]["codes"]
        report["codec"] = {
            "codes_from": f"official, {modes[0]}",
            **codec_report(engine, codes, official["codec"], args.device),
        }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for foundation-parity.json")
    add_snapshot_arguments(parser)
    parser.add_argument("--frames", type=int, default=200, help="frames per text mode (default 200)")
    parser.add_argument(
        "--modes",
        type=comma_names,
        default=",".join(MODES),
        help="text modes, comma-separated (default both)",
    )
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda (default) or cpu"
    )
    parser.add_argument(
        "--ref-pythonpath",
        default="",
        help="PYTHONPATH of the official side, e.g. /tmp/site_ref:/tmp/site_common (default: inherit)",
    )
    parser.add_argument("--ref-timeout-s", type=float, default=480.0, help="limit for the official side")
    parser.add_argument(
        "--ref-attention",
        choices=("eager", "sdpa"),
        default="eager",
        help="attention backend of the official talker (default eager: the same op order as our default; "
        "sdpa's fused kernel rounds differently, see tests/parity/test_bf16_parity.py)",
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return run_reference(args.worker)
    signal.signal(signal.SIGTERM, terminate)

    modes = args.modes
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes {', '.join(MODES)}")
    args.model = snapshot_path(args)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "schema": "qwen3-tts-native/foundation-parity/1",
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(args.device),
        "settings": {
            "dtype": "bfloat16",
            "attention": f"official {args.ref_attention}, ours eager",
            "greedy": True,
            "repetition_penalty": REPETITION_PENALTY,
            "frames": args.frames,
            "modes": modes,
            "language": LANGUAGE,
            "text": TEXT,
            "voice_description": VOICE_DESCRIPTION,
            "official_max_new_tokens": args.frames + 1,
        },
        "codes": {},
        "timing_s": {},
        "errors": [],
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="foundation-parity-") as tmp:
        try:
            measure(args, modes, report, Path(tmp))
        except (Exception, Terminated) as error:
            report["errors"].append(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
    report["verdict"] = {
        "codes_identical": {mode: row["identical"] for mode, row in report["codes"].items()},
        "early_eos": any(r["official_eos_early"] or r["ours_eos_early"] for r in report["codes"].values()),
        "complete": not report["errors"] and len(report["codes"]) == len(modes) and "codec" in report,
    }
    report["wall_s"] = time.perf_counter() - started
    (args.out / "foundation-parity.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    return 0 if report["verdict"]["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
