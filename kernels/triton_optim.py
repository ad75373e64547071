"""Triton multi-tensor AdamW and LAMB steps (CUDA; runs under TRITON_INTERPRET=1 for tests).

One launch covers every tensor of a bucket: a chunk table maps each program to (tensor, start),
and a pointer table holds each tensor's data pointers (loaded and cast to pointers in the kernel),
as apex's multi_tensor_apply does with its chunk metadata. Per-tensor scalars (bias corrections,
step sizes) travel as one packed [n_tensors, 2] float32 array per step. LAMB takes three launches:
stage 1 (m, v, and per-chunk squared norms of p and of the update), a deterministic per-tensor sum
of the partials (fp64 cumulative sums), stage 2 (recompute the update, apply lr * ratio).

Aligned fast path: when every data pointer of the bucket is 16-byte aligned (ALIGNED=True), a chunk
that lies wholly inside its tensor loads and stores without a mask through pointers hinted as
16-byte aligned, so the compiler emits 128-bit accesses; only a tensor's tail chunk is masked.
With ALIGNED=False the choice is made per tensor: the pointer table's sixth column says whether
all of that tensor's pointers are aligned (a bucket with one odd view, e.g. DDP's gradient bucket
views after a 3-element bias, keeps the fast path for the others), and the rest take the masked
path, correct for any alignment. All paths compute the same fp32 math in the same order, so
results are bit-identical between them.

Tables are cached across steps (bounded LRU, keyed on exactly what they hold: the chunk table on
the numels, the pointer table and the ALIGNED flag on every list's data pointers, both with the
device and the CUDA stream), so a steady-state step copies one small scalar array host->device
(pinned, non-blocking on CUDA) per launch group, and launches.

Step counters stay on the host (as torch.optim keeps them for non-capturable optimizers).
"""
from __future__ import annotations

import array
import math
import threading
from collections import OrderedDict
from typing import Callable, Hashable, Iterable, Sequence

import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements per program
ALIGN_BYTES = 16  # one 128-bit access
SLOTS = 6  # pointer-table columns: param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, all-aligned flag
CACHE_ENTRIES = 8  # per table kind: buckets (dtype x param group) a training loop cycles through

_DT = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _chunk(chunk_t, chunk_s, numels, BLOCK: tl.constexpr):
    """This program's (chunk, tensor index, first element, tensor numel) from the chunk table."""
    c = tl.program_id(0)
    i = tl.load(chunk_t + c)
    start = tl.multiple_of(tl.load(chunk_s + c), BLOCK)
    return c, i, start, tl.load(numels + i)


@triton.jit
def _slot(ptrs, i, k: tl.constexpr, DT: tl.constexpr, ALIGNED: tl.constexpr):
    """Tensor i's k-th data pointer (0 param, 1 grad, 2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq),
    hinted 16-byte aligned when the host checked that it is. Rows of the table are SLOTS wide."""
    ptr = tl.load(ptrs + i * 6 + k).to(tl.pointer_type(DT))
    if ALIGNED:
        ptr = tl.multiple_of(ptr, 16)
    return ptr


@triton.jit
def _fast(ptrs, i, start, numel, BLOCK: tl.constexpr):
    """Whether this chunk takes the unmasked, alignment-hinted path on a mixed bucket: a whole
    chunk of a tensor whose pointers are all aligned (the table's sixth column)."""
    return (tl.load(ptrs + i * 6 + 5) != 0) & (start + BLOCK <= numel)


@triton.jit
def _ld(ptr, offs, mask, MASKED: tl.constexpr):
    """Elements at ptr + offs as fp32 (masked lanes read 0)."""
    if MASKED:
        x = tl.load(ptr + offs, mask=mask, other=0.0)
    else:
        x = tl.load(ptr + offs)
    return x.to(tl.float32)


@triton.jit
def _st(ptr, offs, x, mask, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptr + offs, x, mask=mask)
    else:
        tl.store(ptr + offs, x)


