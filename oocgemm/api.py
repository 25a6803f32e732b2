"""``multiply()``, ``plan()`` and ``gram()``: one :class:`~oocgemm.product.Product` each,
made, planned and (but for ``plan``) executed and closed. The short story of a run is told
there (:mod:`oocgemm.product`); the keyword arguments are the options defined once in
:class:`~oocgemm.options.Options` (the signatures here are made from it).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Protocol

from .arguments import flag
from .devices import Device, device_names, resolve_device
from .errors import OptionError
from .options import Options
from .planning import Plan
from .product import Product
from .result import Result
from .typing import MatrixLike, Scalar

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Device", "EngineLike", "MatrixLike", "Scalar", "device_names", "gram", "multiply",
           "plan", "resolve_device"]


class EngineLike(Protocol):
    """What a run takes from an :class:`oocgemm.Engine` (which imports this module)."""

    def resources(self, kind: str) -> Any: ...


def with_options(func: Callable) -> Callable:
    """``func`` (which takes ``**options``) with a signature that names each option of
    :class:`~oocgemm.options.Options` as a keyword, its default the field's: what ``help()``
    and ``inspect.signature`` show."""
    import dataclasses

    signature = inspect.signature(func)
    params = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                 annotation=f.type) for f in dataclasses.fields(Options)]
    func.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return func


@with_options
def plan(a: MatrixLike, b: MatrixLike, out: MatrixLike | None = None, *,
         c: MatrixLike | None = None, alpha: Scalar = 1.0, beta: Scalar = 0.0,
         trans_a: bool = False, trans_b: bool = False, **options: Any) -> Plan:
    """Plan ``out = alpha * op(a) @ op(b) + beta * c`` without reading any data.

    Takes the same arguments as :func:`multiply` (those that change only how it runs are
    accepted and ignored); returns the validated :class:`~oocgemm.planning.Plan` (print it
    for a summary; ``plan.schedule`` lists the block operations).
    ``oocgemm.Product(...).plan()`` gives the same plan and can then execute it.

    Raises
    ------
    OOCGemmError
        For any bad input, option or budget (see :func:`multiply`).
    """
    with Product(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                 options=Options.of("plan()", **options)) as product:
        return product.plan()


@with_options
def multiply(a: MatrixLike, b: MatrixLike, out: MatrixLike | None = None, *,
             c: MatrixLike | None = None, alpha: Scalar = 1.0, beta: Scalar = 0.0,
             trans_a: bool = False, trans_b: bool = False, **options: Any) -> Result:
    """Compute ``out = alpha * op(a) @ op(b) + beta * c`` block by block (BLAS xGEMM).

    Parameters
    ----------
    a, b
        Matrices: a path (a ``.zarr`` directory in Zarr format 2 or 3, a ``.npy`` file opened
        as a memmap, a ``.zip`` file of a Zarr array read through zarr's ``ZipStore``), a URL
        of a Zarr array (``file://``, ``memory://``, ``s3://``, ``gs://``: whatever fsspec
        opens), a ``zarr.Array``, a numpy array or memmap (any strides), a CuPy array, or a
        dask array. A ``.npz`` archive is refused (it holds several arrays: pass one).
    out
        A path (created: ``.zarr`` as Zarr v3, or the format of the Zarr group it goes into,
        uncompressed, with chunks of at most 64 MiB that tile the C blocks; ``.npy`` as a
        memmap), a writable array of shape (M, N), or None for a new numpy array. A path is
        written under a temporary name and renamed when the last block is stored.
    c
        The matrix scaled by ``beta``. With ``beta != 0`` and ``c=None``, ``out`` must exist
        and is updated in place. With ``beta == 0``, C is never read.
    alpha, beta
        Scalars. ``alpha == 0`` (or K == 0) computes no product: A and B are not read.
    trans_a, trans_b
        Use the transpose of a / b; transposed operands are read in their stored layout.
    device
        'auto' (a GPU when CuPy sees one, else the CPU), 'cpu', 'cuda' or 'cuda:N'; or several:
        'cuda:all' (every GPU) or a list such as ``['cuda:0', 'cuda:1']``. With several, the
        plan is made for one device and its C blocks are handed out in groups (rows of
        blocks, or single blocks), each device taking the next group when it is free;
        ``result.devices`` says what each did. ``['cpu', 'cpu']`` runs two CPU executors.
    memory_limit
        Bytes, or a string like '8GB' or '80%', for the executor's block buffers (GPU memory
        for CUDA, the working buffers for the CPU). Defaults: 90% of free GPU memory, or a
        quarter of host memory.
    host_memory_limit
        Bytes or string bounding host staging and read buffers (default a quarter of host RAM).
    tile
        (w, h, r) to override the planner: C blocks of w×h, K panels of depth r.
    kernel
        The per-block GEMM. On a GPU: 'cublas' (the default, the fastest measured) or one
        of the kernels of ``kernels/``: 'naive', 'tiled', 'opt', 'regblock' (float32/float64),
        'dmma' (float64, FP64 tensor cores, compute capability 8.0+); those are not for the
        CPU. On a GPU or the CPU: 'ozaki' or 'ozaki:N', float64 products emulated with Ozaki
        scheme II from exact int8 GEMMs (N moduli; 'ozaki' takes as many as keep DGEMM's error
        bound), the same bits on both; other dtypes keep their GEMM (docs/kernels.md).
    gpu_decode
        Who decodes inputs stored as zstd frames on a GPU run: 'auto' (the GPU where the plan
        allows, nvCOMP is found and the cost model predicts it faster), True (the GPU wherever
        the plan allows) or False (the host); 'on' and 'off' are True and False. None (the
        default): the setting :mod:`oocgemm.settings` holds (``OOCGEMM_GPU_DECODE``, else
        'auto'). The plan says which inputs the GPU decodes (``plan.io.gpu_decode``).
    gpu_encode
        Who compresses a zstd output on a GPU run: True (the GPU, a row stripe of C at a
        time, where nvCOMP is found and its buffers fit), False (the host, whole chunks), or
        the experimental 'last' and 'frames' (shares of the stripes between the GPU and the
        host's encoders); 'on' and 'off' are True and False. None (the default): the setting
        (``OOCGEMM_GPU_ENCODE``, else True). ``result.out_encoder`` names the GPU's encoder
        where it compressed C. On the CPU, the host decodes and encodes whatever these say
        (the plan notes a GPU asked for).
    overwrite
        Replace an existing output path.
    progress
        True for a progress bar on stderr, False for none, None for a bar only when stderr is
        a terminal and the run is predicted to take over two seconds, or a callable that
        receives each finished :class:`~oocgemm.diagnostics.Event`.
    out_options
        The layout of a new ``.zarr`` output: keywords of ``zarr.create_array`` (``chunks``,
        ``shards``, ``compressors``, ``filters``, ``serializer``, ``zarr_format``,
        ``dimension_names``, ``chunk_key_encoding``), checked before any work. ``compressors``
        may be a codec object (list) or a name like ``'zstd:3'``; C blocks align to the
        chunks (or shards).
    storage_options
        Options of the fsspec file system of URL inputs and outputs (credentials, endpoint).
    verify
        Check the product before it is committed with Freivalds' test (:func:`oocgemm.verify`,
        two random vectors, O(n²)): a product that fails it is not committed
        (``ExecutionError``); ``result.verified`` holds the report.
    resume
        Continue the interrupted run (Ctrl-C, SIGTERM, a crash, ``kill -9``) of this same
        product into this same output path: the C blocks it finished (each checked against the
        checksum it journaled) are kept, the others computed with the same tile and schedule,
        so the result is bitwise what an uninterrupted run gives. Refused (``OutputError``)
        when the inputs or the options changed, or when the output is complete (it exists,
        and no interrupted run of it is left); a fresh run when there is nothing to resume.
        Needs an output path and inputs stored as local files.
    engine
        The :class:`oocgemm.Engine` whose pinned memory, cuBLAS handles and compiled kernels
        the run uses (``engine.multiply`` passes itself); None: the process's, kept until
        it exits.
    events
        True (the default) to record one timed event per block operation (``result.events``,
        ``result.timeline``); False records none, to measure what recording costs
        (``result.bytes`` is counted either way; a ``progress`` callable still gets its events).

    Returns
    -------
    Result
        ``result.out`` holds the product; timings, traffic and the executed operations too.

    Raises
    ------
    OOCGemmError
        InputError (missing, corrupt, not a matrix), ShapeError, DTypeError, OutputError
        (exists, aliases an input), BudgetError (no tile fits), OptionError, DeviceError,
        ExecutionError (the run failed; nothing was committed).
    """
    with Product(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                 options=Options.of("multiply()", **options)) as product:
        return product.execute()


def gram(x: MatrixLike, out: MatrixLike | None = None, *, outer: bool = False,
         **options: Any) -> Result:
    """The Gram matrix ``out = alpha * X^T X + beta * c`` (``outer=True``: ``X X^T``).

    ``multiply(x, x, trans_a=True)`` (or ``trans_b=True``) under another name: ``x`` is read
    and decoded once, only the C blocks on and above the diagonal are computed (half the
    flops), each block above the diagonal is also written transposed across it, and the
    result is exactly symmetric (``C == C.T`` bit for bit where ``c`` is symmetric or not
    read; a complex ``x`` gives the plain transpose's product: symmetric, not Hermitian).

    Parameters
    ----------
    x
        Any matrix :func:`multiply` takes (a path, a URL, an array).
    out
        As for :func:`multiply`.
    outer
        False: ``X^T X`` (the columns' inner products: samples x features gives features x
        features); True: ``X X^T``.
    **options
        Every keyword of :func:`multiply` but ``trans_a`` and ``trans_b``.

    Returns
    -------
    Result
        As :func:`multiply`; ``result.flops`` counts the flops done (about half of
        ``2 M N K``).
    """
    given = sorted({"trans_a", "trans_b"} & set(options))
    if given:
        raise OptionError(f"gram() takes outer=True or False, not {', '.join(given)}")
    outer = flag("outer", outer)
    return multiply(x, x, out, trans_a=not outer, trans_b=outer, **options)
