"""The grain of a chunked matrix: which chunks a region touches, and each chunk's region.
Pure functions of regions and chunk shapes (:mod:`oocgemm.planning.chunks` counts how a
schedule's reads meet them; the schedule cuts loads of panels decoded on the device at
them)."""

from __future__ import annotations

Region = tuple[tuple[int, int], tuple[int, int]]


def chunk_range(lo: int, hi: int, chunk: int) -> range:
    """Indices of the chunks (of ``chunk`` elements) that ``[lo, hi)`` touches."""
    if hi <= lo:
        return range(0)
    return range(lo // chunk, (hi - 1) // chunk + 1)


def on_chunk_edges(splits: tuple[tuple[int, ...], tuple[int, ...]], chunks: tuple[int, int],
                   shape: tuple[int, int]) -> bool:
    """Whether every row and column split (C blocks' edges) lies on an edge of ``chunks``
    or at the end of ``shape``: each chunk then lies in one block."""
    return all(x % chunk == 0 or x == extent
               for edges, chunk, extent in zip(splits, chunks, shape) for x in edges)


def chunks_of(region: Region, chunks: tuple[int, int]) -> list[tuple[int, int]]:
    """The (row, column) indices of the chunks a region touches, row by row."""
    (r0, r1), (c0, c1) = region
    cols = chunk_range(c0, c1, chunks[1])
    return [(i, j) for i in chunk_range(r0, r1, chunks[0]) for j in cols]


def chunk_region(index: tuple[int, int], chunks: tuple[int, int], shape: tuple[int, int]
                 ) -> Region:
    """Rows and columns of chunk ``index`` (clipped at the array's edges)."""
    (i, j), (cr, cc) = index, chunks
    return ((i * cr, min((i + 1) * cr, shape[0])), (j * cc, min((j + 1) * cc, shape[1])))
