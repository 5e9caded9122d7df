"""The Triton kernels of :mod:`.paged_kernels` (imported only where Triton is installed).

One program copies up to ``BLOCK`` 8-byte words of one page: block ``j`` of the plan, layer
``first_layer + program_id(1)``. The layer's page array starts at ``pointers[layer]``; its
block ``b`` at ``b * block_words`` words from there. In the chunk-major buffer, block ``j``'s
page of layer ``l`` is at ``offsets[j] + l * layer_strides[j]`` words.
"""

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def pages_to_buffer(  # type: ignore[no-untyped-def]
    pointers, index, offsets, layer_strides, buffer,
    first_layer, block_words, page_words, BLOCK: tl.constexpr,
):  # fmt: skip
    j = tl.program_id(0)
    layer = first_layer + tl.program_id(1)
    words = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = words < page_words
    pages = tl.load(pointers + layer).to(tl.pointer_type(tl.int64))
    block = tl.load(index + j)
    dst = tl.load(offsets + j) + layer * tl.load(layer_strides + j)
    values = tl.load(pages + block * block_words + words, mask=mask)
    tl.store(buffer + dst + words, values, mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def buffer_to_pages(  # type: ignore[no-untyped-def]
    pointers, index, offsets, layer_strides, buffer,
    first_layer, block_words, page_words, BLOCK: tl.constexpr,
):  # fmt: skip
    j = tl.program_id(0)
    layer = first_layer + tl.program_id(1)
    words = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = words < page_words
    pages = tl.load(pointers + layer).to(tl.pointer_type(tl.int64))
    block = tl.load(index + j)
    src = tl.load(offsets + j) + layer * tl.load(layer_strides + j)
    values = tl.load(buffer + src + words, mask=mask)
    tl.store(pages + block * block_words + words, values, mask=mask)
