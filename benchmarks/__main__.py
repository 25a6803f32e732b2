from benchmarks.cli import main

main(prog_name="python -m benchmarks")
