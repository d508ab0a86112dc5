"""Public vs unique size of a LoRA adapter, from a config's shapes only (nothing is allocated).

*Public* = what Megatron-Bridge's ``export_adapter_weights`` hands out (every name counted, the shared-across-experts
adapter once per expert name). *Unique* = distinct tensors behind those names (what a deduplicating sync must move).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm import terminal
from skyrl_glm.lora.bridge import bridge_export_specs
from skyrl_glm.usage import positive_int

if TYPE_CHECKING:
    from skyrl_glm.models.base import LoraPolicy

GB = 1e9


@dataclass(frozen=True)
class AdapterSizes:
    model: str
    rank: int
    dtype: str
    targets: tuple[str, ...]
    share_expert_adapters: bool
    public_tensors: int
    public_bytes: int
    unique_tensors: int
    unique_bytes: int
    # kind -> (public_tensors, public_bytes, unique_tensors, unique_bytes)
    by_kind: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)

    @property
    def dedup_ratio(self) -> float:
        return self.public_bytes / self.unique_bytes if self.unique_bytes else float("nan")


def adapter_sizes(
    config: Any,
    lora: LoraPolicy,
    *,
    rank: int = 32,
    targets: Sequence[str],
    dtype: torch.dtype = torch.bfloat16,
    share_expert_adapters: bool = True,
    model: str = "",
) -> AdapterSizes:
    """Counts and bytes of the Bridge-export (public) and deduplicated (unique) adapter for ``config`` and these
    targets of the family's policy ``lora``."""
    positive_int("rank", rank)
    itemsize = torch.empty((), dtype=dtype).element_size()
    specs = bridge_export_specs(config, lora, rank=rank, targets=targets, share_expert_adapters=share_expert_adapters)
    seen: set[str] = set()
    by_kind: dict[str, list[int]] = {}
    pub_n = pub_b = uniq_n = uniq_b = 0
    for s in specs:
        nbytes = s.numel * itemsize
        k = by_kind.setdefault(s.kind, [0, 0, 0, 0])
        pub_n += 1
        pub_b += nbytes
        k[0] += 1
        k[1] += nbytes
        if s.storage not in seen:
            seen.add(s.storage)
            uniq_n += 1
            uniq_b += nbytes
            k[2] += 1
            k[3] += nbytes
    return AdapterSizes(
        model=model or getattr(config, "model_type", "?"),
        rank=rank,
        dtype=str(dtype).removeprefix("torch."),
        targets=tuple(targets),
        share_expert_adapters=share_expert_adapters,
        public_tensors=pub_n,
        public_bytes=pub_b,
        unique_tensors=uniq_n,
        unique_bytes=uniq_b,
        by_kind={k: tuple(v) for k, v in by_kind.items()},
    )


def family_sizes(
    family: Any, *, full: bool = True, rank: int = 32, targets: Sequence[str] | None = None, **kw: Any
) -> AdapterSizes:
    """:func:`adapter_sizes` for a registered family: its full or tiny config, with ``targets`` as users write them
    (default: the family's targets for the GPU sampler, ``vllm``, routed experts included)."""
    config = family.config("full" if full else "tiny")
    chosen = family.lora.resolve(None if targets is None else list(targets), sampler="vllm", allow_unsupported=True)
    label = f"{family.name} ({'full' if full else 'tiny'})"
    return adapter_sizes(config, family.lora, rank=rank, targets=chosen, model=label, **kw)


def print_sizes_table(rows: Sequence[AdapterSizes], console: Any = None, *, by_kind: bool = True) -> None:
    """Rich table: public vs unique tensors and GB per adapter (and per kind of module)."""
    from rich.table import Table

    console = console or terminal.console()
    table = Table(title="LoRA adapter: public (Bridge export) vs unique tensors")
    for col in ("model", "part", "rank", "public tensors", "public GB", "unique tensors", "unique GB", "ratio"):
        table.add_column(col, justify="left" if col in ("model", "part") else "right", overflow="fold")
    for r in rows:
        table.add_row(
            r.model,
            "total",
            str(r.rank),
            f"{r.public_tensors:,}",
            f"{r.public_bytes / GB:.3f}",
            f"{r.unique_tensors:,}",
            f"{r.unique_bytes / GB:.3f}",
            f"{r.dedup_ratio:.1f}x" if r.unique_bytes else "-",
        )
        if by_kind:
            for kind, (pn, pb, un, ub) in r.by_kind.items():
                table.add_row(
                    "",
                    kind,
                    "",
                    f"{pn:,}",
                    f"{pb / GB:.3f}",
                    f"{un:,}",
                    f"{ub / GB:.3f}",
                    f"{pb / ub:.1f}x" if ub else "-",
                )
    console.print(table)