@triton.jit
def _adamw_body(ptrs, i, offs, mask, scal, decay, w1, beta2, w2, eps, LERP_LOW: tl.constexpr,
                AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, DT: tl.constexpr,
                ALIGNED: tl.constexpr, MASKED: tl.constexpr):
    p_ptr = _slot(ptrs, i, 0, DT, ALIGNED)
    g_ptr = _slot(ptrs, i, 1, DT, ALIGNED)
    m_ptr = _slot(ptrs, i, 2, DT, ALIGNED)
    v_ptr = _slot(ptrs, i, 3, DT, ALIGNED)
    g = _ld(g_ptr, offs, mask, MASKED)
    if MAXIMIZE:
        g = -g
    p = _ld(p_ptr, offs, mask, MASKED) * decay
    m0 = _ld(m_ptr, offs, mask, MASKED)
    if LERP_LOW:
        m = m0 + w1 * (g - m0)
    else:
        m = g - (g - m0) * (1.0 - w1)
    v = _ld(v_ptr, offs, mask, MASKED) * beta2 + w2 * g * g
    vd = v
    if AMSGRAD:
        vm_ptr = _slot(ptrs, i, 4, DT, ALIGNED)
        vd = tl.maximum(_ld(vm_ptr, offs, mask, MASKED), v, propagate_nan=tl.PropagateNan.ALL)  # torch.maximum's NaN
        _st(vm_ptr, offs, vd, mask, MASKED)
    denom = tl.sqrt(vd) / tl.load(scal + i * 2 + 1) + eps  # scal[i] = (step_size, sqrt(bc2))
    p = p - tl.load(scal + i * 2) * m / denom
    _st(p_ptr, offs, p, mask, MASKED)
    _st(m_ptr, offs, m, mask, MASKED)
    _st(v_ptr, offs, v, mask, MASKED)


