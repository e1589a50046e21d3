"""Launch shapes of the Triton/Gluon sparse MLA attention kernel: a table of measured rules.

Each Rule says where it applies (kernel, KV source, head count, d_qk), the launch shape it
gives, and the A/B measurement that chose it (`chose`: the sweep files, under results/ unless
named otherwise; a per-run sweep script, since removed (de8a158), ran them on an H100).
`config_for` takes the first rule that fits, so within a (kernel, source) group the rules run
from few heads to any.

The Gluon producer/consumer kernel (a GPU whose Triton has Gluon) takes the FP8 caches at
every head count and the bf16 rows of sparse prefill; narrow rules (up to 16 or 32 heads)
make the heads the wgmma's N, so none is padded to 64. Elsewhere the Triton kernel: BLOCK_H 64
runs the dots on wgmma, which beats mma.sync (BLOCK_H 16/32) by enough that padding a few
heads to 64 pays off where the keys cost most to read. Pipelining the Triton kernel's key loop
(tl.range(num_stages=2..4)) measured slower everywhere (results/sm90/triton-speed-h100/
NOTES.md), so num_stages stays as below. plan_attention drops `persist` when the (token, head
block) items fit in one wave, where a program an item takes 11-21% less time; above, resident
took 8-22% less, except 2-4% more at d_qk 512 and 2.5-3 items an SM (sweeps/ab-items.txt in
results/sm90/triton-gluon4-h100). At 64 heads every Gluon rule takes split_pv (FlashMLA's
split of the consumer work), the FP8 ones the L2 prefetch of the next block and the lead's
PV on 128 columns, and all but V4 decode (producer-bound) key_bias, the key mask from the
producer
(results/sm90/studies/triton-shapes/README.md: what won and what lost on issue 36's shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4bench.backends.triton.kernels.layout import LAYOUT_IDS

GLUON_H100 = "results/sm90/triton-gluon-h100/sweeps"
GLUON2 = "results/sm90/triton-gluon2-h100/sweeps"
GLUON3 = "results/sm90/triton-gluon3-h100/sweeps"
GLUON4 = "results/sm90/triton-gluon4-h100/sweeps"
SPEED = "results/sm90/triton-speed-h100/NOTES.md"
SHAPES = "results/sm90/studies/triton-shapes/sweeps"
GLUON_PRODUCER_WARPS = 4  # 8 would leave the consumers' wgmma too few registers (ptxas refuses)


@dataclass(frozen=True)
class Config:
    """Launch shape of the attention kernel (the combine kernel has its own fixed shape)."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    idx_ahead: bool = False  # the next key block's indices load during this block
    gluon: bool = False  # the Gluon producer/consumer kernel (sm90; 64-key blocks)
    chunk: int = 16  # gluon: keys the producer gathers at a time
    producer_regs: int = 96  # gluon: a producer thread's registers (setmaxnreg; alternate:
    # the consumers get half of the rest each, the producer what they leave)
    narrow: bool = False  # gluon: block_h (16/32) heads as the wgmma's N, keys as its M
    alternate: bool = False  # narrow: the consumer warpgroups take alternate key blocks
    async_fill: bool = False  # gluon, bf16 rows: the copies complete the full barrier
    pipe: int = 0  # gluon, V3.2 cache: chunks in flight ahead of the one stored (0: by blocks)
    persist: bool = False  # alternate, async_fill, one split: resident, tokens whole
    prefetch: int = 0  # gluon, not pipe or persist: L2 prefetch of the block this far ahead
    split_pv: bool = False  # gluon, 64 heads: one warpgroup's QK + softmax, PV split by columns
    key_bias: bool = False  # split_pv: the producer hands the lead each block's key mask
    lead_cols: int = 256  # split_pv: the lead's PV output columns (256 or 128), the rest the other


@dataclass(frozen=True)
class Rule:
    """Where a launch shape applies and the measurement that chose it."""

    gluon: bool  # the Gluon kernel (True) or the Triton one
    layout: str  # the KV source: "bf16" rows, the "v32" or "v4" FP8 cache
    max_heads: int | None  # up to this many query heads (None: any number)
    config: Config
    chose: str  # the A/B that chose it
    d_qk: int | None = None  # only at this d_qk (None: any)


def _gluon(block_h: int, **kw) -> Config:
    return Config(block_h, 64, 8, 1, gluon=True, **kw)


_RESIDENT = dict(idx_ahead=True, chunk=64, producer_regs=80, narrow=True, alternate=True,
                 async_fill=True, persist=True)  # fmt: skip
