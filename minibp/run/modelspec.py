"""A model spec: the name of one of the paper's ResNets (minibp/models.py's by_name), or your own net.

Your own net: a model spec "FILE.py:FUNCTION" or "package.module:FUNCTION" names a function that build()
calls as FUNCTION(input_shape=..., classes=..., **model_args) (the shape and classes of the data) and that
returns an uncompiled Net (docs/vgg_example.py is one). A run records the spec, its file made absolute
(canonical), and the arguments, and builds the net again from them to resume or evaluate:

    net = build("docs/vgg_example.py:build", model_args={"width": 16}, input_shape=(28, 28, 1), classes=10)
    net = build("resnet20", input_shape=(28, 28, 1), classes=10)   # a name: by_name

A trained run is loaded (evaluate, minibp.load, predict, export) without its file: rebuild() builds the net its
checkpoint keeps as data (Net.structure), so no code of the run's runs. A file is imported (a fresh run, a resume, a
run saved before checkpoints kept their net) only if you or the system own it and no one else may write it.

Your code runs in the trainer's process: an import or a function that takes longer than SLOW_S seconds is said
on stderr every SLOW_S seconds, with the line it is at, so that one that never returns is seen for what it is; one
that changes the working folder (os.chdir) is taken back to the one it was called in, with a warning, so that the
run's relative paths (its folder, its data) still name what they named.
"""
import contextlib
import importlib
import importlib.util
import os
import stat
import sys
import threading
import time
from pathlib import Path

from .. import models
from ..integrity import file_digest, shown
from ..net import Net


# evaluate's, predict's and export's --model: for a run whose checkpoint does not keep its net as data
MODEL_HELP = ("a run saved before checkpoints kept their net as data: its model file's new place, FILE.py:FUNCTION "
              "(default: the file it was trained with; a run that keeps its net needs none, and refuses it)")


def is_own(spec):
    """Whether a model spec names your own function ("FILE.py:FUNCTION", "package.module:FUNCTION")."""
    return ":" in str(spec)


def _where(spec):
    """(file or module, function name, whether it is a file) of your own model spec; a ValueError otherwise."""
    where, _, name = str(spec).rpartition(":")
    is_file = where.endswith(".py")
    if not name.isidentifier() or not (is_file or all(part.isidentifier() for part in where.split("."))):
        raise ValueError(f"model {spec!r}: give FILE.py:FUNCTION or package.module:FUNCTION")
    return where, name, is_file


def canonical(spec):
    """The spec a run records: a file's path made absolute, so that the run resumes and evaluates from any
    folder; names and modules as they are."""
    if not is_own(spec):
        return spec
    where, name, is_file = _where(spec)
    return f"{Path(where).resolve()}:{name}" if is_file else spec


def describe(spec, model_args=None):
    """A model spec as messages show it: resnet20, vgg_example.py:build(width=8)."""
    if not is_own(spec):
        return spec
    where, name, is_file = _where(spec)
    arguments = ", ".join(f"{k}={v!r}" for k, v in (model_args or {}).items())
    return f"{Path(where).name if is_file else where}:{name}({arguments})"


def short_name(spec):
    """A model spec in a folder name: resnet20, vgg_example.build."""
    if not is_own(spec):
        return spec
    where, name, is_file = _where(spec)
    return f"{Path(where).stem if is_file else where}.{name}"


def check_spec(spec, model_args, *, imagenet=False, find=True):
    """The checks of a model spec that need neither the data nor running your code: a ResNet's name (which
    takes no arguments), or a file that exists, or a module that can be found (find=False: the spec's form alone,
    for a run that is only loaded, whose net its checkpoint keeps)."""
    if not is_own(spec):
        models.depth_of(spec, imagenet=imagenet)
        if model_args:
            raise ValueError(f"--model-arg is for your own net (--model FILE.py:FUNCTION); {spec} takes none")
        return
    where, _, is_file = _where(spec)
    if not find:
        return
    if is_file and not Path(where).is_file():
        raise ValueError(f"model {spec}: no file {where}")
    if not is_file:
        try:
            found = importlib.util.find_spec(where)
        except (ImportError, ValueError):  # a parent package that does not import
            found = None
        if found is None:
            raise ValueError(f"model {spec}: no module {where} on the Python path")


