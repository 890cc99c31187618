"""Writing results: ``latest.json`` (every raw number) and ``latest.md`` (the table)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from common import PEER_SOURCE, Row

RATIO_NOTE = (
    "ratio = how many times corral's cost exceeds the baseline's, both measured in this "
    "run (time / baseline time; for rates and GB/s, baseline / corral). 1.0 = as fast as the "
    "baseline. Compare ratios across runs, not absolute figures: the machine is small and "
    "shared."
)


def fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if unit == "bytes":
        return f"{value:,.0f} B"
    if unit == "processes":
        return f"{value:.0f}"
    magnitude = abs(value)
    if magnitude == 0:
        text = "0"
    elif magnitude >= 1000:
        text = f"{value:,.0f}"
    elif magnitude >= 100:
        text = f"{value:.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    elif magnitude >= 1:
        text = f"{value:.2f}"
    elif magnitude >= 0.01:
        text = f"{value:.3f}"
    else:
        text = f"{value:.4f}"
    return f"{text} {unit}".strip()


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    if math.isinf(ratio):
        return "inf"
    return f"{ratio:.2f}x" if ratio < 100 else f"{ratio:.0f}x"


def fmt_met(row: Row) -> str:
    if not row.targets:
        return ""
    parts = []
    for t in row.targets:
        mark = {True: "yes", False: "**NO**", None: "?"}[t.met]
        parts.append(mark if len(row.targets) == 1 else f"{mark} ({t.text})")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(doc: dict[str, Any], rows: list[Row]) -> str:
    m = doc["machine"]
    lines = [
        "# corral benchmarks",
        "",
        f"{m['date']} · {m['cpu_count']} CPUs (affinity {m['cpu_affinity']}) · "
        f"load {_load(m.get('loadavg_at_start'))} at start · Python {m['python']} · "
        f"numpy {m['numpy']} · torch {m['torch'] or 'not installed'} · "
        f"commit {(m.get('git_commit') or '?')[:10]} · "
        f"{'quick' if doc['options']['quick'] else 'full'} run"
        + (
            " · **interrupted**: only the rows measured before it" if doc.get("interrupted") else ""
        ),
        "",
        _provenance(m.get("baseline_python") or {}),
        "",
        RATIO_NOTE,
        "",
        "| metric | corral | baseline | ratio | target | met? |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = " and ".join(t.text for t in r.targets)
        lines.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in (
                    f"{r.label} (`{r.key}`)",
                    fmt(r.value, r.unit),
                    f"{fmt(r.baseline, r.unit)} — {r.baseline_label}{_moved(r)}",
                    fmt_ratio(r.ratio),
                    target,
                    fmt_met(r),
                )
            )
            + " |"
        )
    peers = [r for r in rows if "peer" in r.extra]
    if peers:
        lines += [
            "",
            f"## Peer figures, for scale ({PEER_SOURCE})",
            "",
            "| metric | corral | peer | corral vs peer |",
            "|---|---|---|---|",
        ]
        for r in peers:
            peer = r.extra["peer"]
            if r.higher_is_better:
                better = r.value / peer["value"] if peer["value"] else math.inf
            else:
                better = peer["value"] / r.value if r.value else math.inf
            lines.append(
                f"| {_cell(r.label)} | {fmt(r.value, r.unit)} | {_cell(peer['text'])} "
                f"| {better:,.0f}x better |"
            )
    skipped = doc.get("skipped") or {}
    if skipped:
        lines += ["", "## Backends not measured", ""]
        lines += [f"- **{name}**: {why}" for name, why in skipped.items()]
    failed = doc.get("failed") or {}
    if failed:
        lines += ["", "## Backends that failed", ""]
        lines += [f"- **{name}**: {why}" for name, why in failed.items()]
    lines.append("")
    return "\n".join(lines)


def _provenance(p: dict[str, Any]) -> str:
    if not p:
        return "Baselines: interpreter not recorded."
    return (
        f"Baselines and workers: `{p.get('interpreter')}` (Python {p.get('version')}; venv "
        f"{p.get('venv') or 'none'}; site-packages {', '.join(p.get('site_packages') or [])}; "
        f"corral bytecode {p.get('corral_bytecode')}; PYTHONDONTWRITEBYTECODE="
        f"{p.get('PYTHONDONTWRITEBYTECODE') or 'unset'}), each measured beside corral in the "
        f"same minute. **moved** marks a baseline more than {MOVED:.0%} away from the "
        "previous run's."
    )


#: a baseline this far from the previous run's is marked in the table (the ratio hides it)
MOVED = 0.30


def mark_moved_baselines(previous_json: str, rows: list[Row]) -> None:
    """Note in each row's ``extra`` how far its baseline moved from the previous run's."""
    try:
        with open(previous_json) as fh:
            before = {r["key"]: r.get("baseline") for r in json.load(fh).get("rows", [])}
    except (OSError, ValueError, KeyError, TypeError):
        return
    for r in rows:
        old = before.get(r.key)
        if isinstance(old, int | float) and old > 0 and r.baseline is not None:
            moved = round(r.baseline / old - 1.0, 3)  # a new dict: rows may share one
            r.extra = {**r.extra, "baseline_previous": old, "baseline_moved": moved}


def _moved(r: Row) -> str:
    moved = r.extra.get("baseline_moved")
    if moved is None or abs(moved) <= MOVED:
        return ""
    return f" (**moved** {moved:+.0%} from the previous run's {fmt(r.extra['baseline_previous'], r.unit)})"


def _load(load: list[float] | None) -> str:
    return "/".join(f"{x:.2f}" for x in load) if load else "?"


def write(
    out_dir: str, doc: dict[str, Any], rows: list[Row], name: str = "latest"
) -> tuple[str, str]:
    """``<name>.json`` and ``<name>.md`` in ``out_dir``; baselines are compared with the
    last full record, ``latest.json``."""
    os.makedirs(out_dir, exist_ok=True)
    mark_moved_baselines(os.path.join(out_dir, "latest.json"), rows)
    doc = _finite(dict(doc, rows=[r.to_json() for r in rows], ratio_note=RATIO_NOTE))
    json_path = os.path.join(out_dir, f"{name}.json")
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(json_path + ".tmp", "w") as fh:
        json.dump(doc, fh, indent=1, allow_nan=False, default=_json_default)
        fh.write("\n")
    os.replace(json_path + ".tmp", json_path)
    with open(md_path + ".tmp", "w") as fh:
        fh.write(markdown(doc, rows))
    os.replace(md_path + ".tmp", md_path)
    return json_path, md_path


def _finite(obj: Any) -> Any:
    """JSON has no inf/nan: write them as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot write a {type(obj).__name__} to the results")
