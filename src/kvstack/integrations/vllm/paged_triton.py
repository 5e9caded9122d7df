"""The Triton kernel of :mod:`.paged_kernels` (imported only where Triton is installed).

One program copies up to ``BLOCK`` 8-byte words of one page: block ``j`` of the plan, layer
``first_layer + program_id(1)``. The layer's page array starts at ``pointers[layer]``; its
block ``b`` at ``b * block_words`` words from there. In the chunk-major buffer, block ``j``'s
page of layer ``l`` is at ``offsets[j] + l * layer_strides[j]`` words. ``TO_BUFFER`` says
which way the words go (a copy-out, or a load).
"""

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def copy_pages(  # type: ignore[no-untyped-def]
    pointers, index, offsets, layer_strides, buffer,
    first_layer, block_words, page_words, BLOCK: tl.constexpr, TO_BUFFER: tl.constexpr,
):  # fmt: skip
    j = tl.program_id(0)
    layer = first_layer + tl.program_id(1)
    words = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = words < page_words
    pages = tl.load(pointers + layer).to(tl.pointer_type(tl.int64))
    page = pages + tl.load(index + j) * block_words + words
    chunk = buffer + tl.load(offsets + j) + layer * tl.load(layer_strides + j) + words
    if TO_BUFFER:
        tl.store(chunk, tl.load(page, mask=mask), mask=mask)
    else:
        tl.store(page, tl.load(chunk, mask=mask), mask=mask)