def found(spec):
    """Whether your own model spec's file or module is there (check_spec's question, as a yes or no)."""
    try:
        check_spec(spec, None)
    except ValueError:
        return False
    return True


def file_record(spec):
    """{path, sha256} of your own model spec's file as it is now (what a checkpoint records of it), or None for a
    name, a module, or a file that is not there."""
    if not is_own(spec):
        return None
    where, _, is_file = _where(spec)
    if not is_file or not Path(where).is_file():
        return None
    return dict(path=where, sha256=file_digest(where))


def load_function(spec):
    """The function your own model spec names, its file or module imported afresh (an edited file is read
    again); a ValueError naming the spec and what failed."""
    where, name, is_file = _where(spec)
    global _importing
    _importing = where
    try:
        with said_while_slow(f"importing {where}"), _working_folder_kept(f"importing {where}"):
            module = _imported(where, is_file=is_file)
    except (Exception, SystemExit) as e:  # whatever your code raises as it imports: one line, not a traceback
        raise ValueError(f"model {spec}: cannot import {where} ({_one_line(e)})") from None
    finally:
        _importing = None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"model {spec}: {where} has no function {name}")
    return function


def _imported(where, *, is_file):
    """The module of a file (imported afresh, once it is known to be one only you or the system could have written:
    _not_yours) or a module name."""
    if is_file:
        why = _not_yours(where)
        if why:
            raise ValueError(f"{why}: minibp imports only a model file that you or the system own and that no one "
                             f"else may write (chmod go-w {where}, or copy it to a file of your own)")
        module_name = f"minibp_model_{Path(where).stem}"  # in sys.modules, as an import puts it (dataclasses)
        found = importlib.util.spec_from_file_location(module_name, where)
        module = importlib.util.module_from_spec(found)
        sys.modules[module_name] = module
        found.loader.exec_module(module)
        return module
    return importlib.import_module(where)


def _not_yours(path):
    """Why the file at path could hold someone else's code (owned by another user, or writable by others), or None.
    The system's (root's) files are trusted as Python trusts its own."""
    st = os.stat(path)
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


SLOW_S = 10  # seconds your code may take to import or to build its net before minibp says what it is doing


