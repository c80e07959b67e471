"""Builds the `ferry` Python package for pip (pyproject.toml): the pure-Python files of
python/ferry and the compiled module _ferry, which CMake builds for the Python running pip.

    python3 -m venv --system-site-packages venv
    venv/bin/pip install --no-build-isolation --no-deps .

FERRY_BUILD_DIR=<a configured ferry build> takes _ferry from that build (`cmake --build
<dir> --target _ferry` first; it must be for the same Python version) instead of building
it, which takes minutes on a small machine. FERRY_PIP_BUILD=<folder> puts setuptools' and
CMake's own work there (default: build/pip in this checkout).
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
# One version for the project, libferry and this package: CMakeLists.txt's project().
VERSION = re.search(r"project\(ferry VERSION ([0-9.]+)",
                    (ROOT / "CMakeLists.txt").read_text()).group(1)
WORK = pathlib.Path(os.environ.get("FERRY_PIP_BUILD") or ROOT / "build" / "pip").resolve()


class CMakeBuild(build_ext):
    """_ferry from CMake (python/CMakeLists.txt), for this interpreter."""

    def build_extension(self, ext):
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        given = os.environ.get("FERRY_BUILD_DIR")
        if given:
            build = pathlib.Path(given).resolve()
        else:
            build = WORK / "cmake"
            subprocess.check_call([
                "cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                f"-DPython_EXECUTABLE={sys.executable}", "-DBUILD_TESTING=OFF",
                "-DFERRY_BENCH=OFF"])
            subprocess.check_call(["cmake", "--build", str(build), "--target", "_ferry",
                                   "-j", str(os.cpu_count() or 2)])
        module = build / "python" / "ferry" / f"_ferry{suffix}"
        if not module.exists():
            found = sorted(p.name for p in (build / "python" / "ferry").glob("_ferry*.so"))
            raise RuntimeError(
                f"{module} does not exist (found: {', '.join(found) or 'none'}): build the "
                f"_ferry target of {build} for {sys.executable} (Python "
                f"{sys.version_info[0]}.{sys.version_info[1]}), or unset FERRY_BUILD_DIR")
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(module, target)


WORK.mkdir(parents=True, exist_ok=True)
setup(
    version=VERSION,
    packages=["ferry", "ferry.vllm"],
    package_dir={"ferry": "python/ferry"},
    ext_modules=[Extension("ferry._ferry", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # Out of the way of the CMake build folder and of other builds in the same checkout.
    options={"build": {"build_base": str(WORK / "setuptools")},
             "egg_info": {"egg_base": str(WORK)}},
    zip_safe=False,
)