@triton.jit
def _adamw_kernel(ptrs, numels, chunk_t, chunk_s, scal, decay, w1, beta2, w2, eps,
                  LERP_LOW: tl.constexpr, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr,
                  DT: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    c, i, start, numel = _chunk(chunk_t, chunk_s, numels, BLOCK)
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    if ALIGNED:
        if start + BLOCK <= numel:  # uniform per program: a whole chunk, no mask
            _adamw_body(ptrs, i, offs, mask, scal, decay, w1, beta2, w2, eps, LERP_LOW, AMSGRAD,
                        MAXIMIZE, DT, True, False)
        else:
            _adamw_body(ptrs, i, offs, mask, scal, decay, w1, beta2, w2, eps, LERP_LOW, AMSGRAD,
                        MAXIMIZE, DT, True, True)
    elif _fast(ptrs, i, start, numel, BLOCK):  # a mixed bucket: this tensor is aligned
        _adamw_body(ptrs, i, offs, mask, scal, decay, w1, beta2, w2, eps, LERP_LOW, AMSGRAD,
                    MAXIMIZE, DT, True, False)
    else:
        _adamw_body(ptrs, i, offs, mask, scal, decay, w1, beta2, w2, eps, LERP_LOW, AMSGRAD,
                    MAXIMIZE, DT, False, True)


@triton.jit
def _lamb1_body(ptrs, c, i, offs, mask, scal, part_p, part_u, b1, b2, w2, b3, eps, clip, wd,
                DT: tl.constexpr, ALIGNED: tl.constexpr, MASKED: tl.constexpr, L2: tl.constexpr):
    p_ptr = _slot(ptrs, i, 0, DT, ALIGNED)
    g_ptr = _slot(ptrs, i, 1, DT, ALIGNED)
    m_ptr = _slot(ptrs, i, 2, DT, ALIGNED)
    v_ptr = _slot(ptrs, i, 3, DT, ALIGNED)
    p = _ld(p_ptr, offs, mask, MASKED)
    g = tl.math.div_rn(_ld(g_ptr, offs, mask, MASKED), clip)  # IEEE division, as eager's
    if L2:  # only the mode's decay term: a NaN/Inf p never makes the other's 0 * p NaN
        g = g + wd * p
    m = b1 * _ld(m_ptr, offs, mask, MASKED) + b3 * g
    v = b2 * _ld(v_ptr, offs, mask, MASKED) + w2 * g * g
    _st(m_ptr, offs, m, mask, MASKED)
    _st(v_ptr, offs, v, mask, MASKED)
    m = m.to(DT).to(tl.float32)  # the update from the stored (rounded) moments, as stage 2 sees them
    v = v.to(DT).to(tl.float32)
    u = (m * tl.load(scal + i * 2)) / (tl.sqrt(v * tl.load(scal + i * 2 + 1)) + eps)
    if not L2:
        u = u + wd * p
    if MASKED:
        u = tl.where(mask, u, 0.0)
    tl.store(part_p + c, tl.sum(p * p, axis=0))
    tl.store(part_u + c, tl.sum(u * u, axis=0))


@triton.jit
def _lamb_stage1(ptrs, numels, chunk_t, chunk_s, scal, part_p, part_u, b1, b2, w2, b3,
                 eps, clip_ptr, wd, DT: tl.constexpr, BLOCK: tl.constexpr,
                 ALIGNED: tl.constexpr, L2: tl.constexpr):
    c, i, start, numel = _chunk(chunk_t, chunk_s, numels, BLOCK)
    clip = tl.load(clip_ptr)  # the clipping divisor, in fp32, on the device
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    if ALIGNED:
        if start + BLOCK <= numel:
            _lamb1_body(ptrs, c, i, offs, mask, scal, part_p, part_u, b1, b2, w2, b3, eps, clip,
                        wd, DT, True, False, L2)
        else:
            _lamb1_body(ptrs, c, i, offs, mask, scal, part_p, part_u, b1, b2, w2, b3, eps, clip,
                        wd, DT, True, True, L2)
    elif _fast(ptrs, i, start, numel, BLOCK):
        _lamb1_body(ptrs, c, i, offs, mask, scal, part_p, part_u, b1, b2, w2, b3, eps, clip,
                    wd, DT, True, False, L2)
    else:
        _lamb1_body(ptrs, c, i, offs, mask, scal, part_p, part_u, b1, b2, w2, b3, eps, clip,
                    wd, DT, False, True, L2)


@triton.jit
def _lamb2_body(ptrs, i, offs, mask, scal, step_lr, eps, wd, DT: tl.constexpr,
                ALIGNED: tl.constexpr, MASKED: tl.constexpr, L2: tl.constexpr):
    p_ptr = _slot(ptrs, i, 0, DT, ALIGNED)
    m_ptr = _slot(ptrs, i, 2, DT, ALIGNED)
    v_ptr = _slot(ptrs, i, 3, DT, ALIGNED)
    p = _ld(p_ptr, offs, mask, MASKED)
    m = _ld(m_ptr, offs, mask, MASKED)
    v = _ld(v_ptr, offs, mask, MASKED)
    u = (m * tl.load(scal + i * 2)) / (tl.sqrt(v * tl.load(scal + i * 2 + 1)) + eps)
    if not L2:
        u = u + wd * p
    _st(p_ptr, offs, p - tl.load(step_lr + i) * u, mask, MASKED)


@triton.jit
def _lamb_stage2(ptrs, numels, chunk_t, chunk_s, scal, step_lr, eps, wd,
                 DT: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr, L2: tl.constexpr):
    c, i, start, numel = _chunk(chunk_t, chunk_s, numels, BLOCK)
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    if ALIGNED:
        if start + BLOCK <= numel:
            _lamb2_body(ptrs, i, offs, mask, scal, step_lr, eps, wd, DT, True, False, L2)
        else:
            _lamb2_body(ptrs, i, offs, mask, scal, step_lr, eps, wd, DT, True, True, L2)
    elif _fast(ptrs, i, start, numel, BLOCK):
        _lamb2_body(ptrs, i, offs, mask, scal, step_lr, eps, wd, DT, True, False, L2)
    else:
        _lamb2_body(ptrs, i, offs, mask, scal, step_lr, eps, wd, DT, False, True, L2)


class TableCache:
    """A small LRU map from an exact key to device tables (built by `build` on a miss).

    Keys are the full content the tables encode (sizes or addresses; device and stream), so a hit
    is always correct, even for tensors reallocated at the same addresses.
    """

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        if entries < 1:
            raise ValueError(f"TableCache needs at least one entry, got {entries}")
        self.entries = entries
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], object]) -> object:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
            self.misses += 1
        value = build()
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


