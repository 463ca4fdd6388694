"""The benchmark workload: a JSONL corpus in the format of ``http-workload-10.jsonl``.

Each row is one synthesis request (``id``, ``text``, ``voice_description``; optional ``language``, ``seed``,
``max_duration_seconds``, ``sampling``, ``stream``). Rows are parsed strictly (unknown fields are errors) so
that two engines provably receive the same requests, and each row's sampling controls are normalized into
one canonical object whose hash identifies the sampling contract of a request."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .jsonio import StrictJSONError, canonical_sha256, loads_strict

SAMPLING_CONTRACT = "qwen3-tts-native-evidence-sampling/v1"
SEED_SAMPLING_CONTRACT = "qwen3-tts-native-sglang-common/v1"

ROW_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
ROW_FIELDS = frozenset(
    {"id", "text", "voice_description", "language", "seed", "max_duration_seconds", "sampling", "stream"}
)
TALKER_FIELDS = frozenset({"strategy", "temperature", "top_p", "top_k", "repetition_penalty", "predictor"})
PREDICTOR_FIELDS = frozenset({"strategy", "temperature", "top_p", "top_k"})
MAX_SEED = 2**53 - 1
CODEC_FRAMES_PER_SECOND = 12.5

# The server's defaults (seed contract §1.4); a normalized object spells them out so that an implicit
# default and the same explicit value hash identically.
DEFAULT_TEMPERATURE = 0.9
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = 50
DEFAULT_REPETITION_PENALTY = 1.05


class WorkloadError(ValueError):
    """The corpus is not a valid workload."""


@dataclass(frozen=True)
class WorkloadRow:
    """One request of the corpus, with the raw object kept so request bodies carry exactly what it says."""

    index: int
    raw: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.raw["id"])

    @property
    def text(self) -> str:
        return str(self.raw["text"])

    @property
    def voice_description(self) -> str:
        return str(self.raw["voice_description"])

    @property
    def language(self) -> str:
        return str(self.raw.get("language", "auto"))

    @property
    def seed(self) -> int | None:
        seed = self.raw.get("seed")
        return int(seed) if seed is not None else None

    @property
    def streaming(self) -> bool:
        return bool(self.raw.get("stream", True))

    @property
    def max_duration_seconds(self) -> float | None:
        value = self.raw.get("max_duration_seconds")
        return float(value) if value is not None else None

    @property
    def text_sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def voice_description_sha256(self) -> str:
        return hashlib.sha256(self.voice_description.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Workload:
    """The parsed corpus plus the digest of its exact bytes (the identity the evidence pins)."""

    rows: tuple[WorkloadRow, ...]
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def ordered_seeds(self) -> list[int]:
        return [row.seed for row in self.rows if row.seed is not None]

    def row_for(self, request_index: int) -> WorkloadRow:
        """Requests cycle through the corpus in file order: request i is row i mod N."""
        return self.rows[request_index % len(self.rows)]


def max_codec_frames(seconds: float) -> int:
    """The server's frame ceiling for a duration: ceil(seconds x 12.5)."""
    return math.ceil(seconds * CODEC_FRAMES_PER_SECOND - 1e-9)


