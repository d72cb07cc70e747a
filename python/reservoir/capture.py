"""Records a program's allocation trace for reservoir-replay, in one command:

    python3 -m reservoir.capture --out run.trace.gz train.py --epochs 1
    python3 -m reservoir.capture --out run.trace.gz -m my_package.train --epochs 1

Runs the script (or module) as __main__ with its own arguments, with Reservoir
installed as PyTorch's CUDA allocator and recording every allocation, free,
record_stream and host synchronization (torch.cuda.synchronize,
Stream.synchronize, Event.synchronize give ``s,STREAM`` lines). The trace is
complete when the program ends, however it ends: normally, sys.exit(), an
exception (its traceback as python shows it; the exit status is the program's).
A mistake in the command (an unknown option, a script that cannot be read, a
module not found, a trace path or setting Reservoir refuses) prints one line,
"reservoir.capture: error: ...", and exits with status 2. Then replay it:

    reservoir-replay run.trace.gz --fit

Options (before the script):
    --out PATH       the trace file (".gz" compresses); required
    --config STR     Reservoir settings (RESERVOIR_ALLOC_CONF syntax)
    --no-torch       record without installing Reservoir into PyTorch (programs
                     that call Reservoir directly, or through CuPy)

Without PyTorch installed, --no-torch is implied. The recording is not passed to
child processes: a program that starts others records only its own requests.
"""

import contextlib
import importlib.util
import os
import runpy
import sys
import traceback

PROG = "reservoir.capture"
USAGE = (
    "usage: python3 -m reservoir.capture --out TRACE [--config STR] [--no-torch] "
    "(SCRIPT | -m MODULE) [ARGS...]"
)


class UsageError(Exception):
    """A mistake in the command line or its files: one line on stderr, exit status 2."""


def parse(argv):
    """(options dict, target, target args) from the command line; options["help"]
    when -h or --help comes before the target."""
    options = {"out": None, "config": None, "torch": True, "module": False, "help": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            options["help"] = True
            return options, None, []
        if arg in ("--out", "--config"):
            if i + 1 >= len(argv):
                raise UsageError("%s needs a value" % arg)
            options[arg[2:]] = argv[i + 1]
            i += 2
            continue
        if arg.startswith("--out=") or arg.startswith("--config="):
            key, _, value = arg[2:].partition("=")
            options[key] = value
            i += 1
            continue
        if arg == "--no-torch":
            options["torch"] = False
            i += 1
            continue
        if arg == "-m":
            if i + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            options["module"] = True
            return options, argv[i + 1], argv[i + 2:]
        if arg.startswith("-"):
            raise UsageError("unknown option %s" % arg)
        return options, arg, argv[i + 1:]
    raise UsageError("no script to run")


def _check_target(options, target):
    """Refuses, before anything runs, a script that cannot be read or a module that
    cannot be found (its top-level package: finding a submodule would import the
    package, before the recording starts)."""
    if options["module"]:
        top = target.partition(".")[0]
        try:
            found = top and importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UsageError("No module named %s" % top)  # as python -m says
        return
    if os.path.isdir(target):
        if not os.path.isfile(os.path.join(target, "__main__.py")):
            raise UsageError("can't find '__main__' module in %s" % target)
        return
    try:
        with open(target, "rb"):
            pass
    except OSError as error:
        raise UsageError("cannot read script %s: %s" % (target, error.strerror)) from None


def _torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _recording(options):
    """The context manager that installs (PyTorch) and records."""
    import reservoir

    if options["torch"] and _torch_available():
        import reservoir.torch

        return reservoir.torch.record_trace(options["out"], config=options["config"])
    if options["torch"]:
        sys.stderr.write("%s: PyTorch is not installed; recording the program's direct "
                         "Reservoir calls only\n" % PROG)
    if options["config"] is not None:
        reservoir.update_config(options["config"])
    return reservoir.record_trace(options["out"])


def _start(options):
    """Enters the recording; a setting, trace path or installation it refuses is the
    user's error, not a traceback."""
    from reservoir import ReservoirError, ReservoirLibraryNotFoundError

    stack = contextlib.ExitStack()
    try:
        stack.enter_context(_recording(options))
    except (ReservoirError, ReservoirLibraryNotFoundError, RuntimeError, ValueError,
            OSError) as error:
        raise UsageError(str(error)) from None
    return stack


def _script_frames(tb):
    """The traceback from the first frame of the user's code on: python shows no
    frame of the runner, nor of runpy or the import machinery it calls."""
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<frozen ") or os.path.abspath(name) in ours):
            break
        tb = tb.tb_next
    return tb


def _run_target(options, target):
    """Runs target as __main__; returns its exit status as python would give it."""
    try:
        if options["module"]:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exit_:
        return exit_.code
    except BaseException as error:  # the script's: shown as python shows it
        frames = _script_frames(error.__traceback__)
        if frames is None and isinstance(error, ImportError) and options["module"]:
            raise UsageError(str(error)) from None  # runpy found no such module
        traceback.print_exception(type(error), error, frames)
        return 130 if isinstance(error, KeyboardInterrupt) else 1
    return 0


def run(options, target, args):
    """Runs target as __main__ while recording; returns the exit status."""
    _check_target(options, target)
    sys.argv = [target] + list(args)
    if options["module"]:
        sys.path.insert(0, os.getcwd())
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    with _start(options):
        status = _run_target(options, target)
    sys.stderr.write("%s: trace written to %s; replay it with: reservoir-replay %s --fit\n"
                     % (PROG, options["out"], options["out"]))
    return status


def main(argv=None):
    """The command: exit status 0 for --help, 2 for a usage error (one line on
    stderr), else the program's."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        options, target, args = parse(argv)
        if options["help"]:
            sys.stdout.write("%s\n\n%s" % (USAGE, __doc__))
            return 0
        if not options["out"]:
            raise UsageError("--out TRACE is required")
        return run(options, target, args)
    except UsageError as error:
        text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        sys.stderr.write("%s: error: %s\n" % (PROG, text))
        return 2


if __name__ == "__main__":
    sys.exit(main())
