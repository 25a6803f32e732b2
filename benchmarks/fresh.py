"""A fresh process beside a warm one (issue 51): ``oocgemm multiply`` on Zarr inputs with a
warm page cache and a cold one, beside the same product in a warm process and the storage
floor; where a fresh process's time goes (start-up and import, the call before the run's
first operation, the run, the call after it, the exit); ``oocgemm --help``; what ``oocgemm
plan`` predicts.

    python -m benchmarks fresh --zarr /tmp/fresh --n 32768 --chunk 4096 [--memory-limit 16GB]
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

from benchmarks.common import remove_all, report, zarr_product_parser
from oocgemm import machine

#: A child that times itself: when it started, imported oocgemm, called and returned from
#: multiply, and the run's own figures (its events' zero and its seconds).
CHILD = """
import json, sys, time
t0 = time.time()
import oocgemm
t1 = time.time()
r = oocgemm.multiply(*sys.argv[1:4], progress=False, events=True,
                     **json.loads(sys.argv[4]))
t2 = time.time()
startup = sys.modules.get("oocgemm.cuda.startup")
print(json.dumps({"started": t0, "imported": t1, "called": t1, "returned": t2,
                  "run_zero": r.started_at, "run_seconds": r.seconds,
                  "startup": startup.times(0) if startup else None}), flush=True)
"""


#: What any fresh process pays before a GPU product can start, and nothing else: the imports a
#: run needs, the driver, the context, cuBLAS and a pinned buffer (the driver and context
#: beside the imports, as the command starts them), then its exit.
START_ONLY = """
import sys, time
t0 = time.time()
from oocgemm.cuda import startup
startup.early([0])
import numpy, zarr, cupy
import oocgemm.product, oocgemm.runtime.cuda_executor
startup.times(0, start=True)
print(time.time() - t0, flush=True)
"""


def start_only() -> dict:
    """A fresh process that only starts what a GPU product needs (:data:`START_ONLY`),
    timed from outside (its wall) and inside (to the GPU ready)."""
    begun = time.time()
    proc = subprocess.run([sys.executable, "-c", START_ONLY], capture_output=True, text=True,
                          check=True)
    return {"wall": time.time() - begun, "ready": float(proc.stdout.strip().splitlines()[-1])}


def child(a: str, b: str, c: str, options: dict) -> dict:
    """One fresh Python process's product, timed from outside and from inside."""
    begun = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, a, b, c, json.dumps(options)],
                          capture_output=True, text=True, check=True)
    ended = time.time()
    inside = json.loads(proc.stdout.strip().splitlines()[-1])
    run_end = inside["run_zero"] + inside["run_seconds"]
    return {"wall": ended - begun,
            "start_and_import": inside["imported"] - begun,
            "before_run": inside["run_zero"] - inside["called"],
            "run": inside["run_seconds"],
            "after_run": inside["returned"] - run_end,
            "exit": ended - inside["returned"],
            "startup_steps": inside["startup"]}


def command(argv: list[str]) -> float:
    """Seconds of one ``oocgemm`` command (its output discarded)."""
    return timed_command(argv)[0]


#: The command without what ``python -m oocgemm`` starts before its imports (the head start's
#: hints and the GPU's early start): :func:`oocgemm.cli.run` called directly.
PLAIN = "import sys; from oocgemm.cli import run; run()"