_RESIDENT_WHY = (
    f"resident up to 32 heads: 4-6% faster at V3.2's 8-32 heads, 9-17% at V4-Flash's "
    f"({GLUON4}/ab-persist-*.txt); alternate + async_fill: V3.2 prefill 8%/4%/6% at 8/16/32 "
    f"heads, V4 7% at 8 ({GLUON2}/breakdown-*.txt); the lean narrow softmax: V4 prefill 7%/3% "
    f"at 16/32 heads ({GLUON3}/ab-lean-*.txt)"
)
_WIDE_BF16 = dict(idx_ahead=True, split_pv=True, async_fill=True, key_bias=True)  # 64 heads
_TRITON_BF16_WHY = (
    f"bf16 rows up to 32 heads: BLOCK_H 16/32 (fewer heads padded in memory); idx_ahead up "
    f"to 12% faster, though 8 heads in unpadded rows lost 20% with it ({SPEED})"
)

RULES: tuple[Rule, ...] = (
    # ---- Gluon, the V3.2 cache
    Rule(
        True,
        "v32",
        16,
        _gluon(16, chunk=16, producer_regs=152, narrow=True, alternate=True, pipe=2),  # fmt: skip
        f"pipe 2 (two 16-key chunks in flight, 152 producer registers): 4-6% faster "
        f"({GLUON4}/ab-pipe-*.txt); alternate: decode 4% faster at 16 heads "
        f"({GLUON2}/breakdown-*.txt)",
    ),  # fmt: skip
    Rule(
        True,
        "v32",
        32,
        _gluon(32, chunk=64, producer_regs=120, narrow=True, alternate=True, prefetch=1),
        f"17-32 heads in a 32-head program: 3% ahead of the 64-head tile "
        f"({GLUON3}/ab-lean-*.txt); pipe lost 1-3% here ({GLUON4}/ab-pipe-*.txt); the next "
        f"block prefetched into L2: 3% faster, two blocks ahead 6% slower "
        f"({SHAPES}/ab-prefetch-2.txt)",
    ),  # fmt: skip
    Rule(
        True,
        "v32",
        None,
        _gluon(
            64,
            idx_ahead=True,
            chunk=64,
            producer_regs=120,
            prefetch=1,
            split_pv=True,
            key_bias=True,
            lead_cols=128,
        ),
        f"1.3-1.5x the Triton kernel on the FP8 caches; 64-key chunks (more loads in "
        f"flight) ({GLUON_H100}); the next block prefetched into L2: 6-10% faster at 128 heads "
        f"batch 32-64 ({SHAPES}/ab-prefetch-1.txt), with idx_ahead (6% slower without the "
        f"prefetch, {GLUON_H100}) 1-8% more ({SHAPES}/ab-prefetch-2.txt); split_pv (one "
        f"warpgroup's QK and softmax, PV split by columns): 5% faster ({SHAPES}/ab-split-pv-2.txt);"
        f" key_bias 6% faster at batch 128, 128 heads ({SHAPES}/ab-key-bias.txt); lead_cols 128 "
        f"1.8% more ({SHAPES}/ab-lead-cols.txt)",
    ),  # fmt: skip
    # ---- Gluon, the V4 cache
    Rule(
        True,
        "v4",
        16,
        _gluon(16, idx_ahead=True, chunk=32, producer_regs=96, narrow=True, prefetch=1),
        f"narrow: FP8 decode 1.02-1.05x the 64-head tile ({GLUON_H100}); alternate measured "
        f"the same on V4's cache ({GLUON2}/breakdown-*.txt); the next block prefetched into "
        f"L2: 11% faster at 8 and 16 heads ({SHAPES}/ab-prefetch-2.txt)",
    ),  # fmt: skip
    Rule(
        True,
        "v4",
        None,
        _gluon(
            64,
            idx_ahead=True,
            chunk=32,
            producer_regs=120,
            prefetch=1,
            split_pv=True,
            lead_cols=128,
        ),
        f"1.3-1.5x the Triton kernel; idx_ahead: V4 decode 8-10% faster; 32-key chunks "
        f"(V4's larger footprint spills at 64) ({GLUON_H100}); the next block prefetched into "
        f"L2: 5-9% faster at batch 32-128 and 32-128 heads, two ahead less "
        f"({SHAPES}/ab-prefetch-1.txt, ab-prefetch-2.txt); split_pv 2-3% faster, 2% slower at "
        f"MTP s_q 4 with 128 heads ({SHAPES}/ab-split-pv-2.txt); with it 120 producer "
        f"registers (the consumers 192) 4-5% faster at MTP ({SHAPES}/ab-split-pv-3.txt); "
        f"key_bias 1.4-4% slower (the producer bounds V4 decode: {SHAPES}/ab-key-bias.txt); "
        f"lead_cols 128 (the lead 160 registers, the other 224: no spills) 1.5-3.3% faster, "
        f"prefill 2-6% slower ({SHAPES}/ab-lead-cols.txt)",
    ),  # fmt: skip
    # ---- Gluon, bf16 rows (sparse prefill)
    Rule(True, "bf16", 16, _gluon(16, **_RESIDENT), _RESIDENT_WHY),
    Rule(True, "bf16", 32, _gluon(32, **_RESIDENT), _RESIDENT_WHY),
    Rule(
        True,
        "bf16",
        None,
        _gluon(64, chunk=64, producer_regs=56, **_WIDE_BF16),
        f"above 32 heads 1.2-1.6x the Triton kernel ({GLUON_H100}); copied by cp.async: "
        f"the chunk sets only the grouping; split_pv 11-13% faster ({SHAPES}/ab-split-pv-2.txt), "
        f"async_fill 3.5% more ({SHAPES}/ab-split-pv-3.txt), key_bias 1% more "
        f"({SHAPES}/ab-key-bias.txt), "
        f"an L2 prefetch of the next block 4-6% slower at 128 heads (the consumers bound it: "
        f"{SHAPES}/ab-prefetch-1.txt, parts-prefill.txt), resident 2-4% slower "
        f"({SHAPES}/ab-persist-wide.txt)",
        d_qk=576,
    ),  # fmt: skip
    Rule(
        True,
        "bf16",
        None,
        _gluon(64, chunk=16, producer_regs=96, **_WIDE_BF16),
        f"above 32 heads 1.2-1.6x the Triton kernel ({GLUON_H100}); copied by cp.async: "
        f"the chunk sets only the grouping; split_pv 17-19% faster ({SHAPES}/ab-split-pv-2.txt), "
        f"async_fill 0-1% more, 64-key chunks 7% less ({SHAPES}/ab-split-pv-3.txt), key_bias "
        f"1.3-2.7% more ({SHAPES}/ab-key-bias.txt), "
        f"resident 2-4% faster at 128 heads but not with split_pv ({SHAPES}/ab-persist-wide.txt)",
    ),  # fmt: skip
    # ---- Triton
    Rule(
        False,
        "v32",
        None,
        Config(64, 64, 8, 1),
        f"BLOCK_H 64 (wgmma) pays for padding at any head count on V3.2's cache; idx_ahead "
        f"5% slower there ({SPEED})",
    ),  # fmt: skip
    Rule(
        False,
        "v4",
        16,
        Config(16, 64, 4, 2),
        "up to 16 heads BLOCK_H 16 on V4's cache (sweep*.txt in results/sm90/triton-h100)",
    ),
    Rule(
        False,
        "v4",
        None,
        Config(64, 64, 8, 2, idx_ahead=True),
        f"above 16 heads BLOCK_H 64 on V4's cache; idx_ahead 5-9% faster ({SPEED})",
    ),
    Rule(False, "bf16", 16, Config(16, 64, 4, 2, idx_ahead=True), _TRITON_BF16_WHY),
    Rule(False, "bf16", 32, Config(32, 64, 4, 2, idx_ahead=True), _TRITON_BF16_WHY),
    Rule(
        False,
        "bf16",
        None,
        Config(64, 64, 8, 2, idx_ahead=True),
        f"above 32 heads BLOCK_H 64; idx_ahead up to 12% faster on bf16 rows ({SPEED})",
    ),
)


