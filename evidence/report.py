"""``evidence report``: a self-contained HTML report (plus a PDF) with plots, from a validated bundle.

The report only renders evidence that passed the validator, so every number in it is one the
validator recomputed. Plots (matplotlib, PNG): TTFA CDF per profile and engine, request RTF per profile,
packet cadence, and GPU memory and power over time (process RSS and CPU share where the run had no GPU
telemetry). The HTML uses inline CSS and relative PNG paths only, so the output directory can be
archived or served as it is. The PDF is drawn with matplotlib's own PDF backend (no external renderer).
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bundle import MANIFEST, RunKey, open_bundle
from .jsonio import iter_jsonl_strict, load_strict
from .stats import distribution
from .validate import ValidationResult, validate_bundle

_STYLES = ["-", "--", "-.", ":"]
_MARKERS = ["o", "s", "^", "D", "v", "P"]


class ReportError(RuntimeError):
    """The bundle did not validate, so no report is written."""

    def __init__(self, result: ValidationResult) -> None:
        super().__init__(f"the bundle failed validation with {len(result.findings.failures)} findings")
        self.result = result


@dataclass
class RunView:
    """What the report needs of one run."""

    key: RunKey
    requests: list[dict[str, Any]]
    packets: list[dict[str, Any]]
    summary: dict[str, Any]
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    phases: dict[str, int] = field(default_factory=dict)
    resource: dict[str, Any] | None = None


def load_runs(root: Path, manifest: Mapping[str, Any]) -> list[RunView]:
    """The runs of a (validated) bundle, keyed from the manifest's evidence files."""
    files: dict[RunKey, dict[str, str]] = defaultdict(dict)
    for entry in manifest["evidence_files"]:
        if "engine_id" in entry and "round" in entry:
            files[RunKey(entry["engine_id"], entry["profile_id"], entry["round"])][entry["role"]] = entry[
                "path"
            ]
    runs = []
    for key, roles in sorted(files.items(), key=lambda kv: kv[0].path):
        if not {"client_requests", "client_packets", "client_summary"} <= set(roles):
            continue
        view = RunView(
            key=key,
            requests=[r for _, r in iter_jsonl_strict(root / roles["client_requests"])],
            packets=[p for _, p in iter_jsonl_strict(root / roles["client_packets"])],
            summary=load_strict(root / roles["client_summary"]),
        )
        if "telemetry" in roles:
            view.telemetry = [s for _, s in iter_jsonl_strict(root / roles["telemetry"])]
        if "phase_events" in roles:
            view.phases = {
                e["event"]: int(e["monotonic_ns"]) for _, e in iter_jsonl_strict(root / roles["phase_events"])
            }
        if "run_resource" in roles:
            view.resource = load_strict(root / roles["run_resource"])
        runs.append(view)
    return runs


def _style(index: int) -> dict[str, Any]:
    return {
        "linestyle": _STYLES[index % len(_STYLES)],
        "marker": _MARKERS[index % len(_MARKERS)],
        "markevery": 0.1,
    }


def _engines(runs: Sequence[RunView]) -> list[str]:
    return sorted({r.key.engine_id for r in runs})


def _profiles(runs: Sequence[RunView]) -> list[str]:
    return list(dict.fromkeys(r.key.profile_id for r in runs))


def _successes(runs: Sequence[RunView], engine: str, profile: str) -> list[dict[str, Any]]:
    return [
        q
        for r in runs
        if r.key.engine_id == engine and r.key.profile_id == profile
        for q in r.requests
        if q.get("success")
    ]


