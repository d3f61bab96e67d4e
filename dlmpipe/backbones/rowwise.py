"""Row-invariant CPU primitives: a row's result never depends on what else shares its call.

Why: a sparse or cached update (SPA-Cache's selected rows, Archer's response rows), a batch of 8
slots and a single sample compute the same row in calls of different sizes, and the exactness
claims (a cache at its degenerate setting equals full recompute, SPA at any budget on an
unchanged sequence returns the full forward's logits) and batch invariance need the same bits
for it in every one of them (docs/ARCHITECTURE.md, "Row invariance").

How, by construction rather than by one CPU's kernels:
- matrix products (``linear``, ``matmul_rows``) and the RMS statistic of a norm run over a call's
  rows in calls of one fixed shape: chunks of ``R`` rows, the last zero-padded. A BLAS picks its
  algorithm by the call's shape (MKL computes 1-3 rows with a GEMV-like kernel, splits rows among
  threads by the row count, and its AVX2 path rounds the rows of a 6-row tile's remainder
  differently: measured), so one shape means one algorithm for every row. A call may also use a
  few other shapes, multiples of ``R`` for many rows (``CALL_MULTIPLES``) and any size below
  ``R`` for a call of fewer rows or a call's last few rows, each only where it is checked to give
  every row the bits of ``R``-row calls (``_ladder``): fewer, faster calls, less padding (26
  rows compute 26, not a padded 32: a batch-1 decode's calls are mostly so);
- attention runs its query rows in chunks of ``Q`` (SDPA's CPU kernel blocks queries by the
  query count and computes a block's last 1-2 rows with another GEMM), fewer rows in one call of
  their size where it is checked likewise;
- element-wise transcendental functions (SiLU, sigmoid, RoPE's cos/sin) run single-threaded over
  a flat input padded to a multiple of 64 in calls of at most ``ELEMENT_CHUNK``: ATen computes a
  call's (and each thread's share's) tail of ``numel % vector width`` elements with the scalar
  function, which rounds differently from the vector one.
A fixed shape leaves one thing to the kernel: whether the rows *within* a call are computed
alike (a kernel's row tiles). GEMM, reduction and attention kernels are data-oblivious (which
operations run depends on shapes, never on values), so this is checked once per process, shape
and thread count (``_chunk``): random rows, then the same rows shifted by one position, must give
the same bits row for row. The first chunk size in the candidates that passes is used; where
none does, chunks of one row, which are the same call for every row whatever the kernel.
Training (autograd, ``plain_ops``) and other devices take the plain ops: nothing there claims
bit-exactness.
What is guaranteed, then: on one machine, at one thread count, a row's bits are a function of the
row alone. Across machines and thread counts kernels differ; docs/ARCHITECTURE.md says what
holds there.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

#: row-chunk sizes tried for matrix products and norms, preferred first: 32 balances a small
#: call's padding against a large call's many calls (benchmarks/bench_row_chunks.py: the toy's
#: decodes 1.3-1.6x the plain ops' time at 32, 1.4-1.8x at 16 or 64); 48 and 24 where MKL's AVX2
#: branch rounds a 32-row call's remainder tile differently
ROW_CHUNKS = (32, 48, 24, 64, 16)
#: query-chunk sizes tried for attention (SDPA's CPU kernel blocks queries by 32 below 192)
QUERY_CHUNKS = (32, 24, 16)
#: elements per call of an element-wise function: a multiple of the widest vector loop (AVX-512's
#: two 16-float vectors; 64) and below ATen's parallel grain (32768), so no call is split among
#: threads or has a scalar tail
ELEMENT_CHUNK = 16384

#: larger calls for products and norms of many rows, as multiples of their chunk size ``R``,
#: tried largest first: used only where ``_ladder`` finds that a call of that many rows computes
#: every row with the bits of ``R``-row calls (so a row's bits stay a function of the row alone);
#: a call's rows go greedily into the largest that fit, the rest into ``R``-row calls. 320 rows
#: through the toy's 128 x 384 product on one Zen 3 core: ten 32-row calls 505 us, 256 + two 32
#: 392 us, bit for bit the same (issue 46)
CALL_MULTIPLES = (16, 8, 4, 2)
#: what one more call costs in multiply-adds (``_spans`` weighs calls against padded rows): about
#: 4 us of glue around a product (slices, the call) at one core's ~30 G multiply-adds a second
CALL_MACS = 120_000

_chosen: dict[tuple, int] = {}  # (kind, shape key, threads) -> chunk size
_ladders: dict[tuple, tuple[int, ...]] = {}  # (kind, shape key, R, threads) -> other call sizes
_layouts: dict[tuple, tuple] = {}  # (rows, R, other sizes) -> a call's spans (``_spans``)
_perturbation: list = []  # [(eps, generator)] while ``perturbed`` is active
_plain: list = []  # non-empty inside ``plain_ops``


@contextmanager
def plain_ops():
    """The plain ops inside the block (training: train_toy's batches are never compared row by
    row, and its recorded bits are the plain ops')."""
    _plain.append(True)
    try:
        yield
    finally:
        _plain.pop()


@contextmanager
def perturbed(eps: float, seed: int):
    """Every CPU projection's output times ``1 + eps * N(0, 1)`` (seeded) inside the block: a
    stand-in for another machine's kernels, whose rounding differs in the last bits of every
    product, far larger than they are. A decode whose tokens change under it hangs on a near tie
    (docs/ARCHITECTURE.md, "The same evidence on every machine"; tests/toy_expected.py)."""
    _perturbation.append((eps, torch.Generator().manual_seed(seed)))
    try:
        yield
    finally:
        _perturbation.pop()


def exact_path(x: Tensor) -> bool:
    """Whether ``x`` takes the row-invariant path: CPU inference outside a compile trace."""
    return (x.is_cpu and not x.requires_grad and not _plain
            and not torch.compiler.is_compiling())


def chunk_sizes() -> dict[tuple, int]:
    """The chunk sizes chosen so far in this process (kind, shape, threads -> size): for reports."""
    return dict(_chosen)


def call_sizes() -> dict[tuple, tuple[int, ...]]:
    """The other call sizes found so far (kind, shape, chunk size, threads -> sizes)."""
    return dict(_ladders)


def _chunk(kind: str, key: tuple, candidates: tuple[int, ...], probe, *args) -> int:
    """The first of ``candidates`` at which ``probe(n, generator, *args)`` (``n`` random rows
    through the kernel, then the same rows shifted by one place) computes every position alike,
    else 1. Called on every primitive call: the probe runs only the first time per key."""
    memo = (kind, key, torch.get_num_threads())
    chosen = _chosen.get(memo)
    if chosen is not None:
        return chosen
    run = lambda n, gen: probe(n, gen, *args)  # noqa: E731
    # outside any dispatch mode (a host-sync counter, a FLOP counter): the probe is this
    # process's one-time check, not the step's work
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        _chosen[memo] = next((n for n in candidates if _position_invariant(run, n)), 1)
    if _chosen[memo] == 1:  # invariant still, but slow: say so once per shape
        warnings.warn(f"dlmpipe: this machine's {kind} kernel computes rows differently by their "
                      f"place in every call size tried {candidates} (shape {key}, {memo[2]} "
                      "threads): one-row calls, row-invariant but slower (rowwise.py)", stacklevel=3)
    return _chosen[memo]


def _ladder(kind: str, key: tuple, r: int, probe, *args, multiples: tuple[int, ...] = CALL_MULTIPLES) -> tuple[int, ...]:
    """The call sizes other than ``r`` (``multiples`` of it, largest first, then every size below
    it, largest first; a size that fails leaves its rows to the next size up that passes: on a
    Zen 3, MKL's 1- to 3-row products, its GEMV-like kernel) at which one call gives every row
    the bits that ``r``-row calls give it, on two draws of random rows (``_matching_sizes`` with
    ``probe(rows, generator, *args)`` -> (rows, op)): data-oblivious kernels (module docstring)
    then compute any rows so. None (``()``) where ``r`` is 1, the fallback of kernels that
    compute rows by their place. Checked once per key, ``r`` and thread count, as ``_chunk``."""
    memo = (kind, key, r, torch.get_num_threads())
    sizes = _ladders.get(memo)
    if sizes is not None:
        return sizes
    from torch.utils._python_dispatch import _disable_current_modes

    candidates = [m * r for m in multiples] + list(range(r - 1, 0, -1))
    with _disable_current_modes():
        sizes = () if r == 1 else _matching_sizes(candidates, r, lambda n, gen: probe(n, gen, *args))
    _ladders[memo] = sizes
    return sizes


def _matching_sizes(candidates: list[int], r: int, draw) -> tuple[int, ...]:
    """The ``candidates`` whose one call over rows of ``draw(rows, generator)`` -> (rows, op)
    gives each row the bits of ``op`` over the same rows in ``r``-row calls: a larger size from
    the first row, a smaller one from the first row and from the ``r``-th (another alignment),
    on two draws; one draw serves every size, so a product's random weight is made twice, not
    twice per size."""
    rows = max(max(candidates), 2 * r)
    rows += -rows % r
    passing = list(candidates)
    for seed in (0, 1):
        a, op = draw(rows, torch.Generator().manual_seed(seed))
        chunked = torch.cat([op(a[lo:lo + r]) for lo in range(0, rows, r)])
        passing = [s for s in passing
                   if all(torch.equal(op(a[lo:lo + s]), chunked[lo:lo + s]) for lo in ((0, r) if s < r else (0,)))]
    return tuple(passing)


def _spans(rows: int, r: int, sizes: tuple[int, ...], call_rows: int) -> tuple[tuple[int, int], ...]:
    """``(lo, hi)`` of the calls over ``rows`` rows (the last ``hi``: the row count with the zero
    rows that pad the last call), in ``r`` and the checked ``sizes`` (``_ladder``), the cheapest
    of three layouts when a call costs ``call_rows`` rows' compute: whole chunks in the largest
    sizes that fit, the rest in the smallest size that holds it; one call of the smallest size
    that holds every row; the rows padded to whole chunks in the largest sizes that fit. Kept
    per ``(rows, r, sizes, call_rows)``."""
    memo = (rows, r, sizes, call_rows)
    spans = _layouts.get(memo)
    if spans is None:
        larger = tuple(s for s in sizes if s > r) + (r,)

        def whole_chunks(total: int) -> list[tuple[int, int]]:
            out, lo = [], 0
            for size in larger:
                while total - lo >= size:
                    out.append((lo, lo + size))
                    lo += size
            return out

        whole = rows - rows % r
        split = whole_chunks(whole)
        if rows > whole:
            split.append((whole, whole + min(s for s in sizes + (r,) if rows - whole <= s <= r)))
        one = [(0, s) for s in sorted(sizes + (r,)) if s >= rows][:1]
        padded = whole_chunks(-(-rows // r) * r)
        # ties: the fewest calls
        spans = min(filter(None, (one, padded, split)), key=lambda c: len(c) * call_rows + c[-1][1])
        spans = _layouts[memo] = tuple(spans)
    return spans


def _as_is(x: Tensor, spans: tuple[tuple[int, int], ...], rows: int) -> bool:
    """Whether a call takes ``x`` as it is: one call of exactly its ``rows`` (no padding) over a
    contiguous input of two or more dimensions, which ATen views as the [rows, last] matrix in
    C++ and computes with the kernel call of that 2-d shape (a 1-d input would take another)."""
    return len(spans) == 1 and spans[0][1] == rows and x.dim() > 1 and x.is_contiguous()


def _position_invariant(run, n: int) -> bool:
    gen = torch.Generator().manual_seed(n)
    for _ in range(2):
        plain, shifted = run(n, gen)
        if not torch.equal(shifted, torch.roll(plain, 1, dims=0)):
            return False
    return True


# ---- matrix products ----------------------------------------------------------------------
def linear(proj, x: Tensor) -> Tensor:
    """``proj(x)`` for an ``nn.Linear`` over rows ``x [..., K]``, row-invariant on the CPU."""
    return matmul_rows(x, proj.weight, proj.bias)


def matmul_rows(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` (``weight [N, K]``) with every row computed in a call of
    ``R`` rows, or of a size checked to give the same bits (module docstring). The toy's decodes
    make hundreds of thousands of these calls of a few microseconds each, so the glue around the
    products is kept to the few ops it needs: a call of one span is one padded product."""
    if not exact_path(x) or weight.requires_grad and torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    k, n = x.shape[-1], weight.shape[0]
    rows = x.numel() // k if k else 0
    if rows == 0:
        return F.linear(x, weight, bias)
    key = (k, n, bias is not None, x.dtype, weight.dtype)
    r = _chunk("linear", key, ROW_CHUNKS, _linear_probe, x, weight, bias)
    spans = _spans(rows, r, _ladder("linear", key, r, _linear_rows, x, weight, bias),
                   -(-CALL_MACS // (k * n)))
    total = spans[-1][1]
    if _as_is(x, spans, rows):
        out = _gemm(x, weight, bias)  # (F.linear: ATen's mm / addmm of x's 2-d view, see _gemm)
        if _perturbation:
            _perturb(out)
        return out
    flat = x.reshape(-1, k)
    padded = _pad_rows(flat, total)
    if len(spans) == 1:
        out = _gemm(padded, weight, bias)
    else:
        out = padded.new_empty(total, n, dtype=flat.dtype if flat.dtype == weight.dtype
                               else torch.result_type(flat, weight))
        wt = weight.t()
        for lo, hi in spans:
            _gemm(padded[lo:hi], weight, bias, out[lo:hi], wt)
    if _perturbation:
        _perturb(out)
    # (a view to unpacked sizes: parsing a torch.Size argument costs a microsecond more a call)
    return (out if total == rows else out[:rows]).view(*x.shape[:-1], n)


def _perturb(out: Tensor) -> None:
    eps, gen = _perturbation[-1]
    out.mul_(1 + eps * torch.randn(out.shape, generator=gen, dtype=out.dtype))


def _gemm(a: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor | None = None,
          wt: Tensor | None = None) -> Tensor:
    """One call's product of ``a``, ``a @ weight.T (+ bias)``: ``F.linear``, which is ATen's
    ``mm`` / ``addmm`` of ``weight.t()`` (transposed in C++, not by a dispatch from here) over
    ``a``'s rows as one 2-d matrix: a contiguous input of more dimensions is viewed so in C++,
    the same kernel call on the same 2-d shape (tests/test_row_invariance.py checks the calls it
    reaches); or those into ``out`` (2-d; ``wt``: ``weight.t()``, made once for a call's spans)."""
    if out is None:
        return F.linear(a, weight, bias)
    wt = weight.t() if wt is None else wt
    return torch.mm(a, wt, out=out) if bias is None else torch.addmm(bias, a, wt, out=out)


def _linear_probe(r: int, gen: torch.Generator, x: Tensor, weight: Tensor, bias: Tensor | None):
    """``_chunk``'s run for ``matmul_rows``: ``r`` random rows through a random weight of
    ``weight``'s shape and dtype, then the same rows shifted by one."""
    a, w, b = _random_operands(r, gen, x, weight, bias)
    outs = [torch.empty(r, w.shape[0], dtype=x.dtype) for _ in range(2)]
    for src, out in zip((a, torch.roll(a, 1, dims=0)), outs):
        _gemm(src, w, b, out)
    return outs


def _random_operands(rows: int, gen: torch.Generator, x: Tensor, weight: Tensor, bias: Tensor | None):
    """The probes' ``rows`` random rows, weight and bias, of the call's dtypes."""
    w = torch.randn(weight.shape, generator=gen, dtype=torch.float32).to(weight.dtype)
    b = None if bias is None else torch.randn(weight.shape[0], generator=gen).to(bias.dtype)
    return torch.randn(rows, x.shape[-1], generator=gen).to(x.dtype), w, b


def _linear_rows(rows: int, gen: torch.Generator, x: Tensor, weight: Tensor, bias: Tensor | None):
    """``_ladder``'s draw for ``matmul_rows``: ``rows`` random rows and the product through a
    random weight of ``weight``'s shape and dtype."""
    a, w, b = _random_operands(rows, gen, x, weight, bias)
    return a, lambda block: _gemm(block, w, b)


def _pad_rows(flat: Tensor, total: int) -> Tensor:
    """``flat`` with zero rows up to ``total``, contiguous (one op)."""
    pad = total - flat.shape[0]
    return torch.constant_pad_nd(flat, (0, 0, 0, pad)) if pad else flat.contiguous()


# ---- norms --------------------------------------------------------------------------------
def mean_square(x32: Tensor) -> Tensor:
    """``x32.pow(2).mean(-1, keepdim=True)`` of float32 rows, each row's in a call of ``R`` rows."""
    if not exact_path(x32):
        return x32.pow(2).mean(-1, keepdim=True)
    d = x32.shape[-1]
    rows = x32.numel() // d if d else 0
    if rows == 0:
        return x32.pow(2).mean(-1, keepdim=True)
    r = _chunk("mean_square", (d,), ROW_CHUNKS, _mean_square_probe, d)
    spans = _spans(rows, r, _ladder("mean_square", (d,), r, _mean_square_rows, d),
                   -(-CALL_MACS // d))
    total = spans[-1][1]
    if _as_is(x32, spans, rows):  # (the reduction over [rows, d]: its dimensions coalesce)
        return torch.mean(x32.pow(2), -1, keepdim=True)
    flat = x32.reshape(-1, d)
    padded = _pad_rows(flat, total)
    if len(spans) == 1:
        out = torch.mean(padded.pow(2), -1, keepdim=True)
    else:
        out = padded.new_empty(total, 1)
        for lo, hi in spans:
            torch.mean(padded[lo:hi].pow(2), -1, keepdim=True, out=out[lo:hi])
    return (out if total == rows else out[:rows]).view(*x32.shape[:-1], 1)


def _mean_square_probe(r: int, gen: torch.Generator, d: int):
    a = torch.randn(r, d, generator=gen)
    return [a.pow(2).mean(-1, keepdim=True), torch.roll(a, 1, dims=0).pow(2).mean(-1, keepdim=True)]


def _mean_square_rows(rows: int, gen: torch.Generator, d: int):
    """``_ladder``'s draw for ``mean_square``: ``rows`` random rows and the statistic."""
    return torch.randn(rows, d, generator=gen), lambda block: torch.mean(block.pow(2), -1, keepdim=True)


# ---- attention ----------------------------------------------------------------------------
def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, enable_gqa: bool) -> Tensor:
    """SDPA of ``q [B, H, Tq, hd]`` over ``k, v [B, Hkv, Tk, hd]`` (``mask`` bool ``[Tq, Tk]`` or
    None), the query rows in calls of ``Q`` rows, the last few in one call of their own size
    where ``_ladder`` checked it, else padded (padded rows attend to every key and are
    dropped); ``[B, H, Tq, hd]``."""
    if not exact_path(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)
    if mask is not None and (mask.dim() != 2 or mask.dtype != torch.bool):
        raise ValueError(f"rowwise.attend: a mask is bool [Tq, Tk] (Backbone.attention_mask); got "
                         f"{mask.dtype} {tuple(mask.shape)}, whose rows the query chunks cannot split")
    b, h, tq, hd = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if tq == 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)

    masked = mask is not None
    key = (h, hkv, hd, tk, masked, q.dtype)
    n = _chunk("attend", key, QUERY_CHUNKS, _attend_probe, q, k, masked, enable_gqa)
    sizes = _ladder("attend", key, n, _attend_rows, q, k, masked, enable_gqa, multiples=())
    spans = _spans(tq, n, sizes, -(-CALL_MACS // (2 * h * tk * hd)))
    pad = spans[-1][1] - tq
    if pad:
        q = torch.cat([q, q.new_zeros(b, h, pad, hd)], dim=2)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(pad, tk)])
    if len(spans) == 1:  # one call
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)
        return out[:, :, :tq] if pad else out
    out = q.new_empty(b, h, tq + pad, hd)
    for lo, hi in spans:
        out[:, :, lo:hi] = F.scaled_dot_product_attention(
            q[:, :, lo:hi], k, v, attn_mask=None if mask is None else mask[lo:hi],
            enable_gqa=enable_gqa)
    return out[:, :, :tq] if pad else out


def _random_attention(rows: int, gen: torch.Generator, q: Tensor, k: Tensor, masked: bool):
    """The attention probes' operands: ``rows`` random query rows of ``q``'s heads and dtype, random
    keys and values of ``k``'s shape, and random mask rows (each sees its first key) or None."""
    h, hd = q.shape[1], q.shape[3]
    hkv, tk = k.shape[1], k.shape[2]
    qs = torch.randn(1, h, rows, hd, generator=gen).to(q.dtype)
    ks, vs = (torch.randn(1, hkv, tk, hd, generator=gen).to(k.dtype) for _ in range(2))
    m = None
    if masked:
        m = torch.rand(rows, tk, generator=gen) < 0.7
        m[:, 0] = True
    return qs, ks, vs, m


def _attend_rows(rows: int, gen: torch.Generator, q: Tensor, k: Tensor, masked: bool, enable_gqa: bool):
    """``_ladder``'s draw for ``attend``: ``rows`` random query rows (and mask rows) over random
    keys of ``k``'s shape, as row indices, and the attention of a run of them (rows first)."""
    qs, ks, vs, m = _random_attention(rows, gen, q, k, masked)

    def op(index: Tensor) -> Tensor:
        lo, hi = int(index[0]), int(index[-1]) + 1
        o = F.scaled_dot_product_attention(qs[:, :, lo:hi], ks, vs, enable_gqa=enable_gqa,
                                           attn_mask=None if m is None else m[lo:hi])
        return o[0].transpose(0, 1)

    return torch.arange(rows), op


def _attend_probe(n: int, gen: torch.Generator, q: Tensor, k: Tensor, masked: bool, enable_gqa: bool):
    """``_chunk``'s run for ``attend``: ``n`` random query rows (and mask rows) over random keys
    of ``k``'s shape, then the same rows shifted by one; rows first, ``[n, h, hd]``."""
    qs, ks, vs, m = _random_attention(n, gen, q, k, masked)
    outs = []
    for shift in (0, 1):
        mm = None if m is None else torch.roll(m, shift, dims=0)
        o = F.scaled_dot_product_attention(torch.roll(qs, shift, dims=2), ks, vs, attn_mask=mm,
                                           enable_gqa=enable_gqa)
        outs.append(o[0].transpose(0, 1))  # rows first: [n, h, hd]
    return outs


# ---- element-wise functions ---------------------------------------------------------------
def silu(x: Tensor) -> Tensor:
    """``F.silu(x)``, element-invariant on the CPU (module docstring)."""
    return _elementwise(x, F.silu, torch.ops.aten.silu.out)


def sigmoid(x: Tensor) -> Tensor:
    """``torch.sigmoid(x)``, element-invariant on the CPU (MoE routers' scores)."""
    return _elementwise(x, torch.sigmoid, torch.ops.aten.sigmoid.out)


def cos(x: Tensor) -> Tensor:
    """``torch.cos(x)``, element-invariant on the CPU (RoPE tables at explicit positions)."""
    return _elementwise(x, torch.cos, torch.ops.aten.cos.out)


def sin(x: Tensor) -> Tensor:
    """``torch.sin(x)``, element-invariant on the CPU."""
    return _elementwise(x, torch.sin, torch.ops.aten.sin.out)


def _elementwise(x: Tensor, op, op_out) -> Tensor:
    n = x.numel()
    if not exact_path(x) or n == 0:
        return op(x)
    if n % 64 == 0 and n <= ELEMENT_CHUNK and x.is_contiguous():
        return op(x)  # one chunk already: a single-threaded call, every element on the vector path
    flat = x.reshape(-1)
    if n % 64:
        flat = torch.cat([flat, flat.new_zeros(-n % 64)])
    out = torch.empty_like(flat)
    for lo in range(0, flat.numel(), ELEMENT_CHUNK):
        op_out(flat[lo:lo + ELEMENT_CHUNK], out=out[lo:lo + ELEMENT_CHUNK])
    return out[:n].view(*x.shape)