@contextlib.contextmanager
def said_while_slow(what):
    """Say on stderr, every SLOW_S seconds the block takes, that it is still `what` and the line of Python it is
    at: a model file that never returns would otherwise hang a start without a word."""
    done, caller, start = threading.Event(), threading.get_ident(), time.monotonic()

    def watch():
        while not done.wait(SLOW_S):
            frame = sys._current_frames().get(caller)
            at = f", at {shown(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else ""
            print(f"minibp: still {what} after {time.monotonic() - start:.0f} s{at} (Ctrl-C stops it)",
                  file=sys.stderr, flush=True)
    watcher = threading.Thread(target=watch, name="minibp-slow-model", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


@contextlib.contextmanager
def _working_folder_kept(what):
    """The block (your code) ends in the working folder it began in, said on stderr where it had moved: an os.chdir
    would move every relative path of the run (its folder, whose lock the trainer checks by that path, its data)."""
    folder = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # (held: found again even if renamed)
    try:
        yield
    finally:
        try:
            here, there = os.stat("."), os.fstat(folder)
            if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
                moved_to = os.getcwd()
                os.fchdir(folder)
                print(f"warning: {what} changed the working folder to {shown(moved_to)}; minibp went back to "
                      f"{shown(os.getcwd())}, where the run's relative paths are", file=sys.stderr)
        finally:
            os.close(folder)


_importing = None  # the file or module load_function is importing now, else None


def importing():
    """The file or module minibp is importing to rebuild your net (a resume, evaluate, load), else None: a
    script's training code that runs then (fit, outside `if __name__ == "__main__":`) would train again."""
    return _importing


def spec_of(function):
    """The spec of a module-level function (train.fit's model), by which a resume or python3 -m minibp.evaluate
    imports it again: package.module:FUNCTION for a module in a package, else the file that defines it."""
    name = getattr(function, "__qualname__", "")
    if not name.isidentifier():  # a lambda, a nested function, a method, a partial
        raise ValueError(f"the model must be a module-level function, which a resume and python3 -m minibp.evaluate "
                         f"can import again, not {function!r}")
    module = sys.modules.get(function.__module__)
    if module is not None and module.__name__ != "__main__" and getattr(module, "__package__", None):
        return f"{module.__name__}:{name}"
    file = function.__code__.co_filename
    if not file.endswith(".py") or not Path(file).is_file():
        raise ValueError(f"{name} is not defined in a .py file ({file}): define the model's function in one, so "
                         "that a resume and python3 -m minibp.evaluate can import it again")
    return f"{Path(file).resolve()}:{name}"


def build(spec, *, model_args=None, imagenet=False, input_shape, classes, function=None):
    """The uncompiled net a model spec gives for data of input_shape and classes: by_name's ResNet, or your
    own function's net (`function`, or the one the spec names: load_function), checked: a Net, uncompiled,
    ending in a classifier that fits the data. A ValueError naming the spec and the fault otherwise."""
    if not is_own(spec):
        return models.by_name(spec, imagenet=imagenet, input_shape=input_shape, classes=classes)
    function = function or load_function(spec)
    called = describe(spec, model_args)
    try:
        with said_while_slow(f"calling {called}"), _working_folder_kept(f"calling {called}"):
            net = function(input_shape=tuple(input_shape), classes=int(classes), **(model_args or {}))
    except (Exception, SystemExit) as e:  # your code's failure (even sys.exit), named in one line
        raise ValueError(f"model {called} raised {_one_line(e)}") from None
    fault = (f"returned {type(net).__name__}, not a minibp.net.Net" if not isinstance(net, Net) else
             "returned a compiled net: return it uncompiled (the trainer compiles it for the run's batch and store)"
             if net.arena is not None else
             "returned a net without a classifier: end it with net.classifier(classes)" if net.classes is None else
             f"returned a net for {net.classes} classes; the data has {classes}" if net.classes != classes else
             f"returned a net for input {net.input_shape}; the data's images are {tuple(input_shape)}"
             if net.input_shape != tuple(input_shape) else None)
    if fault:
        raise ValueError(f"model {called} {fault}")
    return net


def rebuild(config, saved, *, input_shape, classes, model=None):
    """The uncompiled net of a trained run (evaluate, minibp.load, predict, export, --init-from), for data of
    input_shape and classes: built from the structure its checkpoint (saved) keeps, so that no code of the run's
    runs; a run saved before checkpoints kept one is built by its model spec, its file imported (a ValueError
    naming the file where it is gone, and the option that gives its new place). model: that new place, a spec of
    the run's function in another file or module (--model FILE.py:FUNCTION), for such a run alone."""
    if saved.structure is not None:
        if model is not None:  # never silently ignored
            raise ValueError(f"{saved.path} keeps its net as data and loads without a model file: leave --model out")
        try:
            return Net.from_structure(saved.structure, input_shape=input_shape, classes=classes)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{saved.path} is damaged: its net's structure: {' '.join(str(e).split())}") from None
    spec = config.model if model is None else canonical(model)
    if is_own(spec):
        where, function, is_file = _where(spec)
        if is_file and not Path(where).is_file():
            moved = "" if model is None else f" (--model {model})"
            raise ValueError(f"{saved.path} was written before checkpoints kept their net as data, and builds its net "
                             f"with {where}{moved}, which is not there: give the file's new place with --model "
                             f"FILE.py:{function} (minibp.load(..., model=)), or put it back (a resume with the file "
                             "writes a checkpoint that keeps the net, and loads without it)")
    elif model is not None:
        raise ValueError(f"--model {model}: a run's own model file or module (FILE.py:FUNCTION), not a built-in net")
    return build(spec, model_args=config.model_args, imagenet=config.imagenet, input_shape=input_shape,
                 classes=classes)


def _one_line(error):
    if isinstance(error, SystemExit):
        return f"it called sys.exit({error.code!r})"
    # (a MemoryError, or a bare `raise RuntimeError`, has no message: the line must not end in nothing)
    reason = " ".join(str(error).split()) or ("out of memory" if isinstance(error, MemoryError) else "(no message)")
    return f"{type(error).__name__}: {reason}"
