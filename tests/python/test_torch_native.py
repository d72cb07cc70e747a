"""reservoir._torch_native without PyTorch: the build of the cacheInfo part fails
with a message that says what is missing, never half-installs, and is keyed and
cached as documented. (The build itself and cuDNN's benchmark run on the GPU:
tests/python/gpu/test_torch_memory_api.py, CudnnBenchmarkTest.)"""

import os
import tempfile
import types
import unittest
from unittest import mock

from reservoir import _torch_native


def fake_torch(folder, version="2.11.0"):
    """A module with what the builder reads of torch: __file__, __version__, _C."""
    os.makedirs(os.path.join(folder, "torch", "include"), exist_ok=True)
    module = types.ModuleType("torch")
    module.__file__ = os.path.join(folder, "torch", "__init__.py")
    module.__version__ = version
    module._C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
    return module


class TorchNativeTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.addCleanup(self.folder.cleanup)
        patcher = mock.patch.dict(os.environ, {
            "RESERVOIR_CACHE_DIR": os.path.join(self.folder.name, "cache"),
            "CUDA_HOME": os.path.join(self.folder.name, "no-cuda"),
        })
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_the_source_ships_with_the_package(self):
        self.assertTrue(os.path.isfile(_torch_native.SOURCE), _torch_native.SOURCE)
        with open(_torch_native.SOURCE) as f:
            text = f.read()
        self.assertIn("void cacheInfo(c10::DeviceIndex device, size_t* largest) override", text)
        self.assertIn("reservoir_torch_native_install", text)

    def test_the_library_headers_come_from_the_checkout_or_the_package(self):
        # From a checkout: include/ and src/ (reservoir.h, the PyTorch hooks' header).
        root = os.path.dirname(os.path.dirname(_torch_native.HERE))  # python/reservoir/
        dirs = _torch_native.include_dirs()
        self.assertEqual(dirs, [os.path.join(root, "include"), os.path.join(root, "src")])
        self.assertEqual(_torch_native._headers(dirs),
                         [os.path.join(root, "include", "reservoir", "reservoir.h"),
                          os.path.join(root, "src", "integrations", "torch_hooks.hpp")])
        # Installed: the copies bundled into the package come first.
        bundled = os.path.join(self.folder.name, "bundled")
        for name in _torch_native.HEADERS:
            os.makedirs(os.path.dirname(os.path.join(bundled, name)), exist_ok=True)
            open(os.path.join(bundled, name), "w").close()
        self.assertEqual(_torch_native.include_dirs(bundled=bundled), [bundled])
        # Neither: the error names the headers and says how to get them.
        with self.assertRaises(_torch_native.NativeBuildError) as caught:
            _torch_native.include_dirs(bundled=os.path.join(self.folder.name, "none"),
                                       root=self.folder.name)
        self.assertIn("reservoir/reservoir.h", str(caught.exception))
        self.assertIn("pip install ./python", str(caught.exception))

    def test_the_compiler_is_pointed_at_the_library_headers(self):
        torch = fake_torch(os.path.join(self.folder.name, "site"))
        with mock.patch.object(_torch_native, "_cuda_include_dirs", return_value=[]):
            command = _torch_native._command(torch, "c++", "out.so", "c++20")
        for folder in _torch_native.include_dirs():
            self.assertIn(folder, command)
            self.assertEqual(command[command.index(folder) - 1], "-I")

    def test_the_cache_key_follows_the_library_headers(self):
        torch = fake_torch(os.path.join(self.folder.name, "site"))
        bundled = os.path.join(self.folder.name, "bundled")
        for name in _torch_native.HEADERS:
            os.makedirs(os.path.dirname(os.path.join(bundled, name)), exist_ok=True)
            with open(os.path.join(bundled, name), "w") as f:
                f.write("// one\n")
        with mock.patch.object(_torch_native, "BUNDLED_INCLUDE", bundled):
            before = _torch_native._key(torch)
            with open(os.path.join(bundled, _torch_native.HEADERS[0]), "w") as f:
                f.write("// two\n")
            self.assertNotEqual(_torch_native._key(torch), before)

    def test_a_failed_build_says_why_and_leaves_nothing_behind(self):
        torch = fake_torch(os.path.join(self.folder.name, "site"))
        with mock.patch.object(_torch_native, "_cuda_include_dirs", return_value=[]):
            with self.assertRaises(_torch_native.NativeBuildError) as caught:
                _torch_native.build(torch)
        # The compiler ran and could not find PyTorch's headers.
        self.assertIn("compiling", str(caught.exception))
        self.assertIn("CUDACachingAllocator.h", str(caught.exception))
        cache = os.environ["RESERVOIR_CACHE_DIR"]
        self.assertEqual(os.listdir(cache), ["build.lock"],
                         "a partial library was left in the cache")

    def test_a_cached_library_is_used_without_compiling(self):
        torch = fake_torch(os.path.join(self.folder.name, "site"))
        cache = os.environ["RESERVOIR_CACHE_DIR"]
        os.makedirs(cache)
        cached = os.path.join(cache, "libreservoir_torch_native-%s.so" % _torch_native._key(torch))
        open(cached, "w").close()
        with mock.patch.object(_torch_native, "_compile",
                               side_effect=AssertionError("compiled again")):
            self.assertEqual(_torch_native.build(torch), cached)

    def test_missing_cuda_headers_are_named(self):
        torch = fake_torch(os.path.join(self.folder.name, "site"))
        with mock.patch.object(_torch_native.os.path, "exists",
                               side_effect=lambda p: not p.endswith("cuda_runtime_api.h")
                               and os.path.lexists(p)):
            with self.assertRaises(_torch_native.NativeBuildError) as caught:
                _torch_native._cuda_include_dirs(torch)
        self.assertIn("cuda_runtime_api.h", str(caught.exception))
        self.assertIn("CUDA_HOME", str(caught.exception))

    def test_no_compiler_is_reported(self):
        with mock.patch.object(_torch_native.shutil, "which", return_value=None):
            with self.assertRaises(_torch_native.NativeBuildError) as caught:
                _torch_native._compiler()
        self.assertIn("no C++ compiler", str(caught.exception))

    def test_install_reports_instead_of_raising(self):
        torch = fake_torch(os.path.join(self.folder.name, "site"))
        with mock.patch.object(_torch_native, "_cuda_include_dirs", return_value=[]):
            active, reason = _torch_native.install(torch)
        self.assertFalse(active)
        self.assertIn("compiling", reason)
        self.assertEqual(_torch_native.status(), {"active": False, "reason": reason})

    def test_switched_off_by_the_environment(self):
        with mock.patch.dict(os.environ, {"RESERVOIR_TORCH_NATIVE": "0"}):
            self.assertFalse(_torch_native.enabled())
            active, reason = _torch_native.install(fake_torch(self.folder.name))
        self.assertFalse(active)
        self.assertEqual(reason, "RESERVOIR_TORCH_NATIVE=0")

    def test_the_cache_key_follows_the_torch_version(self):
        site = os.path.join(self.folder.name, "site")
        a = _torch_native._key(fake_torch(site, "2.11.0"))
        b = _torch_native._key(fake_torch(site, "2.12.0"))
        self.assertNotEqual(a, b)
        self.assertEqual(a, _torch_native._key(fake_torch(site, "2.11.0")))


if __name__ == "__main__":
    unittest.main()
