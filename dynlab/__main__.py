"""``python -m dynlab``: the ``dynlab`` command."""
from dynlab.cli import main

if __name__ == "__main__":
    main(prog_name="dynlab")
