"""Output files are replaced atomically without harming links, special files or permissions."""
from __future__ import annotations

import os
import stat

import pytest

from dynlab.atomic import replace_file
from dynlab.cli.common import write_atomic
from dynlab.errors import DynlabError


def test_new_file_gets_the_umask_mode(tmp_path):
    out = tmp_path / "o.json"
    write_atomic(str(out), "x\n")
    umask = os.umask(0)
    os.umask(umask)
    assert out.read_text() == "x\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_existing_mode_is_kept(tmp_path):
    out = tmp_path / "o.json"
    out.write_text("old")
    out.chmod(0o640)
    write_atomic(str(out), "new")
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == 0o640


def test_a_symlink_stays_a_link_and_its_target_is_replaced(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(str(link), "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_device_is_written_through_not_replaced():
    before = os.stat("/dev/null")
    write_atomic("/dev/null", "discarded")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_failure_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "o.json"
    out.write_text("old")

    def boom(name):
        with open(name, "w") as fh:
            fh.write("partial")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        replace_file(str(out), boom)
    assert out.read_text() == "old"
    assert os.listdir(tmp_path) == ["o.json"]


@pytest.mark.parametrize("path,message", [("missing-dir/o.json", "does not exist"), (".", "is a directory")])
def test_bad_destinations_name_the_path(tmp_path, path, message):
    with pytest.raises(DynlabError, match=message):
        write_atomic(str(tmp_path / path), "x")
