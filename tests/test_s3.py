"""Zarr inputs and outputs on S3, against a real S3 server: moto's, started by these tests on
127.0.0.1 (a free port, stopped when the module's tests end), reached through s3fs with
``storage_options`` or, for dask's worker processes, the environment (``AWS_ENDPOINT_URL``).
Skipped where moto's server or s3fs is not installed (the ``test`` extra has both)."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, cli, interrupt_write, poisoned, rand

import oocgemm
from oocgemm.cli import main
from oocgemm.errors import InputError, OOCGemmError, OptionError, OutputError

moto_server = pytest.importorskip("moto.server", reason="moto[server] runs the S3 server")
s3fs = pytest.importorskip("s3fs", reason="s3fs reads s3:// URLs")

KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
"""Credentials of moto's server, in the environment too: nothing looks further for real ones
(no credential files, no instance metadata service)."""


@pytest.fixture(scope="module")
def endpoint():
    """A moto S3 server on 127.0.0.1, on a free port, for this module's tests."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(endpoint, monkeypatch):
    """A fresh bucket: (its s3:// root, the storage_options that reach it, its s3fs file
    system). The environment names the server too (``AWS_ENDPOINT_URL``)."""
    for name, value in {**KEYS, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    options = {"endpoint_url": endpoint, "key": KEYS["AWS_ACCESS_KEY_ID"],
               "secret": KEYS["AWS_SECRET_ACCESS_KEY"]}
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    bucket = f"oocgemm-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    yield f"s3://{bucket}", options, fs
    fs.rm(bucket, recursive=True)


def put(url, x, options, chunks=(16, 16), **kw):
    zarr.create_array(url, shape=x.shape, dtype=x.dtype, chunks=chunks,
                      storage_options=options, **kw)[:] = x


def load(url, options):
    return zarr.open_array(url, mode="r", storage_options=options)


def listing(fs, root) -> list[str]:
    """The objects under ``root`` (relative), fresh from the server."""
    fs.invalidate_cache()
    bucket = root.removeprefix("s3://")
    return sorted(p[len(bucket) + 1:] for p in fs.find(bucket))


def tops(fs, root) -> list[str]:
    """The first names of the objects under ``root``."""
    return sorted({p.split("/", 1)[0] for p in listing(fs, root)})


def test_s3_in_and_out(rng, s3):
    root, so, fs = s3
    a, b = rand(rng, (45, 37)), rand(rng, (37, 29))
    put(f"{root}/a.zarr", a, so, compressors=zarr.codecs.ZstdCodec(level=1))
    put(f"{root}/b.zarr", b, so, chunks=(16, 8))
    r = oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", f"{root}/c.zarr", device="cpu",
                         tile=(16, 16, 16), alpha=-1.5, storage_options=so)
    c = load(f"{root}/c.zarr", so)
    assert_gemm(c[:], a, b, alpha=-1.5)
    assert c.attrs["oocgemm"]["complete"] is True
    assert r.chunks["A"]["decodes"] == 3 * 3  # each chunk fetched once
    assert tops(fs, root) == ["a.zarr", "b.zarr", "c.zarr"]
    # into a zarr.Array on S3, written in place (poisoned first)
    put(f"{root}/d.zarr", poisoned((45, 29)), so, chunks=(20, 20))
    d = zarr.open_array(f"{root}/d.zarr", mode="r+", storage_options=so)
    oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", d, device="cpu", tile=(16, 16, 16),
                     storage_options=so)
    assert_gemm(load(f"{root}/d.zarr", so)[:], a, b)


def test_s3_gram(rng, s3):
    root, so, fs = s3
    x = rand(rng, (53, 21))
    put(f"{root}/x.zarr", x, so, chunks=(16, 8), compressors=zarr.codecs.ZstdCodec(level=1))
    oocgemm.gram(f"{root}/x.zarr", f"{root}/g.zarr", device="cpu", tile=(8, 8, 16),
                 storage_options=so)
    g = load(f"{root}/g.zarr", so)[:]
    assert_gemm(g, x, x, trans_a=True)
    assert np.array_equal(g, g.T)
    oocgemm.gram(f"{root}/x.zarr", f"{root}/h.zarr", outer=True, device="cpu",
                 tile=(16, 16, 8), storage_options=so)
    assert_gemm(load(f"{root}/h.zarr", so)[:], x, x, trans_b=True)
    assert tops(fs, root) == ["g.zarr", "h.zarr", "x.zarr"]