def rule_for(heads: int, layout: str, gluon: bool = False, d_qk: int = 576) -> Rule:
    """The first rule of RULES that fits."""
    for rule in RULES:
        if (
            rule.gluon == gluon
            and rule.layout == layout
            and (rule.max_heads is None or heads <= rule.max_heads)
            and (rule.d_qk is None or rule.d_qk == d_qk)
        ):
            return rule
    raise ValueError(f"no launch rule for {heads} heads on {layout!r} (gluon={gluon})")


def config_for(heads: int, layout: str, gluon: bool = False, d_qk: int = 576) -> Config:
    """The launch shape for `heads` query heads on `layout` ("bf16", "v32", "v4"), with the
    Gluon kernel when `gluon` (a GPU whose Triton has Gluon)."""
    return rule_for(heads, layout, gluon, d_qk).config


# ---- the Gluon kernel's launch options and constexprs ------------------------------------


def gluon_maxnreg() -> int:
    """The Gluon kernel's registers a thread at launch: 8 consumer + 4 producer warps share the
    register file (setmaxnreg then moves them: producer_regs, consumers the rest)."""
    return 65536 // (32 * (8 + GLUON_PRODUCER_WARPS)) // 8 * 8


def gluon_options(cfg: Config) -> dict:
    """The Gluon kernel's launch options: the warps of its default partition (both consumer
    warpgroups, or with `alternate` the producer), registers a thread at launch."""
    return {"num_warps": 4 if cfg.alternate or cfg.split_pv else 8, "maxnreg": gluon_maxnreg()}