def timed_command(argv: list[str], plain: bool = False) -> tuple[float, dict | None]:
    """Seconds of one ``oocgemm`` command, and the summary it prints where ``argv`` asks
    for it as JSON (``--json``); ``plain``: without the head start and the early start
    (:data:`PLAIN`)."""
    begun = time.perf_counter()
    program = ["-c", PLAIN] if plain else ["-m", "oocgemm"]
    proc = subprocess.run([sys.executable, *program, *argv], check=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seconds = time.perf_counter() - begun
    return seconds, json.loads(proc.stdout) if "--json" in argv else None


def predicted(a: str, b: str, c: str, flags: list[str]) -> dict:
    """What ``oocgemm plan`` predicts for the product into ``c`` (a fresh process, as a user
    asks it): the total, and each resource's part."""
    planned = subprocess.run([sys.executable, "-m", "oocgemm", "plan", a, b, "-o", c, *flags,
                              "--json"], capture_output=True, text=True, check=True)
    summary = json.loads(planned.stdout)
    return {"seconds": summary["predicted_seconds"], "parts": summary["predicted_parts"],
            "decisions": summary["decisions"]}


def main(argv=None) -> int:
    import oocgemm
    from benchmarks.storage_floor import drop_caches, product_floor, read_files
    from benchmarks.zarr_stores import product_stores, store_files

    parser = zarr_product_parser(__doc__, n=32768, chunk=4096, device="auto",
                                 memory_limit=None)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="leave the inputs for a later run")
    parser.add_argument("--timelines", default=None,
                        help="a folder for the command's timelines, warm and cold (JSON)")
    args = parser.parse_args(argv)

    threads = machine.cores()
    a, b, c = product_stores(args.zarr, args.n, args.chunk, threads)
    work = os.path.dirname(a)
    options = {"device": args.device}
    flags = ["--device", args.device]
    if args.memory_limit:
        options["memory_limit"] = args.memory_limit
        flags += ["--memory-limit", args.memory_limit]
    files = store_files(a, b)
    doc: dict = {"date": time.strftime("%Y-%m-%d"), "n": args.n, "chunk": args.chunk,
                 "options": options}
    doc["help"] = min(command(["--help"]) for _ in range(5))
    gpu = importlib.util.find_spec("cupy") is not None  # a start-up to time on its own
    doc["start_only"] = (min((start_only() for _ in range(3)), key=lambda r: r["wall"])
                         if gpu else None)

    def timeline(name: str) -> list[str]:  # the command's timeline saved, where asked
        if not args.timelines:
            return []
        os.makedirs(args.timelines, exist_ok=True)
        return ["--timeline", os.path.join(os.path.abspath(args.timelines), f"{name}.json")]

    doc["plan_warm"] = predicted(a, b, c, flags)
    doc["predicted"] = doc["plan_warm"]["seconds"]

    def ready() -> None:  # a new output each time (an overwrite is timed on its own)
        shutil.rmtree(c, ignore_errors=True)
        os.sync()
        read_files(files, threads)

    warm = []
    for _ in range(args.repeat + 1):  # the first pays the process's first-run costs
        ready()
        begun = time.perf_counter()
        oocgemm.multiply(a, b, c, progress=False, **options)
        warm.append(time.perf_counter() - begun)
    doc["warm_process"] = {"first": warm[0], "later": min(warm[1:])}
    fresh, cli = [], []
    for _ in range(args.repeat):
        ready()
        fresh.append(child(a, b, c, options))
        ready()
        cli.append(command(["multiply", a, b, "-o", c, "-q", *flags]))
    doc["fresh_child"] = min(fresh, key=lambda r: r["wall"])
    doc["cli_warm"] = min(cli)
    doc["cli_warm_of_warm_process"] = doc["cli_warm"] / doc["warm_process"]["later"]
    later = doc["warm_process"]["later"]
    if gpu:
        doc["start_only_of_warm_process"] = (doc["start_only"]["wall"] + later) / later
    if args.timelines:
        ready()
        command(["multiply", a, b, "-o", c, "-q", *flags, *timeline("warm")])
    read_files(files, threads)  # c is there, just written: replaced
    doc["cli_overwrite"] = command(["multiply", a, b, "-o", c, "--overwrite", "-q", *flags])

    c_bytes = args.n * args.n * 8
    floor = product_floor([a, b], c_bytes, work, threads)
    doc["floor"] = floor["seconds"]
    doc["floor_parts"] = floor
    cold, plain = [], []
    for _ in range(args.repeat):  # the command, and the same without its head start (turns)
        for runs, bare in ((cold, False), (plain, True)):
            shutil.rmtree(c, ignore_errors=True)
            doc["dropped"] = drop_caches(files)
            doc["plan_cold"] = predicted(a, b, c, flags)  # reads no data: inputs stay cold
            runs.append(timed_command(["multiply", a, b, "-o", c, "-q", "--json", *flags],
                                      plain=bare))
    doc["cli_cold"], summary = min(cold, key=lambda r: r[0])
    doc["cold_run"] = summary["seconds"]  # the run itself, as the command reports it
    for name, runs in (("cli_cold_runs", cold), ("cli_cold_plain_runs", plain)):
        doc[name] = [{"wall": wall, "run": summary["seconds"]} for wall, summary in runs]
    doc["cli_cold_plain"] = min(wall for wall, _ in plain)
    shutil.rmtree(c, ignore_errors=True)
    drop_caches(files)  # where a cold process's time goes (its libraries read cold too)
    doc["fresh_child_cold"] = child(a, b, c, options)
    if args.timelines:
        shutil.rmtree(c, ignore_errors=True)
        drop_caches(files)
        command(["multiply", a, b, "-o", c, "-q", *flags, *timeline("cold")])
    doc["cli_cold_of_floor"] = doc["cli_cold"] / floor["seconds"]
    doc["cli_cold_plain_of_floor"] = doc["cli_cold_plain"] / floor["seconds"]
    doc["predicted_of_warm"] = doc["predicted"] / doc["warm_process"]["later"]
    doc["predicted_of_cold"] = doc["plan_cold"]["seconds"] / doc["cli_cold"]
    doc["predicted_of_cold_run"] = doc["plan_cold"]["seconds"] / doc["cold_run"]
    report(doc, args.json)
    remove_all(c) if args.keep else remove_all(a, b, c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
