"""The lazy command group (dynlab/cli/lazy.py, issue 23): ``--help`` lists every command from the table
without importing a command module; a command's module is imported on its first use."""
from __future__ import annotations

import inspect
import subprocess
import sys

from click.testing import CliRunner

from dynlab.cli import main
from dynlab.cli.lazy import COMMANDS, _Listed


def test_the_table_names_every_command_and_its_module():
    commands = main.commands  # imports every module
    assert set(commands) == set(COMMANDS)
    for name, cmd in commands.items():
        assert cmd.callback.__module__ == f"dynlab.cli.{COMMANDS[name][0]}", name


def test_each_short_help_is_the_first_line_of_its_docstring():
    # the first line as click reads it: the first paragraph, its wrapped lines joined
    for name, cmd in main.commands.items():
        first = " ".join(inspect.cleandoc(cmd.callback.__doc__ or cmd.help or "").split("\n\n")[0].split())
        assert COMMANDS[name][1] == first, name
        assert _Listed(name, help=COMMANDS[name][1]).get_short_help_str(80) == cmd.get_short_help_str(80)


def test_help_lists_every_command_with_its_short_help():
    out = CliRunner().invoke(main, ["--help"])
    assert out.exit_code == 0
    listed = [line.split()[0] for line in out.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == sorted(COMMANDS)


def _modules_after(*code: str) -> set:
    script = "import sys; " + "; ".join(code) + "; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_help_imports_no_command_module_and_a_command_only_its_own():
    help_run = ("from dynlab.cli import main",
                "import contextlib, io; f = io.StringIO(); c = contextlib.redirect_stdout(f); c.__enter__()",
                "main.main(['--help'], standalone_mode=False)", "c.__exit__(None, None, None)")
    modules = {f"dynlab.cli.{m}" for m, _ in COMMANDS.values()}
    assert not _modules_after(*help_run) & modules
    models = help_run[:2] + ("main.main(['models'], standalone_mode=False)", "c.__exit__(None, None, None)")
    assert _modules_after(*models) & modules == {"dynlab.cli.disagg"}


def test_an_unknown_command_is_one_line():
    out = CliRunner().invoke(main, ["nosuch"])
    assert out.exit_code == 2 and "No such command 'nosuch'" in out.output


def test_a_count_based_sim_imports_no_latency_model_nor_hashlib(tmp_path):
    # --latency-model's default is not looked up at parse time (RegistryName), so a run without --timing
    # never builds the latency-model registry: aiconfigurator's and blis's modules stay unimported; a
    # Mooncake trace names its own blocks, so hashlib (block hashing) is not imported either
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_length": 512, "hash_ids": [1]}\n{"input_length": 1024, "hash_ids": [1, 2]}\n')
    run = ("from dynlab.cli import main",
           "import contextlib, io; f = io.StringIO(); c = contextlib.redirect_stdout(f); c.__enter__()",
           f"main.main(['sim', '--trace', {str(trace)!r}, '--mode', 'kv-events', '--quiet'], standalone_mode=False)",
           "c.__exit__(None, None, None)")
    modules = _modules_after(*run)
    assert "dynlab.cli.routing" in modules and "dynlab_builtins.strategies" in modules  # the run ran
    assert not modules & {"dynlab_builtins.latency_aic", "dynlab_builtins.latency_blis", "hashlib"}


def test_a_latency_model_given_is_still_checked_when_parsed():
    # only the default skips the lookup: a name given is checked at once, listing the known ones
    out = CliRunner().invoke(main, ["sim", "--latency-model", "nosuch"])
    assert out.exit_code == 2
    assert "unknown latency model 'nosuch'; available: " in out.output and "roofline" in out.output


def _gc_state(setup: str, load: str = "from dynlab._entry import command_line; main = command_line()") -> str:
    script = setup + (
        "import gc\n"
        "class Cycle:\n"
        "    pass\n"
        "import weakref\n"
        "c = Cycle(); c.me = c; ref = weakref.ref(c); del c  # garbage pending before the import\n"
        f"{load}\n"
        "state = [gc.isenabled(), gc.get_freeze_count() > 0]\n"
        "main.get_command(None, 'models')  # a command's module imported: the pause ends there too\n"
        "print(*state, gc.isenabled(), gc.get_freeze_count() > 0, (gc.collect(), ref())[1] is None)\n")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()


def test_start_up_pauses_the_collector_only_while_importing():
    # the console script pauses the cyclic GC while it imports, freezes what the imports made (its own
    # process), and turns it back on
    assert _gc_state("")[:4] == ["True", "True", "True", "True"]


def test_start_up_leaves_a_collector_turned_off_off():
    # a caller that had turned the GC off finds it off: the pause restores the state it found
    assert _gc_state("import gc; gc.disable()\n")[:4] == ["False", "True", "False", "True"]


def test_importing_the_command_line_leaves_the_collector_alone():
    # a library or test user importing dynlab.cli (and running a command through it): nothing is frozen,
    # so the garbage it had pending is still collected
    assert _gc_state("", "from dynlab.cli import main") == ["True", "False", "True", "False", "True"]
