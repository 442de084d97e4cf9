"""``python -m dynlab``: the ``dynlab`` command."""
from dynlab._entry import command_line

if __name__ == "__main__":
    command_line()(prog_name="dynlab")