def test_an_existing_s3_output_is_refused_then_replaced(rng, s3):
    root, so, fs = s3
    a, b = rand(rng, (33, 19)), rand(rng, (19, 27))
    put(f"{root}/a.zarr", a, so)
    put(f"{root}/b.zarr", b, so)
    # the old output: poisoned, another format and other chunks, so other object names
    put(f"{root}/c.zarr", poisoned((33, 27)), so, chunks=(8, 8), zarr_format=2)
    before = listing(fs, root)
    with pytest.raises(OutputError, match="exists"):
        oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", f"{root}/c.zarr", device="cpu",
                         storage_options=so)
    assert listing(fs, root) == before  # untouched
    oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", f"{root}/c.zarr", device="cpu",
                     tile=(16, 16, 16), overwrite=True, storage_options=so)
    c = load(f"{root}/c.zarr", so)
    assert_gemm(c[:], a, b)
    assert c.metadata.zarr_format == 3 and c.attrs["oocgemm"]["complete"] is True
    kept = [p for p in listing(fs, root) if p.startswith("c.zarr/")]
    assert "c.zarr/zarr.json" in kept and all(p.startswith("c.zarr/c/") for p in kept[:-1])
    assert tops(fs, root) == ["a.zarr", "b.zarr", "c.zarr"]


def test_s3_update_in_place(rng, s3):
    root, so, fs = s3
    a, b, c0 = rand(rng, (26, 15)), rand(rng, (15, 22)), rand(rng, (26, 22))
    for name, x in (("a", a), ("b", b), ("c", c0)):
        put(f"{root}/{name}.zarr", x, so, chunks=(8, 8))
    oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", f"{root}/c.zarr", device="cpu",
                     beta=0.5, alpha=2.0, tile=(8, 8, 8), storage_options=so)
    assert_gemm(load(f"{root}/c.zarr", so)[:], a, b, c0, alpha=2.0, beta=0.5)
    assert tops(fs, root) == ["a.zarr", "b.zarr", "c.zarr"]


@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwritten"])
def test_a_failed_s3_run_leaves_nothing_of_its_own(rng, s3, existing):
    root, so, fs = s3
    a, b = rand(rng, (40, 15)), rand(rng, (15, 10))
    put(f"{root}/a.zarr", a, so, chunks=(8, 8), compressors=zarr.codecs.ZstdCodec(level=1))
    put(f"{root}/b.zarr", b, so, chunks=(8, 8))
    old = rand(rng, (40, 10))
    if existing:
        put(f"{root}/c.zarr", old, so)
    before = listing(fs, root)
    fs.pipe(f"{root.removeprefix('s3://')}/a.zarr/c/4/1", b"not zstd")
    with pytest.raises(OOCGemmError, match="corrupt"):
        oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", f"{root}/c.zarr", device="cpu",
                         tile=(8, 8, 8), overwrite=True, storage_options=so)
    assert listing(fs, root) == before
    if existing:
        assert np.array_equal(load(f"{root}/c.zarr", so)[:], old)


def test_an_interrupted_s3_run_is_removed_and_resume_is_refused(rng, s3, monkeypatch):
    from oocgemm.storage.zarr_store import ZarrSink

    root, so, fs = s3
    a, b = rand(rng, (40, 24)), rand(rng, (24, 30))
    put(f"{root}/a.zarr", a, so, chunks=(8, 8))
    put(f"{root}/b.zarr", b, so, chunks=(8, 8))
    before = listing(fs, root)
    real = interrupt_write(monkeypatch, ZarrSink, at=3)  # Ctrl-C after two blocks
    with pytest.raises(KeyboardInterrupt):
        oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", f"{root}/c.zarr", device="cpu",
                         tile=(8, 8, 8), storage_options=so)
    monkeypatch.setattr(ZarrSink, "write", real)
    assert listing(fs, root) == before  # no journal, no blocks kept: nothing to resume
    with pytest.raises(OptionError, match="is a URL; a run into an object store keeps no"):
        oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", f"{root}/c.zarr", device="cpu",
                         resume=True, storage_options=so)
    with pytest.raises(OptionError, match=r"a 's3://.*' is a URL"):
        oocgemm.multiply(f"{root}/a.zarr", np.ones((24, 3)), "c.npy", device="cpu",
                         resume=True, storage_options=so)
    _, fails = cli(main)  # the environment names the server
    assert "keeps no journal" in fails("multiply", f"{root}/a.zarr", f"{root}/b.zarr", "-o",
                                       f"{root}/c.zarr", "--resume", "--device", "cpu")
    assert listing(fs, root) == before  # refused before anything was written