CHUNK_TABLES = TableCache()
POINTER_TABLES = TableCache()


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One host->device copy: pinned and non-blocking on CUDA (PyTorch's caching host allocator
    keeps the pinned block alive until the copy is done), a plain copy elsewhere."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class ChunkTable:
    """Per program (tensor index, first element); per tensor numel and chunk count."""

    def __init__(self, numels: Sequence[int], device: torch.device) -> None:
        n = torch.tensor(numels, dtype=torch.int64, device="cpu")  # host tables: not the default device
        counts = (n + BLOCK - 1) // BLOCK  # chunks per tensor
        self.n_chunks = int(counts.sum())
        chunk_t = torch.repeat_interleave(torch.arange(len(numels), device="cpu"), counts)  # [n_chunks]
        first = torch.cumsum(counts, 0) - counts  # first chunk of each tensor
        chunk_s = (torch.arange(self.n_chunks, device="cpu") - first[chunk_t]) * BLOCK
        self.counts = _to_device(counts, device)  # chunks of each tensor, consecutive in chunk order
        self.numels = _to_device(n, device)
        self.chunk_t = _to_device(chunk_t.to(torch.int32), device)
        self.chunk_s = _to_device(chunk_s, device)


def pointer_columns(lists: Sequence[Sequence[torch.Tensor]]) -> tuple[tuple[int, ...], ...]:
    """Per list (p, g, m, v, vmax), its tensors' data pointers (zeros for an absent list)."""
    n = len(lists[0])
    cols = tuple(tuple([t.data_ptr() for t in lst]) if lst else (0,) * n for lst in lists)
    return cols + ((0,) * n,) * (5 - len(cols))


def aligned_rows(columns: Iterable[Sequence[int]], align_bytes: int = ALIGN_BYTES) -> tuple[int, ...]:
    """Per tensor, 1 if all its data pointers are multiples of align_bytes (0 = absent list counts
    as aligned), else 0: whether its whole chunks may take the unmasked 128-bit path."""
    return tuple(int(all(p % align_bytes == 0 for p in ptrs)) for ptrs in zip(*columns))


def all_aligned(columns: Iterable[Sequence[int]], align_bytes: int = ALIGN_BYTES) -> bool:
    """True if every tensor's pointers are aligned: the kernels' ALIGNED (no per-tensor check)."""
    return all(aligned_rows(columns, align_bytes))


def _pointer_table(columns: tuple[tuple[int, ...], ...], device: torch.device) -> tuple[torch.Tensor, bool]:
    """([n_tensors, SLOTS] int64 table on device: the 5 data pointers and the aligned flag; ALIGNED)."""
    flags = aligned_rows(columns)
    table = torch.tensor(columns + (flags,), dtype=torch.int64, device="cpu").reshape(SLOTS, -1).t().contiguous()
    return _to_device(table, device), all(flags)


