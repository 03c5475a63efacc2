"""The tables and ratio lines of ``benchmarks/gpu_throughput.py``, and the records they print.

Split from the benchmark so that each file stays one job: this one formats, that one measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.lib import gpu_contenders as hf
from trainer.config import ModelConfig

MFU_GOAL = "goal >= 0.40 at 124M, >= 0.55 at 1.3B vs the datasheet"
RATIO_GOAL = "goal <= 1.02"
HF_SPEED_GOAL = "goal >= 1.10"
HF_MEMORY_GOAL = "goal <= 1.00"
CURVE_TOL = 0.05
"""Max |loss difference| (nats) between the old and new loss paths' curves that counts as bf16
noise: bf16 keeps 8 significant bits, ~0.4% of a loss of 5-10, and 200 steps let it compound."""
CONTENDERS = ("raw", "eager", "old", "hf", "curve")


@dataclass(frozen=True)
class Case:
    """One model row: the GPT's shape and its batch."""

    name: str
    model: ModelConfig
    seq_len: int
    batch: int
    """Sequences per optimizer step (one process)."""

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len


@dataclass(frozen=True)
class Side:
    """A contender measured beside the trainer: throughput and memory."""

    tokens_per_s: float
    peak_gb: float | None
    micro_batch: int


@dataclass
class Row:
    """What one model measured."""

    case: Case
    n_params: int
    flops_per_token: float
    micro_batch: int
    step_s: float
    tokens_per_s: float
    mfu_datasheet: float | None
    mfu_matmul: float
    raw_ratio: float | None
    data_ratio: float
    compile_s: float | None
    compile_speedup: float | None
    peak_gb: float | None
    old: Side | None = None
    """The trainer with the old (full-logits) loss."""
    hf: Side | None = None
    """Hugging Face GPT-2."""
    curve: tuple[float, float] | None = None
    """Old vs new loss curve: max |difference|, |difference| of the last 10% means."""


@dataclass(frozen=True)
class Settings:
    """How to measure: from the command line."""

    compile: bool
    steps: int
    repeats: int
    warmup: int
    peak_flops: float
    datasheet_flops: float | None
    skip: frozenset[str] = frozenset()
    curve_steps: int = 0
    micro: int | None = None


# ------------------------------------------------------------------------------------ output

COLUMNS = (
    ("model", "{:10s}"),
    ("N", "{:>8s}"),
    ("FLOP/tok", "{:>10s}"),
    ("tok/step", "{:>8s}"),
    ("micro", "{:>5s}"),
    ("step ms", "{:>9s}"),
    ("tok/s", "{:>10s}"),
    ("TFLOP/s", "{:>8s}"),
    ("MFU sheet", "{:>9s}"),
    ("MFU mm", "{:>7s}"),
    ("raw", "{:>6s}"),
    ("data", "{:>6s}"),
    ("compile s", "{:>9s}"),
    ("speedup", "{:>7s}"),
    ("peak GB", "{:>7s}"),
)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_row(cells: list[str]) -> str:
    return " ".join(f.format(c) for (_, f), c in zip(COLUMNS, cells, strict=True))


def row_cells(row: Row) -> list[str]:
    return [
        row.case.name,
        f"{row.n_params / 1e6:.1f}M",
        f"{row.flops_per_token:.4e}",
        str(row.case.tokens_per_step),
        str(row.micro_batch),
        f"{row.step_s * 1e3:.2f}",
        f"{row.tokens_per_s:.0f}",
        f"{row.tokens_per_s * row.flops_per_token / 1e12:.4g}",
        _fmt(row.mfu_datasheet, ".3f"),
        f"{row.mfu_matmul:.3f}",
        _fmt(row.raw_ratio, ".3f"),
        f"{row.data_ratio:.3f}",
        _fmt(row.compile_s, ".1f"),
        _fmt(row.compile_speedup, ".2f"),
        _fmt(row.peak_gb, ".1f"),
    ]


HF_COLUMNS = (
    ("model", "{:10s}"),
    ("tok/s", "{:>10s}"),
    ("old tok/s", "{:>10s}"),
    ("HF tok/s", "{:>10s}"),
    ("vs old", "{:>6s}"),
    ("vs HF", "{:>6s}"),
    ("micro o/old/HF", "{:>14s}"),
    ("GB", "{:>6s}"),
    ("old GB", "{:>6s}"),
    ("HF GB", "{:>6s}"),
    ("GB vs HF", "{:>8s}"),
    ("MFU", "{:>6s}"),
    ("HF MFU", "{:>6s}"),
    ("curve max", "{:>9s}"),
    ("curve end", "{:>9s}"),
)


