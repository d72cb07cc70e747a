"""Bundles libreservoir.so into the package when one is built.

The package is pure Python (ctypes), but it needs the library at run time. When
building, the library named by RESERVOIR_LIBRARY, else the newest
../build*/src/libreservoir.so of this repository, is copied next to the modules, so
`pip install --target DIR ./python` gives a self-contained package. Without one the
package still installs and finds the library at run time (see reservoir/_lib.py).
"""

import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _built_library():
    explicit = os.environ.get("RESERVOIR_LIBRARY")
    if explicit:
        if not os.path.exists(explicit):
            raise SystemExit("RESERVOIR_LIBRARY=%s does not exist" % explicit)
        return explicit
    found = glob.glob(os.path.join(os.path.dirname(HERE), "build*", "src", "libreservoir.so"))
    found.sort(key=os.path.getmtime, reverse=True)
    return found[0] if found else None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = _built_library()
        if library is None:
            print("reservoir: no built libreservoir.so found; the package will look for it "
                  "at run time (RESERVOIR_LIBRARY or the repository's build folders)")
            return
        target = os.path.join(self.build_lib, "reservoir", "libreservoir.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(library, target)  # follows the SONAME symlinks
        print("reservoir: bundled %s" % library)


setup(cmdclass={"build_py": BuildPyWithLibrary})
