// A caching pool for large CPU kernel outputs (kernels/_alloc.py decides when it is used).
//
// glibc maps every block over its mmap threshold afresh and hands it back to the OS on free (and
// trims the top of its heap), so a large output pays a page fault per page on its first write on
// every call: for a 12.6 MB LayerNorm output, about as long as the kernel itself. The pool keeps
// freed output blocks (2 MiB-aligned, huge-page advised when fresh) and hands them out again, as
// PyTorch's CUDA caching allocator does on GPUs. It holds at most its cap of idle memory,
// least recently freed blocks leaving first; `pool_empty` gives everything idle back.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace fusionlens {

// An uninitialised contiguous CPU tensor whose storage comes from the pool (resizable: its
// storage keeps the pool as its allocator).
at::Tensor empty_pooled(at::IntArrayRef shape, at::ScalarType dtype);

}  // namespace fusionlens
