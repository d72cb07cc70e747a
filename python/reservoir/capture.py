"""Records a program's allocation trace for reservoir-replay, in one command:

    python3 -m reservoir.capture --out run.trace.gz train.py --epochs 1
    python3 -m reservoir.capture --out run.trace.gz -m my_package.train --epochs 1

Runs the script (or module) as __main__ with its own arguments, with Reservoir
installed as PyTorch's CUDA allocator and recording every allocation, free,
record_stream and host synchronization (torch.cuda.synchronize,
Stream.synchronize, Event.synchronize give ``s,STREAM`` lines). The trace is
complete when the program ends, however it ends: normally, sys.exit(), an
exception (the exit status is the program's). Then replay it:

    reservoir-replay run.trace.gz --fit

Options (before the script):
    --out PATH       the trace file (".gz" compresses); required
    --config STR     Reservoir settings (RESERVOIR_ALLOC_CONF syntax)
    --no-torch       record without installing Reservoir into PyTorch (programs
                     that call Reservoir directly, or through CuPy)

Without PyTorch installed, --no-torch is implied. The recording is not passed to
child processes: a program that starts others records only its own requests.
"""

import os
import runpy
import sys

USAGE = (
    "usage: python3 -m reservoir.capture --out TRACE [--config STR] [--no-torch] "
    "(SCRIPT | -m MODULE) [ARGS...]"
)


class UsageError(Exception):
    pass


def parse(argv):
    """(options dict, target, target args) from the command line."""
    options = {"out": None, "config": None, "torch": True, "module": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            raise UsageError(__doc__)
        if arg in ("--out", "--config"):
            if i + 1 >= len(argv):
                raise UsageError("%s needs a value\n%s" % (arg, USAGE))
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
                raise UsageError("-m needs a module name\n%s" % USAGE)
            options["module"] = True
            return options, argv[i + 1], argv[i + 2:]
        if arg.startswith("-"):
            raise UsageError("unknown option %s\n%s" % (arg, USAGE))
        return options, arg, argv[i + 1:]
    raise UsageError("no script to run\n%s" % USAGE)


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
        sys.stderr.write("reservoir.capture: PyTorch is not installed; recording the "
                         "program's direct Reservoir calls only\n")
    if options["config"] is not None:
        reservoir.update_config(options["config"])
    return reservoir.record_trace(options["out"])


def run(options, target, args):
    """Runs target as __main__ while recording; returns the exit status."""
    if options["module"]:
        sys.argv = [target] + list(args)
        sys.path.insert(0, os.getcwd())
    else:
        if not os.path.exists(target):
            raise UsageError("no such script: %s" % target)
        sys.argv = [target] + list(args)
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    status = 0
    try:
        with _recording(options):
            try:
                if options["module"]:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(target, run_name="__main__")
            except SystemExit as exit_:
                status = exit_.code
    finally:
        sys.stderr.write(
            "reservoir.capture: trace written to %s; replay it with: reservoir-replay %s --fit\n"
            % (options["out"], options["out"])
        )
    return status


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        options, target, args = parse(argv)
        if not options["out"]:
            raise UsageError("--out TRACE is required\n%s" % USAGE)
        return run(options, target, args)
    except UsageError as error:
        sys.stderr.write("%s\n" % error)
        return 2


if __name__ == "__main__":
    sys.exit(main())
