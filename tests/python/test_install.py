"""Installing the package: ``pip install ./python`` bundles the library (given by
RESERVOIR_LIBRARY, found under any build*/**/src, or built with CMake) and the
installed package imports and works on its own; a missing CMake or a failing
configure says what to install. Needs pip and setuptools (skipped without)."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import unittest

from test_reservoir_package import reservoir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(REPO, "python", "setup.py")


def run_setup_function(code, path=None):
    """Runs code in a fresh interpreter with python/setup.py loaded as `setup`
    (setup() itself runs only as __main__); importing setuptools there keeps it
    away from this process's distutils. Returns the CompletedProcess."""
    prelude = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('reservoir_setup', %r)\n"
        "setup = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(setup)\n" % SETUP
    )
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-c", prelude + code], env=env,
                          capture_output=True, text=True, timeout=300)


HAVE_PIP = importlib.util.find_spec("pip") is not None
HAVE_SETUPTOOLS = importlib.util.find_spec("setuptools") is not None


@unittest.skipUnless(HAVE_PIP and HAVE_SETUPTOOLS, "needs pip and setuptools")
class PipInstallTest(unittest.TestCase):
    def test_installed_package_bundles_the_library_and_works(self):
        with tempfile.TemporaryDirectory() as target:
            env = dict(os.environ, RESERVOIR_LIBRARY=reservoir.library_path())
            env.pop("PYTHONPATH", None)
            result = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                 "--no-index", "--target", target, os.path.join(REPO, "python")],
                env=env, capture_output=True, text=True, timeout=600, cwd=target,
            )
            self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
            bundled = os.path.join(target, "reservoir", "libreservoir.so")
            self.assertTrue(os.path.exists(bundled))
            # The native part's source travels with the package (compiled at install()),
            # and so do the library's headers it includes, copies of the checkout's.
            native = os.path.join(target, "reservoir", "_native")
            self.assertTrue(os.path.exists(os.path.join(native, "torch_native_allocator.cpp")))
            for folder, name in (("include", "reservoir/reservoir.h"),
                                 ("src", "integrations/torch_hooks.hpp")):
                with open(os.path.join(REPO, folder, name)) as f:
                    original = f.read()
                with open(os.path.join(native, "include", name)) as f:
                    self.assertEqual(f.read(), original, name)
            env = {k: v for k, v in os.environ.items()
                   if k not in ("RESERVOIR_LIBRARY", "PYTHONPATH")}
            env.update(PYTHONPATH=target, RESERVOIR_ALLOC_CONF="device:sim")
            check = subprocess.run(
                [sys.executable, "-c",
                 "import reservoir; print(reservoir.library_path()); "
                 "p = reservoir.raw_alloc(4096); reservoir.raw_free(p); print('ok'); "
                 "from reservoir import _torch_native; print(*_torch_native.include_dirs())"],
                env=env, capture_output=True, text=True, timeout=120, cwd=target,
            )
            self.assertEqual(check.returncode, 0, check.stderr)
            lines = check.stdout.split()
            self.assertEqual(lines[0], bundled)
            self.assertEqual(lines[1], "ok")
            # The native part is compiled with the bundled headers.
            self.assertEqual(lines[2:], [os.path.join(native, "include")])


@unittest.skipUnless(HAVE_SETUPTOOLS, "needs setuptools")
class LibrarySearchTest(unittest.TestCase):
    def test_any_build_folder_depth_is_found_newest_first(self):
        with tempfile.TemporaryDirectory() as root:
            paths = [os.path.join(root, *parts, "src", "libreservoir.so") for parts in
                     (("build",), ("build", "release"), ("build-py",), ("build", "asan"))]
            for i, path in enumerate(paths):
                os.makedirs(os.path.dirname(path))
                with open(path, "w") as f:
                    f.write("x")
                os.utime(path, (time.time() + i, time.time() + i))
            result = run_setup_function("print('\\n'.join(setup.existing_builds(%r)))" % root)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(result.stdout.split(), list(reversed(paths)))

    def test_missing_cmake_says_what_to_install(self):
        with tempfile.TemporaryDirectory() as root:
            result = run_setup_function(
                "setup.build_with_cmake(%r, %r)" % (root, os.path.join(root, "build")),
                path=root,  # no cmake there
            )
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("CMake is not installed", result.stderr)
        self.assertIn("apt-get install cmake g++ zlib1g-dev", result.stderr)

    @unittest.skipUnless(__import__("shutil").which("cmake"), "needs cmake")
    def test_failing_configure_shows_cmakes_output_and_advice(self):
        with tempfile.TemporaryDirectory() as root:
            with open(os.path.join(root, "CMakeLists.txt"), "w") as f:
                f.write("cmake_minimum_required(VERSION 3.16)\n"
                        "message(FATAL_ERROR \"no C++20 compiler here\")\n")
            result = run_setup_function(
                "setup.build_with_cmake(%r, %r)" % (root, os.path.join(root, "build")))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("configuring with CMake failed", result.stderr)
        self.assertIn("no C++20 compiler here", result.stderr)
        self.assertIn("RESERVOIR_LIBRARY", result.stderr)


if __name__ == "__main__":
    unittest.main()
