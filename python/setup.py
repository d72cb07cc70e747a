"""Builds the reservoir package with libreservoir.so inside it: one command,

    python3 -m pip install ./python                          # pip fetches setuptools
    python3 -m pip install --no-build-isolation ./python     # the setuptools installed

The package is pure Python (ctypes) around the library; the headers that
reservoir.torch's native part is compiled with at install time (reservoir.h and
src/integrations/torch_hooks.hpp) are bundled too. The library bundled is,
in order: RESERVOIR_LIBRARY (a path), else the newest libreservoir.so under any
build*/**/src of this repository (build/, build-py/, build/release/, a preset's
build/<preset>/ ...), else one built now with CMake into build/python-package/
(the library target only; needs CMake >= 3.25, a C++20 compiler and zlib's
headers, and downloads nothing). Outside a checkout, without RESERVOIR_LIBRARY,
the package installs without the library and looks for one at run time
(reservoir/_lib.py).

Wheels: setuptools >= 70.1 builds them itself; an older setuptools needs the
`wheel` package, and where that is missing this file brings its own minimal
bdist_wheel (the package has no compiled extension, so the wheel is a zip of the
built files plus metadata) instead of failing with "invalid command 'bdist_wheel'".
"""

import base64
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

from setuptools import Command, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CMAKE_BUILD_DIR = os.path.join(ROOT, "build", "python-package")


def _say(text):
    sys.stderr.write("reservoir: %s\n" % text)


def existing_builds(root=ROOT):
    """Every libreservoir.so under root/build*/**/src, newest first."""
    found = glob.glob(os.path.join(root, "build*", "**", "src", "libreservoir.so"), recursive=True)
    found += glob.glob(os.path.join(root, "build*", "src", "libreservoir.so"))
    found = sorted(set(found), key=os.path.getmtime, reverse=True)
    return found


def _run(command, what):
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise SystemExit("reservoir: %s failed to start (%s): %s" % (what, command[0], error))
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        raise SystemExit(
            "reservoir: %s failed (%s). Building libreservoir.so needs CMake >= 3.25, a C++20 "
            "compiler and zlib's headers (Debian/Ubuntu: apt-get install cmake g++ zlib1g-dev, "
            "or scripts/install-deps.sh); or point RESERVOIR_LIBRARY at a built library.\n%s"
            % (what, " ".join(command), tail)
        )


