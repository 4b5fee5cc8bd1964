"""What the commands share (train, evaluate, predict, export, plan, plot, prepare): how they end.

    if __name__ == "__main__":
        sys.exit(cli.run(main))

A reader that stops reading (`python3 -m minibp.evaluate RUN --per-class | head`) ends the command quietly,
with the status 128 + SIGPIPE (141) that a program killed by SIGPIPE has, as `head`'s other writers do:
Python turns the closed pipe into a BrokenPipeError at the next write, which would otherwise end in a
traceback and a second one at exit. Ctrl-C ends it in one line with status 130 (128 + SIGINT), and SIGTERM (a
scheduler's stop, kill's default) alike with 143: what these commands write, they publish whole
(integrity.atomic_file, whose temporary file goes when an interrupt passes through it), so nothing is left half
written.

SIGTERM raises Terminated where the command is, as Ctrl-C raises KeyboardInterrupt. Both are handled from the
first moment of `python3 -m minibp.X`: minibp/__init__.py calls starting() before the command's imports (most of
a second: NumPy, h5py, CuPy), and an interrupt that no code of the command handles (one during those imports)
is one line and its status too, never a traceback.
"""
import atexit
import os
import signal
import sys


class Terminated(BaseException):
    """SIGTERM, raised where the command is (starting()). A BaseException, as KeyboardInterrupt is, so that
    `except Exception` lets it pass and the command ends as it ends on Ctrl-C, with status 143."""


INTERRUPTS = (KeyboardInterrupt, Terminated)


def status_of(interrupt):
    """The exit status of a command ended by an interrupt: 130 after Ctrl-C, 143 after SIGTERM."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


def _stopped(interrupt):
    return "stopped by SIGTERM" if isinstance(interrupt, Terminated) else "stopped"


def run(main):
    """main()'s exit status; 141 without a traceback when stdout's reader has gone, 130 after Ctrl-C, 143 after
    SIGTERM."""
    try:
        status = main()
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit writes there
        status = 128 + signal.SIGPIPE
    except INTERRUPTS as e:
        print(f"{_stopped(e)}: no file is left half written", file=sys.stderr)
        status = status_of(e)
    return status


def command():
    """The module this process runs as `python3 -m MODULE` (read off sys.orig_argv), or None."""
    argv = list(getattr(sys, "orig_argv", ()))[1:]
    while argv:
        arg = argv.pop(0)
        if arg == "-m":
            return argv[0] if argv else None
        if arg.startswith("-m"):
            return arg[2:]
        if arg in ("-X", "-W"):  # an option's value
            argv = argv[1:]
        elif not arg.startswith("-") or arg in ("-", "--") or arg.startswith("-c"):  # a script, stdin, -c CODE
            return None
    return None


def _terminate(number, frame):
    raise Terminated()


def starting(name):
    """python3 -m `name` (a minibp command) begins: SIGTERM raises Terminated from here on (where nothing else
    chose what it does: an ignored SIGTERM stays ignored), and an interrupt that reaches the top unhandled is one
    line and its status."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    previous = sys.excepthook

    def unhandled(kind, error, traceback):
        if not issubclass(kind, INTERRUPTS):
            return previous(kind, error, traceback)
        print(f"{_stopped(error)}: no file is left half written" if _in_main(traceback) else
              f"{'SIGTERM' if kind is Terminated else 'interrupted'} while python3 -m {name} started: nothing "
              "was written", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        atexit._run_exitfuncs()  # (what exit would run: os._exit, the one way to the status, skips it)
        os._exit(status_of(error))
    sys.excepthook = unhandled


def _in_main(traceback):
    """Whether the traceback passes through the command's main() (else it came while the command imported)."""
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "__main__":
            return True
        traceback = traceback.tb_next
    return False