def _finite_number(value: Any, where: str, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorkloadError(f"{where} must be a number")
    if not math.isfinite(value) or not low <= value <= high:
        raise WorkloadError(f"{where} must be within [{low}, {high}]")


def _integer(value: Any, where: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise WorkloadError(f"{where} must be an integer within [{low}, {high}]")


def _check_stage(stage: dict[str, Any], where: str, allowed: frozenset[str], top_k_max: int) -> None:
    unknown = set(stage) - allowed
    if unknown:
        raise WorkloadError(f"{where}: unknown fields {sorted(unknown)}")
    strategy = stage.get("strategy", "sample")
    if strategy not in ("sample", "greedy"):
        raise WorkloadError(f"{where}.strategy must be 'sample' or 'greedy'")
    if strategy == "greedy":
        for name in ("temperature", "top_p", "top_k"):
            if name in stage:
                raise WorkloadError(f"{where}.{name} must be omitted with greedy strategy")
    if "temperature" in stage:
        _finite_number(stage["temperature"], f"{where}.temperature", 0.01, 2.0)
    if "top_p" in stage:
        _finite_number(stage["top_p"], f"{where}.top_p", 1.17549435e-38, 1.0)
    if "top_k" in stage:
        _integer(stage["top_k"], f"{where}.top_k", 0, top_k_max)
    if "repetition_penalty" in stage:
        _finite_number(stage["repetition_penalty"], f"{where}.repetition_penalty", 0.1, 2.0)


def check_row(raw: Any, where: str) -> None:
    """Raise WorkloadError unless ``raw`` is a well-formed workload row."""
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: a row must be a JSON object")
    unknown = set(raw) - ROW_FIELDS
    if unknown:
        raise WorkloadError(f"{where}: unknown fields {sorted(unknown)}")
    for name in ("id", "text", "voice_description"):
        if not isinstance(raw.get(name), str) or not raw[name].strip():
            raise WorkloadError(f"{where}: {name} must be a non-empty string")
    if not ROW_ID_PATTERN.fullmatch(raw["id"]):
        raise WorkloadError(f"{where}: id must be 1-128 characters of [A-Za-z0-9._-]")
    if "language" in raw and (not isinstance(raw["language"], str) or not raw["language"].strip()):
        raise WorkloadError(f"{where}: language must be a non-empty string")
    if "seed" in raw:
        _integer(raw["seed"], f"{where}: seed", 0, MAX_SEED)
    if "max_duration_seconds" in raw:
        _finite_number(raw["max_duration_seconds"], f"{where}: max_duration_seconds", 0.08, 655.36)
    if "stream" in raw and not isinstance(raw["stream"], bool):
        raise WorkloadError(f"{where}: stream must be a boolean")
    if "sampling" in raw:
        sampling = raw["sampling"]
        if not isinstance(sampling, dict):
            raise WorkloadError(f"{where}: sampling must be an object")
        _check_stage(sampling, f"{where}: sampling", TALKER_FIELDS, 3072)
        if "predictor" in sampling:
            if not isinstance(sampling["predictor"], dict):
                raise WorkloadError(f"{where}: sampling.predictor must be an object")
            _check_stage(sampling["predictor"], f"{where}: sampling.predictor", PREDICTOR_FIELDS, 2048)


def parse_workload(data: bytes, source: str = "workload") -> Workload:
    """Parse corpus bytes into a Workload; every problem is a WorkloadError naming the line."""
    if not data.endswith(b"\n"):
        raise WorkloadError(f"{source}: must be non-empty and newline-terminated")
    rows: list[WorkloadRow] = []
    seen: set[str] = set()
    for number, line in enumerate(data.splitlines(), start=1):
        where = f"{source}:{number}"
        if not line.strip():
            raise WorkloadError(f"{where}: blank line")
        try:
            raw = loads_strict(line)
        except StrictJSONError as exc:
            raise WorkloadError(f"{where}: {exc}") from exc
        check_row(raw, where)
        if raw["id"] in seen:
            raise WorkloadError(f"{where}: duplicate id {raw['id']!r}")
        seen.add(raw["id"])
        rows.append(WorkloadRow(index=len(rows), raw=raw))
    return Workload(rows=tuple(rows), data=data)


def load_workload(path: Path) -> Workload:
    """Read and parse a workload file."""
    return parse_workload(path.read_bytes(), source=path.name)


def normalized_sampling(row: WorkloadRow, contract: str = SAMPLING_CONTRACT) -> dict[str, Any]:
    """The canonical sampling object of a row: defaults spelled out, greedy stages with null controls.

    ``talker`` and ``predictor`` are null when the row has no ``sampling`` object at all (the server then
    uses its defaults, which a peer may not share)."""
    sampling = row.raw.get("sampling")
    talker: dict[str, Any] | None = None
    predictor: dict[str, Any] | None = None
    if isinstance(sampling, dict):
        strategy = sampling.get("strategy", "sample")
        greedy = strategy == "greedy"
        talker = {
            "strategy": strategy,
            "temperature": None if greedy else float(sampling.get("temperature", DEFAULT_TEMPERATURE)),
            "top_p": None if greedy else float(sampling.get("top_p", DEFAULT_TOP_P)),
            "top_k": None if greedy else int(sampling.get("top_k", DEFAULT_TOP_K)),
            "repetition_penalty": float(sampling.get("repetition_penalty", DEFAULT_REPETITION_PENALTY)),
        }
        stage = sampling.get("predictor", {})
        p_strategy = stage.get("strategy", strategy)
        p_greedy = p_strategy == "greedy"
        predictor = {
            "strategy": p_strategy,
            "temperature": None if p_greedy else float(stage.get("temperature", DEFAULT_TEMPERATURE)),
            "top_p": None if p_greedy else float(stage.get("top_p", DEFAULT_TOP_P)),
            "top_k": None if p_greedy else int(stage.get("top_k", DEFAULT_TOP_K)),
        }
    return {"contract": contract, "seed": row.seed, "talker": talker, "predictor": predictor}


def normalized_sampling_sha256(normalized: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a normalized sampling object."""
    return canonical_sha256(normalized)


def parity_reasons(row: WorkloadRow) -> list[str]:
    """Why a row's sampling is not fully explicit (empty list: it qualifies for sampling parity).

    A request qualifies only when the seed and every control of both stages are spelled out, so that no
    engine's private defaults can change what is being compared."""
    reasons: list[str] = []
    if row.seed is None:
        reasons.append("seed not explicit")
    sampling = row.raw.get("sampling")
    if not isinstance(sampling, dict):
        reasons.append("sampling not explicit")
        return reasons
    if "strategy" not in sampling:
        reasons.append("sampling.strategy not explicit")
    talker_controls = ["repetition_penalty"]
    if sampling.get("strategy", "sample") != "greedy":
        talker_controls = ["temperature", "top_p", "top_k", "repetition_penalty"]
    reasons.extend(f"sampling.{name} not explicit" for name in talker_controls if name not in sampling)
    stage = sampling.get("predictor")
    if not isinstance(stage, dict):
        reasons.append("sampling.predictor not explicit")
        return reasons
    if "strategy" not in stage:
        reasons.append("sampling.predictor.strategy not explicit")
    if stage.get("strategy", sampling.get("strategy", "sample")) != "greedy":
        reasons.extend(
            f"sampling.predictor.{name} not explicit"
            for name in ("temperature", "top_p", "top_k")
            if name not in stage
        )
    return reasons
