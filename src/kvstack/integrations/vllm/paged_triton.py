"""The Triton kernels of :mod:`.paged_kernels` (imported only where Triton is installed).

A copy is ``blocks x layers x parts`` pieces of up to ``BLOCK`` 8-byte words: a part of block
``j``'s page of layer ``first_layer + l``. That layer's page array starts at ``pointers[layer]``,
its block ``b`` at ``b * block_words`` words from there; in the chunk-major buffer, block
``j``'s page of layer ``layer`` is at ``offsets[j] + layer * layer_strides[j]`` words. A fixed,
small number of programs take the pieces in turn, so that a copy running beside the model's
kernels holds few of the GPU's multiprocessors.
"""

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def pages_to_buffer(  # type: ignore[no-untyped-def]
    pointers, index, offsets, layer_strides, buffer, first_layer, num_layers, num_blocks,
    block_words, page_words, parts, BLOCK: tl.constexpr,
):  # fmt: skip
    for piece in range(tl.program_id(0), num_blocks * num_layers * parts, tl.num_programs(0)):
        part = piece % parts
        layer = first_layer + (piece // parts) % num_layers
        j = piece // (parts * num_layers)
        words = part * BLOCK + tl.arange(0, BLOCK)
        mask = words < page_words
        pages = tl.load(pointers + layer).to(tl.pointer_type(tl.int64))
        block = tl.load(index + j)
        dst = tl.load(offsets + j) + layer * tl.load(layer_strides + j)
        values = tl.load(pages + block * block_words + words, mask=mask)
        tl.store(buffer + dst + words, values, mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def buffer_to_pages(  # type: ignore[no-untyped-def]
    pointers, index, offsets, layer_strides, buffer, first_layer, num_layers, num_blocks,
    block_words, page_words, parts, BLOCK: tl.constexpr,
):  # fmt: skip
    for piece in range(tl.program_id(0), num_blocks * num_layers * parts, tl.num_programs(0)):
        part = piece % parts
        layer = first_layer + (piece // parts) % num_layers
        j = piece // (parts * num_layers)
        words = part * BLOCK + tl.arange(0, BLOCK)
        mask = words < page_words
        pages = tl.load(pointers + layer).to(tl.pointer_type(tl.int64))
        block = tl.load(index + j)
        src = tl.load(offsets + j) + layer * tl.load(layer_strides + j)
        values = tl.load(buffer + src + words, mask=mask)
        tl.store(pages + block * block_words + words, values, mask=mask)