def consumer_regs(producer_regs: int) -> int:
    """Registers a thread of each consumer partition with `alternate`: half of what
    producer_regs leave (the producer, the default partition, gets what they leave)."""
    return (65536 // 128 - producer_regs) // 2 // 8 * 8


def split_pv_regs(cfg: Config) -> tuple[int, int]:
    """Registers a thread of split_pv's lead and of the other consumer warpgroup: the halves of
    what the producer leaves, or with lead_cols 128 the other's 384 columns 224 and the lead the
    rest (160 beside a 120-register producer)."""
    both = consumer_regs(cfg.producer_regs)
    follow = both if cfg.lead_cols == 256 else 224
    return 2 * both - follow, follow


def gluon_meta(meta: dict, cfg: Config) -> dict:
    """The Gluon kernel's constexprs: the Triton kernel's less its fixed or absent ones."""
    heads_ok = cfg.block_h in ((16, 32) if cfg.narrow else (64,))
    bf16 = meta["LAYOUT"] == LAYOUT_IDS["bf16"]
    bad = (cfg.alternate and not cfg.narrow) or (cfg.async_fill and not bf16)
    v32 = meta["LAYOUT"] == LAYOUT_IDS["v32"]
    bad = bad or cfg.pipe not in (0, 1, 2) or (cfg.pipe and (not v32 or cfg.idx_ahead))
    bad = bad or (cfg.persist and not (cfg.alternate and cfg.async_fill and not meta["SPLIT"]))
    bad = bad or cfg.prefetch not in (0, 1, 2) or (cfg.prefetch and (cfg.pipe or cfg.persist))
    bad = bad or (cfg.split_pv and cfg.narrow)
    bad = bad or (cfg.key_bias and (not cfg.split_pv or cfg.pipe))  # the block-at-a-time producer
    bad = bad or cfg.lead_cols not in (128, 256) or (cfg.lead_cols != 256 and not cfg.split_pv)
    if meta["EXACT"] or cfg.block_n != 64 or not heads_ok or bad:
        raise ValueError(
            "the Gluon kernel runs on a GPU with 64-key blocks of 64 heads (16 or 32 narrow; "
            "alternate only narrow, async_fill only on bf16 rows, pipe 1 or 2 only on V3.2 "
            "records without idx_ahead, persist only alternate and async_fill with one split, "
            "prefetch 1 or 2 blocks ahead without pipe or persist, split_pv on 64 heads, "
            "key_bias (not with pipe) and lead_cols 128 with split_pv), "
            f"not {cfg}"
        )
    lead_regs, follow_regs = split_pv_regs(cfg)
    drop = ("BLOCK_H", "BLOCK_N", "EXACT")
    kept = {k: v for k, v in meta.items() if k not in drop}
    return kept | {
        "CHUNK": cfg.chunk,
        "PRODUCER_WARPS": GLUON_PRODUCER_WARPS,
        "PRODUCER_REGS": cfg.producer_regs,
        "NARROW": cfg.narrow,
        "IDX_AHEAD": cfg.idx_ahead,
        "NH": cfg.block_h if cfg.narrow else 16,
        "ALTERNATE": cfg.alternate,
        "ASYNC_FILL": cfg.async_fill,
        "PIPE": cfg.pipe,
        "PERSIST": cfg.persist,
        "PREFETCH": cfg.prefetch,
        "SPLIT_PV": cfg.split_pv,
        "KEY_BIAS": cfg.key_bias,
        "LEAD_COLS": cfg.lead_cols,
        "LEAD_REGS": lead_regs,
        "FOLLOW_REGS": follow_regs,
        "CONSUMER_REGS": consumer_regs(cfg.producer_regs),
    }