def format_hf_row(cells: list[str]) -> str:
    return " ".join(f.format(c) for (_, f), c in zip(HF_COLUMNS, cells, strict=True))


def _get(side: Side | None, attr: str) -> float | None:
    value: float | None = None if side is None else getattr(side, attr)
    return value


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def hf_cells(row: Row) -> list[str]:
    """The comparison row: the trainer (new loss) against its old loss and Hugging Face."""
    old, hf_side = row.old, row.hf
    mfu = row.mfu_datasheet if row.mfu_datasheet is not None else row.mfu_matmul
    hf_mfu = None if hf_side is None else mfu * hf_side.tokens_per_s / row.tokens_per_s
    micros = "/".join(str(x.micro_batch) if x else "-" for x in (row, old, hf_side))
    return [
        row.case.name,
        f"{row.tokens_per_s:.0f}",
        _fmt(_get(old, "tokens_per_s"), ".0f"),
        _fmt(_get(hf_side, "tokens_per_s"), ".0f"),
        _fmt(_ratio(row.tokens_per_s, _get(old, "tokens_per_s")), ".3f"),
        _fmt(_ratio(row.tokens_per_s, _get(hf_side, "tokens_per_s")), ".3f"),
        micros,
        _fmt(row.peak_gb, ".1f"),
        _fmt(_get(old, "peak_gb"), ".1f"),
        _fmt(_get(hf_side, "peak_gb"), ".1f"),
        _fmt(_ratio(row.peak_gb, _get(hf_side, "peak_gb")), ".3f"),
        f"{mfu:.3f}",
        _fmt(hf_mfu, ".3f"),
        _fmt(row.curve and row.curve[0], ".2e"),
        _fmt(row.curve and row.curve[1], ".2e"),
    ]


def print_summary(rows: list[Row], s: Settings, *, cuda: bool, tiny: bool) -> int:
    """The comparison table and the ratio lines, the headline last; 1 if loss curves differ."""
    print(format_hf_row([c for c, _ in HF_COLUMNS]))
    for row in rows:
        print(format_hf_row(hf_cells(row)))
    print(
        "vs old / vs HF = tok/s over the old loss's / Hugging Face GPT-2's; micro o/old/HF = "
        "micro-batches used; GB vs HF = peak memory over HF's; MFU = vs the datasheet peak "
        "(the measured matmul on the CPU); curve max / end = max |new - old loss| over the "
        "curve / between the means of its last 10%"
    )
    if "hf" not in s.skip and (reason := hf.hf_unavailable()) is not None:
        print(f"hf: skipped: {reason}")
    failed = False
    for row in rows:
        if row.curve is not None:
            ok = row.curve[0] <= CURVE_TOL
            failed |= not ok
            print(
                f"loss curve ({row.case.name}, {s.curve_steps} steps): max |new - old| "
                f"{row.curve[0]:.4f}, last-10% means differ by {row.curve[1]:.4f} "
                f"(goal <= {CURVE_TOL}){'' if ok else ': LOSS CURVES DIFFER'}"
            )
    largest = max(rows, key=lambda r: r.n_params)
    where = "cpu tiny config" if not cuda else ("tiny config" if tiny else largest.case.name)
    if largest.mfu_datasheet is not None:
        print(f"mfu vs datasheet ({where}): {largest.mfu_datasheet:.3f}")
    if largest.raw_ratio is not None:
        print(f"raw-loop ratio ({where}): {largest.raw_ratio:.3f} ({RATIO_GOAL})")
    print(f"data-path ratio ({where}): {largest.data_ratio:.3f} ({RATIO_GOAL})")
    suffix = f" ({where})" if tiny else ""
    mfu_line = f"gpu_throughput mfu_ratio: {largest.mfu_matmul:.3f} ({MFU_GOAL}){suffix}"
    against = [r for r in rows if r.hf is not None]
    if not against:
        print(mfu_line)
        return int(failed)
    print(mfu_line)
    memory = [(r.peak_gb / r.hf.peak_gb, r) for r in against if r.hf and r.peak_gb and r.hf.peak_gb]
    if memory:
        m, r = max(memory, key=lambda p: p[0])
        print(f"gpu_throughput hf_memory_ratio: {m:.3f} (worst: {r.case.name}; {HF_MEMORY_GOAL})")
    speed, r = min(
        ((r.tokens_per_s / r.hf.tokens_per_s, r) for r in against if r.hf), key=lambda p: p[0]
    )
    print(f"gpu_throughput hf_speed_ratio: {speed:.3f} (worst: {r.case.name}; {HF_SPEED_GOAL})")
    return int(failed)
