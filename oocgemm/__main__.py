"""``python -m oocgemm`` and the ``oocgemm`` command: where the command will compute on GPUs,
their driver and contexts start in a thread of their own beside the imports
(:func:`oocgemm.cuda.startup.early`), then :func:`oocgemm.cli.run`."""

import sys


def run() -> None:
    from .devices import command_gpus

    gpus = command_gpus(sys.argv[1:])
    if gpus is not False:
        from .cuda import startup

        startup.early(gpus)
    from .cli import run as run_cli

    run_cli()


if __name__ == "__main__":
    run()
