"""A minimal PEP 517 build backend for this test distribution (standard library only).

It reads ``[project]`` from ``pyproject.toml`` (name, version, description,
requires-python, dependencies, entry-points) and packs the pure-Python package
next to it into a ``py3-none-any`` wheel, or the source tree into an sdist.
Nothing is written into the source tree.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "dynlab_example_plugin"
_EPOCH = (2020, 1, 1, 0, 0, 0)


def _load_toml(fh):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            from pip._vendor import tomli as tomllib  # pip runs this backend, so pip is importable
    return tomllib.load(fh)


def _project() -> dict:
    with open(HERE / "pyproject.toml", "rb") as fh:
        return _load_toml(fh)["project"]


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _metadata(project: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}"]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def _entry_points(project: dict) -> str:
    out = []
    for group, points in project.get("entry-points", {}).items():
        out.append(f"[{group}]")
        out += [f"{name} = {target}" for name, target in points.items()]
        out.append("")
    return "\n".join(out)


def _package_files() -> list[tuple[str, bytes]]:
    return [(path.relative_to(HERE).as_posix(), path.read_bytes())
            for path in sorted((HERE / PACKAGE).rglob("*.py")) if "__pycache__" not in path.parts]


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project = _project()
    dist, version = _normalised(project["name"]), project["version"]
    info = f"{dist}-{version}.dist-info"
    files = _package_files()
    files.append((f"{info}/METADATA", _metadata(project).encode()))
    files.append((f"{info}/WHEEL",
                  b"Wheel-Version: 1.0\nGenerator: _wheel_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    files.append((f"{info}/entry_points.txt", _entry_points(project).encode()))
    record = [_record_line(arcname, data) for arcname, data in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    wheel_name = f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files:
            entry = zipfile.ZipInfo(arcname, date_time=_EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, data)
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    dist, version = _normalised(project["name"]), project["version"]
    root = f"{dist}-{version}"
    files = [("pyproject.toml", (HERE / "pyproject.toml").read_bytes()),
             ("_wheel_backend.py", Path(__file__).read_bytes()),
             ("PKG-INFO", _metadata(project).encode())] + _package_files()
    sdist_name = f"{root}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, sdist_name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for arcname, data in files:
            member = tarfile.TarInfo(f"{root}/{arcname}")
            member.size, member.mode = len(data), 0o644
            tar.addfile(member, io.BytesIO(data))
    return sdist_name