def test_s3_aliases_and_errors(rng, s3):
    root, so, fs = s3
    a, b = rand(rng, (12, 9)), rand(rng, (9, 12))
    put(f"{root}/a.zarr", a, so, chunks=(8, 8))
    put(f"{root}/b.zarr", b, so, chunks=(8, 8))
    bucket = root.removeprefix("s3://")
    for spelling in (f"{root}/a.zarr/", f"s3://{bucket}//a.zarr", f"{root}/a.zarr//"):
        with pytest.raises(OutputError, match="same matrix as a"):
            oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", spelling, device="cpu",
                             overwrite=True, storage_options=so)
    opened = zarr.open_array(f"{root}/b.zarr", mode="r", storage_options=so)
    with pytest.raises(OutputError, match="same matrix as b"):
        oocgemm.multiply(f"{root}/a.zarr", opened, f"{root}/b.zarr", device="cpu",
                         overwrite=True, storage_options=so)
    assert np.array_equal(load(f"{root}/a.zarr", so)[:], a)
    assert np.array_equal(load(f"{root}/b.zarr", so)[:], b)
    with pytest.raises(InputError, match="nothing at"):
        oocgemm.multiply(f"{root}/missing.zarr", f"{root}/b.zarr", device="cpu",
                         storage_options=so)
    with pytest.raises(OutputError, match="bucket does not exist"):
        oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", "s3://no-such-bucket-x/c.zarr",
                         device="cpu", storage_options=so)
    unreachable = {**so, "endpoint_url": "http://127.0.0.1:9", "config_kwargs": {
        "retries": {"max_attempts": 1}, "connect_timeout": 1}}
    with pytest.raises(InputError, match="cannot reach"):
        oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", device="cpu",
                         storage_options=unreachable)
    out = poisoned((12, 12))
    oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", out, device="cpu", storage_options=so)
    assert_gemm(out, a, b)
    assert tops(fs, root) == ["a.zarr", "b.zarr"]


def test_s3_chunk_reads_overlap_and_each_chunk_is_fetched_once(rng, s3, monkeypatch):
    """The engine's decoder threads fetch chunks from S3 concurrently (each fetch is held
    for 30 ms, so that one at a time would never overlap), and no chunk twice."""
    from zarr.storage import FsspecStore

    root, so, fs = s3
    a, b = rand(rng, (70, 64)), rand(rng, (64, 40))
    put(f"{root}/a.zarr", a, so, compressors=zarr.codecs.ZstdCodec(level=1))
    put(f"{root}/b.zarr", b, so)
    real, lock = FsspecStore.get, threading.Lock()
    fetched: dict[tuple[str, str], int] = {}
    flight = {"now": 0, "most": 0}

    async def get(self, key, *args, **kwargs):
        chunk = key.startswith("c/")
        if chunk:
            with lock:
                fetched[(self.path, key)] = fetched.get((self.path, key), 0) + 1
                flight["now"] += 1
                flight["most"] = max(flight["most"], flight["now"])
            await asyncio.sleep(0.03)
        try:
            return await real(self, key, *args, **kwargs)
        finally:
            if chunk:
                with lock:
                    flight["now"] -= 1

    monkeypatch.setattr(FsspecStore, "get", get)
    r = oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", device="cpu", tile=(32, 32, 32),
                         storage_options=so)
    assert_gemm(r.out, a, b)
    stores = {path for path, _ in fetched}
    assert len(stores) == 2 and set(fetched.values()) == {1}, fetched
    assert len(fetched) == 5 * 4 + 4 * 3  # every chunk of a and b, once
    assert flight["most"] >= 4, flight


def test_s3_dask_matmul_on_local_cluster_workers(rng, s3):
    """Worker processes read the inputs from S3 (the environment names the server; a
    zarr.Array carries its storage_options) and write the result's chunks to S3."""
    distributed = pytest.importorskip("distributed")
    import dask.array as da

    import oocgemm.dask as odask

    root, so, fs = s3
    a, b = rand(rng, (70, 45)), rand(rng, (45, 52))
    put(f"{root}/a.zarr", a, so, chunks=(16, 16), compressors=zarr.codecs.ZstdCodec(level=1))
    put(f"{root}/b.zarr", b, so, chunks=(16, 16))
    y = zarr.open_array(f"{root}/b.zarr", mode="r", storage_options=so)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        z = odask.matmul(f"{root}/a.zarr", y, device="cpu", groups=(32, 52), tile=(16, 16, 16))
        z.to_zarr(f"{root}/c.zarr", storage_options=so)
        g = odask.matmul(f"{root}/a.zarr", f"{root}/a.zarr", trans_a=True, device="cpu",
                         tile=(16, 16, 16))
        da.to_zarr(g, f"{root}/g.zarr", storage_options=so)
        assert len(client.run(lambda: True)) == 2
    assert_gemm(load(f"{root}/c.zarr", so)[:], a, b)
    gram = load(f"{root}/g.zarr", so)[:]
    assert_gemm(gram, a, a, trans_a=True)
    assert np.array_equal(gram, gram.T)
