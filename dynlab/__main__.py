"""``python -m dynlab``: the ``dynlab`` command."""
from dynlab._entry import main

if __name__ == "__main__":
    main(prog_name="dynlab")