def _stream(device: torch.device) -> int:
    """The current CUDA stream (tables are used on the stream that built them), 0 elsewhere."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def tables(lists: Sequence[Sequence[torch.Tensor]], device: torch.device
           ) -> tuple[ChunkTable, torch.Tensor, bool]:
    """(chunk table, [n, SLOTS] int64 pointer table, ALIGNED) for a bucket, from the caches."""
    numels = tuple([t.numel() for t in lists[0]])
    cols = pointer_columns(lists)
    where = (device, _stream(device))
    chunks = CHUNK_TABLES.get((where, numels), lambda: ChunkTable(numels, device))
    ptrs, aligned = POINTER_TABLES.get((where, cols), lambda: _pointer_table(cols, device))
    return chunks, ptrs, aligned


def _steps(steps: list[torch.Tensor]) -> list[float]:
    torch._foreach_add_(steps, 1)
    return [float(s) for s in steps]


def _pairs(steps: list[float], pair: Callable[[float], tuple[float, float]],
           device: torch.device) -> torch.Tensor:
    """[n, 2] float32 per-tensor scalars pair(step) (computed once per distinct step), one copy."""
    memo = {s: pair(s) for s in set(steps)}
    flat = array.array("f", [x for s in steps for x in memo[s]])  # double -> float, nearest
    return _to_device(torch.frombuffer(flat, dtype=torch.float32).reshape(-1, 2), device)


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1,
               beta2, eps, weight_decay, amsgrad, maximize) -> None:
    """One AdamW step over lists of same-dtype tensors on one device (one launch)."""
    if not params:
        return
    dev, dt = params[0].device, params[0].dtype
    tab, ptrs, aligned = tables([params, grads, exp_avgs, exp_avg_sqs,
                                 max_exp_avg_sqs if amsgrad else []], dev)
    st = _steps(steps)
    scal = _pairs(st, lambda s: (lr / (1 - beta1 ** s), math.sqrt(1 - beta2 ** s)), dev)
    _adamw_kernel[(tab.n_chunks,)](
        ptrs, tab.numels, tab.chunk_t, tab.chunk_s, scal,
        1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, eps,
        LERP_LOW=(1 - beta1) < 0.5, AMSGRAD=amsgrad, MAXIMIZE=maximize, DT=_DT[dt], BLOCK=BLOCK,
        ALIGNED=aligned)


def divisor_on(grad_divisor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """grad_divisor (a 0-dim tensor: LAMB's clipping divisor) as a [1] fp32 tensor on `device`,
    never read on the host: grads are divided by it in fp32, as the eager reference divides
    (multiplying by a rounded reciprocal differed in a third of the elements, and in a
    cancellation g / clip + wd * p that ulp became a visible error: fuzz seed 644928)."""
    return grad_divisor.to(device=device, dtype=torch.float64).float().reshape(1)


def lamb_step(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps,
              weight_decay, grad_divisor, bias_correction, adam_w_mode, grad_averaging,
              use_nvlamb) -> None:
    """One LAMB step over lists of same-dtype tensors on one device (three launches)."""
    if not params:
        return
    dev, dt = params[0].device, params[0].dtype
    tab, ptrs, aligned = tables([params, grads, exp_avgs, exp_avg_sqs], dev)
    st = _steps(steps)
    scal = _pairs(st, lambda s: (1 / (1 - beta1 ** s), 1 / (1 - beta2 ** s)) if bias_correction
                  else (1.0, 1.0), dev)
    part_p = torch.empty(tab.n_chunks, dtype=torch.float32, device=dev)
    part_u = torch.empty_like(part_p)
    grid = (tab.n_chunks,)
    _lamb_stage1[grid](ptrs, tab.numels, tab.chunk_t, tab.chunk_s, scal, part_p, part_u,
                       beta1, beta2, 1 - beta2, (1 - beta1) if grad_averaging else 1.0, eps,
                       divisor_on(grad_divisor, dev), weight_decay, DT=_DT[dt], BLOCK=BLOCK,
                       ALIGNED=aligned, L2=not adam_w_mode)
    norms = []
    for part in (part_p, part_u):
        # Per tensor, its consecutive chunks' sums added in order in fp64 (deterministic; unsafe=True
        # skips the length checks' host reads). Not differences of one running sum: a NaN there
        # poisoned every later tensor's norm, and a large one drowned the small ones after it.
        sums = torch.segment_reduce(part.double(), "sum", lengths=tab.counts, unsafe=True)
        norms.append(sums.sqrt())
    pn, un = norms
    trust = (pn > 0) & (un > 0) & bool(use_nvlamb or weight_decay != 0)
    step_lr = (lr * torch.where(trust, pn / torch.where(trust, un, torch.ones_like(un)),
                                torch.ones_like(pn))).float()
    _lamb_stage2[grid](ptrs, tab.numels, tab.chunk_t, tab.chunk_s, scal, step_lr, eps,
                       weight_decay, DT=_DT[dt], BLOCK=BLOCK, ALIGNED=aligned, L2=not adam_w_mode)
