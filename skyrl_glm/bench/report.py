"""The benchmark report: per-path stage medians, the rich table and the stage-time plot."""

from __future__ import annotations

import statistics
from typing import Any

STAGES = ("export", "fold", "dedup", "checksum", "transfer", "verify", "rebuild", "load")
PATH_LABELS = {"skyrl": "SkyRL 0.4.0 (memory)", "ours": "skyrl-glm", "disk": "disk (safetensors)"}
GB = 1e9


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarise(path: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path's JSON record: stage medians over its rounds, sizes and verification from the last one."""
    stages = {st: _median([r["stages"][st] for r in runs]) for st in STAGES}
    last = runs[-1]
    return {
        "label": PATH_LABELS[path],
        "stages_s": stages,
        "total_s": sum(v for v in stages.values() if v is not None),
        # the receiver's first update (warm-up included), validated in full; later ones reuse its accepted layout
        "verify_first_s": last["receiver"].get("verify_first_s"),
        "sent_tensors": last["sent_tensors"],
        "sent_bytes": last["sent_bytes"],
        "verified": last["verified"],
        "bit_exact": all(r["verified"]["bit_exact"] for r in runs),
        "manifest_bytes": last.get("manifest_bytes"),
        "export_memo": last.get("export_memo"),  # ours: syncs recalled from the live adapter, learned, refused
        "sender_peak_gpu_bytes": _most([r.get("sender_peak_gpu_bytes") for r in runs]),
        "receiver_peak_gpu_bytes": _most([r.get("receiver_peak_gpu_bytes") for r in runs]),
        "runs": runs,
    }


def _most(values: list[int | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _fmt_gb(v: int | None) -> str:
    return "-" if v is None else f"{v / GB:.3f}"


def _fmt_mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 1e6:.2f}"


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.1f} ms" if v < 10 else f"{v:.2f} s"


def print_report(report: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    a, paths = report["adapter"], report["paths"]
    o = report["options"]
    title = (
        f"LoRA sync: {a['model']} ({a['config']}{'' if a['layers'] is None else f', {a["layers"]} MoE layers'}), "
        f"rank {o['rank']}, {o['dtype']}, {a['exporter']}, transport {o['transport']} "
        f"({o['device']} -> {o['recv_device']})"
    )
    t = Table(title=title)
    t.add_column("stage")
    for p in paths:
        t.add_column(paths[p]["label"], justify="right")
    for st in STAGES:
        t.add_row(st, *(_fmt_s(paths[p]["stages_s"][st]) for p in paths))
    t.add_row("[bold]total[/]", *(f"[bold]{_fmt_s(paths[p]['total_s'])}[/]" for p in paths), end_section=True)
    t.add_row("verify, first update", *(_fmt_s(paths[p].get("verify_first_s")) for p in paths))
    t.add_row("public tensors", *(f"{a['public_tensors']:,}" for _ in paths))
    t.add_row("public GB", *(f"{a['public_bytes'] / GB:.3f}" for _ in paths))
    t.add_row("unique tensors", *(f"{a['unique_tensors']:,}" for _ in paths))
    t.add_row("unique GB", *(f"{a['unique_bytes'] / GB:.3f}" for _ in paths))
    t.add_row("sent tensors", *(f"{paths[p]['sent_tensors']:,}" for p in paths))
    t.add_row("sent GB", *(f"{paths[p]['sent_bytes'] / GB:.3f}" for p in paths))
    t.add_row("manifest MB", *(_fmt_mb(paths[p].get("manifest_bytes")) for p in paths))
    t.add_row("sender peak GPU GB", *(_fmt_gb(paths[p].get("sender_peak_gpu_bytes")) for p in paths))
    t.add_row("receiver peak GPU GB", *(_fmt_gb(paths[p].get("receiver_peak_gpu_bytes")) for p in paths))
    t.add_row(
        "rebuilt bit-exact",
        *(
            f"{'yes' if paths[p]['bit_exact'] else '[red]NO[/]'} ({paths[p]['verified']['received_names']:,} names)"
            for p in paths
        ),
    )
    console.print(t)
    if "disk" in paths:
        ours, disk = paths["ours"]["total_s"], paths["disk"]["total_s"]
        sk = paths["skyrl"]["total_s"]
        console.print(f"speed-up vs disk: skyrl-glm {disk / ours:.1f}x, SkyRL 0.4.0 memory path {disk / sk:.1f}x")
    console.print(f"load: {report['skipped']['load']}")


def plot_report(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = report["paths"]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * len(paths)))
    names = list(paths)
    left = [0.0] * len(names)
    for st in STAGES:
        vals = [(paths[p]["stages_s"][st] or 0.0) * 1e3 for p in names]
        if any(vals):
            ax.barh([paths[p]["label"] for p in names], vals, left=left, label=st)
            left = [x + v for x, v in zip(left, vals, strict=True)]
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("ms (symlog)")
    a, o = report["adapter"], report["options"]
    ax.set_title(f"{a['model']} {a['config']} rank {o['rank']} {a['exporter']}, transport {o['transport']}")
    ax.legend(fontsize=8, ncol=4, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
