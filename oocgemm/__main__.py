"""``python -m oocgemm``: the same as the ``oocgemm`` command."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="oocgemm")