def build_with_cmake(root=ROOT, build_dir=CMAKE_BUILD_DIR):
    """Configures and builds only the library target; returns its path."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit(
            "reservoir: no libreservoir.so was found (RESERVOIR_LIBRARY, %s/build*/**/src) and "
            "CMake is not installed to build one. Install CMake >= 3.25, a C++20 compiler and "
            "zlib's headers (Debian/Ubuntu: apt-get install cmake g++ zlib1g-dev), or build the "
            "library yourself (cmake -S . -B build && cmake --build build --target reservoir) "
            "and install again." % root
        )
    _say("no built libreservoir.so found; building it with CMake in %s" % build_dir)
    _run([cmake, "-S", root, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
          "-DRESERVOIR_BUILD_TESTS=OFF", "-DRESERVOIR_BUILD_BENCH=OFF",
          "-DRESERVOIR_BUILD_TOOLS=OFF", "-DRESERVOIR_GPU_TESTS=OFF"], "configuring with CMake")
    _run([cmake, "--build", build_dir, "--target", "reservoir", "-j", str(os.cpu_count() or 2)],
         "building libreservoir.so")
    library = os.path.join(build_dir, "src", "libreservoir.so")
    if not os.path.exists(library):
        raise SystemExit("reservoir: CMake finished but %s does not exist" % library)
    return library


def library_to_bundle():
    explicit = os.environ.get("RESERVOIR_LIBRARY")
    if explicit:
        if not os.path.exists(explicit):
            raise SystemExit("reservoir: RESERVOIR_LIBRARY=%s does not exist" % explicit)
        return explicit
    found = existing_builds()
    if found:
        return found[0]
    if os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
        return build_with_cmake()
    _say("not in a Reservoir checkout and RESERVOIR_LIBRARY is not set: installing without "
         "the library (set RESERVOIR_LIBRARY at run time)")
    return None


# The library's headers the native part (reservoir/_native/*.cpp, compiled at
# install time) includes: (folder of the checkout, path under it). Bundled as
# reservoir/_native/include/PATH, where reservoir/_torch_native.py looks first.
NATIVE_HEADERS = (("include", "reservoir/reservoir.h"), ("src", "integrations/torch_hooks.hpp"))


def bundle_native_headers(build_lib, root=ROOT):
    """Copies NATIVE_HEADERS into the package being built; returns how many."""
    copied = 0
    for folder, name in NATIVE_HEADERS:
        source = os.path.join(root, folder, name)
        if not os.path.exists(source):
            _say("%s not found: reservoir.torch's native part cannot be built from this "
                 "package (install it from a Reservoir checkout)" % source)
            continue
        target = os.path.join(build_lib, "reservoir", "_native", "include", name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)
        copied += 1
    return copied


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        bundle_native_headers(self.build_lib)
        library = library_to_bundle()
        if library is None:
            return
        target = os.path.join(self.build_lib, "reservoir", "libreservoir.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(library, target)  # follows the SONAME symlinks
        _say("bundled %s" % library)


def _record_line(root, path):
    with open(path, "rb") as f:
        data = f.read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (os.path.relpath(path, root).replace(os.sep, "/"), digest, len(data))


def _requires_dist(requires_txt):
    """requires.txt of an egg-info as Requires-Dist lines."""
    lines, extra = [], None
    if not os.path.exists(requires_txt):
        return lines
    with open(requires_txt) as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            if line.startswith("[") and line.endswith("]"):
                extra = line[1:-1].split(":")[0] or None
                continue
            marker = '; extra == "%s"' % extra if extra else ""
            lines.append("Requires-Dist: %s%s" % (line, marker))
    return lines


class MinimalBdistWheel(Command):
    """bdist_wheel for setuptools < 70.1 without the wheel package."""

    description = "build a wheel (Reservoir's minimal bdist_wheel)"
    user_options = [("dist-dir=", "d", "where to put the wheel")]

    def initialize_options(self):
        self.dist_dir = None

    def finalize_options(self):
        self.dist_dir = self.dist_dir or "dist"

    def tag(self):
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        return "py3-none-" + platform

    def egg2dist(self, egg_info_dir, dist_info_dir):
        """What setuptools' dist_info command asks of bdist_wheel."""
        os.makedirs(dist_info_dir, exist_ok=True)
        with open(os.path.join(egg_info_dir, "PKG-INFO")) as f:
            headers, _, body = f.read().partition("\n\n")
        requires = _requires_dist(os.path.join(egg_info_dir, "requires.txt"))
        with open(os.path.join(dist_info_dir, "METADATA"), "w") as f:
            f.write(headers.rstrip("\n") + "\n" + "".join(r + "\n" for r in requires))
            f.write("\n" + body)
        with open(os.path.join(dist_info_dir, "WHEEL"), "w") as f:
            f.write("Wheel-Version: 1.0\nGenerator: reservoir-setup\nRoot-Is-Purelib: false\n"
                    "Tag: %s\n" % self.tag())
        top_level = os.path.join(egg_info_dir, "top_level.txt")
        if os.path.exists(top_level):
            shutil.copyfile(top_level, os.path.join(dist_info_dir, "top_level.txt"))
        shutil.rmtree(egg_info_dir)

    def run(self):
        build = self.get_finalized_command("build")
        self.run_command("build")
        root = build.build_lib
        egg_info = self.reinitialize_command("egg_info")  # run again, into the wheel
        egg_info.egg_base = root
        self.run_command("egg_info")
        dist = self.distribution
        name = "%s-%s" % (dist.get_name().replace("-", "_"), dist.get_version())
        dist_info = os.path.join(root, name + ".dist-info")
        if os.path.exists(dist_info):
            shutil.rmtree(dist_info)
        self.egg2dist(egg_info.egg_info, dist_info)
        files = []
        for folder, _, names in os.walk(root):
            for n in names:
                files.append(os.path.join(folder, n))
        os.makedirs(self.dist_dir, exist_ok=True)
        wheel = os.path.join(self.dist_dir, "%s-%s.whl" % (name, self.tag()))
        record = os.path.join(dist_info, "RECORD")
        lines = [_record_line(root, p) for p in sorted(files)]
        lines.append(os.path.relpath(record, root).replace(os.sep, "/") + ",,")
        with open(record, "w") as f:
            f.write("\n".join(lines) + "\n")
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(files) + [record]:
                z.write(path, os.path.relpath(path, root))
        _say("wrote %s" % wheel)


def _commands():
    commands = {"build_py": BuildPyWithLibrary}
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70.1)
    except ImportError:
        try:
            import wheel.bdist_wheel  # noqa: F401
        except ImportError:
            commands["bdist_wheel"] = MinimalBdistWheel
    return commands


if __name__ == "__main__":
    setup(cmdclass=_commands())
