"""``python -m oocgemm``: the same as the ``oocgemm`` command."""

from .cli import run

if __name__ == "__main__":
    run()
