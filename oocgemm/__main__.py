"""``python -m oocgemm`` and the ``oocgemm`` command: the first chunk files its product needs
asked of the disk (:func:`oocgemm.headstart.begin`) and, where the command will compute on
GPUs, their driver and contexts started (:func:`oocgemm.cuda.startup.early`), each in a
thread of its own beside the imports; then :func:`oocgemm.cli.run`."""

import sys


def run() -> None:
    from .devices import command_gpus
    from .headstart import begin

    begin(sys.argv[1:])

    gpus = command_gpus(sys.argv[1:])
    if gpus is not False:
        from .cuda import startup

        startup.early(gpus)
    from .cli import run as run_cli

    run_cli()


if __name__ == "__main__":
    run()