def plot_ttfa_cdf(runs: Sequence[RunView], out: Path) -> list[Path]:
    """One TTFA CDF per profile, a line per engine."""
    import matplotlib.pyplot as plt

    paths = []
    for profile in _profiles(runs):
        fig, ax = plt.subplots(figsize=(7, 4))
        for i, engine in enumerate(_engines(runs)):
            values = sorted(float(q["ttfa_ms"]) for q in _successes(runs, engine, profile))
            if values:
                ax.plot(
                    values, [(k + 1) / len(values) for k in range(len(values))], label=engine, **_style(i)
                )
        ax.set_xlabel("time to first audio (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"TTFA CDF, profile {profile}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = out / f"ttfa_cdf_{profile}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_rtf(runs: Sequence[RunView], out: Path) -> Path:
    """Request RTF per profile (box per engine) with the aggregate RTF of each run as a marker."""
    import matplotlib.pyplot as plt

    engines, profiles = _engines(runs), _profiles(runs)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(profiles) * len(engines)), 4))
    width = 0.8 / max(len(engines), 1)
    for i, engine in enumerate(engines):
        positions = [p + (i - (len(engines) - 1) / 2) * width for p in range(len(profiles))]
        data = [
            [float(q["rtf"]) for q in _successes(runs, engine, profile)] or [math.nan] for profile in profiles
        ]
        boxes = ax.boxplot(
            data, positions=positions, widths=width * 0.8, patch_artist=True, manage_ticks=False
        )
        for patch in boxes["boxes"]:
            patch.set_facecolor("white")
            patch.set_hatch(["", "//", "..", "xx"][i % 4])
        aggregates = [
            (positions[j], float(r.summary["aggregate_rtf"]))
            for j, profile in enumerate(profiles)
            for r in runs
            if r.key.engine_id == engine
            and r.key.profile_id == profile
            and r.summary.get("aggregate_rtf") is not None
        ]
        if aggregates:
            ax.scatter(
                *zip(*aggregates, strict=True),
                marker=_MARKERS[i % len(_MARKERS)],
                color="black",
                label=f"{engine} aggregate RTF",
                zorder=3,
            )
    ax.set_xticks(range(len(profiles)), profiles)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_ylabel("RTF (wall / audio; < 1 is faster than real time)")
    ax.set_title("Request RTF per profile (boxes) and aggregate RTF per run (markers)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    path = out / "rtf_by_profile.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_cadence(runs: Sequence[RunView], out: Path) -> Path:
    """CDF of packet inter-arrival times per engine and profile."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    index = 0
    for engine in _engines(runs):
        for profile in _profiles(runs):
            ok = {(r.key, q["request_index"]) for r in runs for q in r.requests if q.get("success")}
            values = sorted(
                float(p["inter_arrival_ms"])
                for r in runs
                if r.key.engine_id == engine and r.key.profile_id == profile
                for p in r.packets
                if p.get("inter_arrival_ms") is not None and (r.key, p["request_index"]) in ok
            )
            if values:
                ax.plot(
                    values,
                    [(k + 1) / len(values) for k in range(len(values))],
                    label=f"{engine} {profile}",
                    **_style(index),
                )
                index += 1
    ax.set_xlabel("packet inter-arrival time (ms)")
    ax.set_ylabel("fraction of packets")
    ax.set_title("Packet cadence")
    ax.grid(True, alpha=0.3)
    if index:
        ax.legend(fontsize="small")
    path = out / "packet_cadence.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_resources(runs: Sequence[RunView], out: Path) -> Path:
    """GPU memory and power over time per run (RSS and CPU share when the run had no GPU telemetry)."""
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    gpu = any(s.get("gpu") == "nvml" for r in runs for s in r.telemetry)
    for i, run in enumerate(r for r in runs if r.telemetry and "measured_start" in r.phases):
        origin = run.phases["measured_start"]
        times = [(int(s["monotonic_ns"]) - origin) / 1e9 for s in run.telemetry]
        if gpu:
            memory = [
                sum(g.get("memory_used_bytes") or 0 for g in s.get("gpus", [])) / 2**30 for s in run.telemetry
            ]
            power = [sum(g.get("power_w") or 0.0 for g in s.get("gpus", [])) for s in run.telemetry]
        else:
            memory = [(s.get("target_rss_bytes") or 0) / 2**30 for s in run.telemetry]
            power = [float(s.get("target_cpu_percent") or 0.0) for s in run.telemetry]
        label = f"{run.key.engine_id} {run.key.profile_id} r{run.key.round}"
        top.plot(times, memory, label=label, **_style(i))
        bottom.plot(times, power, label=label, **_style(i))
    top.set_ylabel("GPU memory used (GiB)" if gpu else "server RSS (GiB)")
    bottom.set_ylabel("board power (W)" if gpu else "server CPU (%)")
    bottom.set_xlabel("seconds since the measured window opened (negative: idle baseline and warm-ups)")
    top.set_title(
        "GPU memory and power over time" if gpu else "gpu: unavailable - server RSS and CPU over time"
    )
    for axis in (top, bottom):
        axis.axvline(0.0, color="grey", linewidth=0.8)
        axis.grid(True, alpha=0.3)
    top.legend(fontsize="small")
    path = out / "resources_over_time.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summary_rows(runs: Sequence[RunView]) -> list[dict[str, Any]]:
    """Per engine and profile, pooled over rounds."""
    rows = []
    for engine in _engines(runs):
        for profile in _profiles(runs):
            group = [r for r in runs if r.key.engine_id == engine and r.key.profile_id == profile]
            if not group:
                continue
            requests = [q for r in group for q in r.requests]
            ok = [q for q in requests if q.get("success")]
            ttfa = distribution(float(q["ttfa_ms"]) for q in ok)
            rtf = distribution(float(q["rtf"]) for q in ok)
            wall = math.fsum(float(r.summary["benchmark_wall_seconds"]) for r in group)
            audio = math.fsum(float(q["audio_seconds"]) for q in ok)
            resources = [r.resource for r in group if r.resource]
            energy = [x["energy_j"] for x in resources if x.get("energy_j") is not None]
            rows.append(
                {
                    "engine": engine,
                    "profile": profile,
                    "rounds": len(group),
                    "requests": len(requests),
                    "successes": len(ok),
                    "ttfa_p50": ttfa["p50"],
                    "ttfa_p95": ttfa["p95"],
                    "ttfa_p99": ttfa["p99"],
                    "rtf_p50": rtf["p50"],
                    "rtf_p95": rtf["p95"],
                    "aggregate_rtf": wall / audio if audio > 0 else None,
                    "throughput": len(ok) / wall if wall > 0 else None,
                    "underruns": sum(int(q.get("underrun_count") or 0) for q in ok),
                    "rss_peak_gib": max((x["process_rss_peak_bytes"] or 0 for x in resources), default=0)
                    / 2**30
                    if resources
                    else None,
                    "gpu_peak_gib": max((x["gpu_memory_peak_bytes"] or 0 for x in resources), default=0)
                    / 2**30
                    if any(x.get("gpu_memory_peak_bytes") is not None for x in resources)
                    else None,
                    "avg_power_w": (math.fsum(x["average_power_w"] for x in resources) / len(resources))
                    if resources and all(x.get("average_power_w") is not None for x in resources)
                    else None,
                    "energy_per_audio_s": math.fsum(energy) / audio if energy and audio > 0 else None,
                }
            )
    return rows


_COLUMNS = [
    ("engine", "engine"),
    ("profile", "profile"),
    ("rounds", "rounds"),
    ("requests", "requests"),
    ("successes", "ok"),
    ("ttfa_p50", "TTFA p50 ms"),
    ("ttfa_p95", "TTFA p95 ms"),
    ("ttfa_p99", "TTFA p99 ms"),
    ("rtf_p50", "RTF p50"),
    ("rtf_p95", "RTF p95"),
    ("aggregate_rtf", "aggregate RTF"),
    ("throughput", "req/s"),
    ("underruns", "underruns"),
    ("rss_peak_gib", "RSS peak GiB"),
    ("gpu_peak_gib", "GPU peak GiB"),
    ("avg_power_w", "avg W"),
    ("energy_per_audio_s", "J per audio s"),
]


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def _html(
    manifest: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    plots: Sequence[Path],
    result: ValidationResult,
) -> str:
    esc = html.escape
    report = manifest["report"]
    system = manifest["system"]
    fixture = manifest["evidence_kind"] == "test_fixture"
    banner = f'<p class="banner">{esc(str(manifest.get("test_fixture_notice", "")))}</p>' if fixture else ""
    gpu_note = (
        '<p class="banner">gpu: unavailable - memory and power figures are CPU-side only.</p>'
        if system.get("gpu_telemetry") == "unavailable"
        else ""
    )
    table = "".join(f"<th>{esc(title)}</th>" for _, title in _COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(_cell(row[k]))}</td>" for k, _ in _COLUMNS) + "</tr>" for row in rows
    )
    implementations = "".join(
        f"<li><b>{esc(i['id'])}</b> ({esc(i.get('role', ''))}): "
        f"{esc(i.get('name', ''))} {esc(i.get('version', ''))}"
        f", {esc(i.get('api', i.get('api_protocol', '')))}</li>"
        for i in manifest["implementations"]
    )
    figures = "".join(
        f'<figure><img src="plots/{esc(p.name)}" alt="{esc(p.stem)}"><figcaption>{esc(p.stem)}'
        "</figcaption></figure>"
        for p in plots
    )
    limitations = "".join(f"<li>{esc(x)}</li>" for x in manifest["limitations"])
    methodology = "".join(
        f"<li><b>{esc(k)}</b>: {esc(str(v))}</li>" for k, v in manifest["methodology"].items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(report["title"])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 70em; color: #111; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
th, td {{ border: 1px solid #999; padding: 0.25em 0.5em; }}
th {{ background: #eee; }} .banner {{ border: 2px solid #000; padding: 0.5em; font-weight: bold; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; }} code {{ font-size: 0.9em; }}
</style></head><body>
<h1>{esc(report["title"])}</h1>
{banner}{gpu_note}
<p>Benchmark <code>{esc(report["benchmark_id"])}</code>, generated {esc(report["generated_at"])}, schema
{esc(str(manifest["schema_version"]))}, {esc(str(manifest["evidence_kind"]))}. Validated: {result.runs} runs,
{result.requests} measured requests, 0 findings.</p>
<h2>Summary</h2>
<table><tr>{table}</tr>{body}</table>
<p>TTFA and request RTF percentiles pool successful requests over rounds;
aggregate RTF = summed measured window
seconds / summed audio seconds.</p>
<h2>Implementations</h2><ul>{implementations}</ul>
<h2>System</h2><p>{esc(system.get("host_model", ""))}, {esc(system.get("cpu", ""))},
{esc(system.get("accelerator", ""))}, {esc(system.get("os", ""))}.</p>
<h2>Plots</h2>{figures}
<h2>Methodology</h2><ul>{methodology}</ul>
<h2>Limitations</h2><ul>{limitations}</ul>
</body></html>
"""


def _pdf(
    path: Path, manifest: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], plots: Sequence[Path]
) -> None:
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    with PdfPages(path, metadata={"Title": manifest["report"]["title"], "CreationDate": None}) as pdf:
        fig = plt.figure(figsize=(11.69, 8.27))
        fig.text(0.03, 0.95, manifest["report"]["title"], fontsize=16, weight="bold")
        if manifest["evidence_kind"] == "test_fixture":
            fig.text(0.03, 0.91, str(manifest.get("test_fixture_notice", "")), fontsize=9, weight="bold")
        ax = fig.add_axes((0.03, 0.05, 0.94, 0.82))
        ax.axis("off")
        if rows:
            table = ax.table(
                cellText=[[_cell(r[k]) for k, _ in _COLUMNS] for r in rows],
                colLabels=[t for _, t in _COLUMNS],
                loc="upper center",
            )
            table.auto_set_font_size(False)
            table.set_fontsize(6)
        pdf.savefig(fig)
        plt.close(fig)
        for plot in plots:
            fig = plt.figure(figsize=(11.69, 8.27))
            ax = fig.add_axes((0.03, 0.03, 0.94, 0.94))
            ax.imshow(mpimg.imread(plot))
            ax.axis("off")
            pdf.savefig(fig)
            plt.close(fig)


def render_report(bundle: Path, out: Path, allow_test_fixture: bool = False) -> list[Path]:
    """Validate the bundle, then write ``index.html``, ``report.pdf`` and ``plots/*.png`` under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    result = validate_bundle(bundle, allow_test_fixture=allow_test_fixture)
    if not result.ok:
        raise ReportError(result)
    with open_bundle(bundle) as root:
        manifest = load_strict(root / MANIFEST)
        runs = load_runs(root, manifest)
    plots_dir = out / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    plots = [*plot_ttfa_cdf(runs, plots_dir), plot_rtf(runs, plots_dir), plot_cadence(runs, plots_dir)]
    if any(r.telemetry for r in runs):
        plots.append(plot_resources(runs, plots_dir))
    rows = summary_rows(runs)
    index = out / "index.html"
    index.write_text(_html(manifest, rows, plots, result), encoding="utf-8")
    pdf = out / "report.pdf"
    _pdf(pdf, manifest, rows, plots)
    return [index, pdf, *plots]
