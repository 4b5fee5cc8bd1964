"""What the printing commands share (plan, evaluate, predict, export): how they end.

    if __name__ == "__main__":
        sys.exit(cli.run(main))

A reader that stops reading (`python3 -m minibp.evaluate RUN --per-class | head`) ends the command quietly,
with the status 128 + SIGPIPE (141) that a program killed by SIGPIPE has, as `head`'s other writers do:
Python turns the closed pipe into a BrokenPipeError at the next write, which would otherwise end in a
traceback and a second one at exit. Ctrl-C ends it in one line with status 130 (128 + SIGINT): what these
commands write, they publish whole (integrity.atomic_file), so nothing is left half written.
"""
import os
import signal
import sys


def run(main):
    """main()'s exit status; 141 without a traceback when stdout's reader has gone, 130 after Ctrl-C."""
    try:
        status = main()
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit writes there
        status = 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        print("stopped: no file is left half written", file=sys.stderr)
        status = 128 + signal.SIGINT
    return status
