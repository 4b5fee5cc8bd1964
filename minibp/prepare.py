"""Download public data sets, or read a folder of your images, and convert them to the HDF5 files minibp
trains from.

    python3 -m minibp.prepare fashion-mnist            # from /usr/share/datasets/fashion-mnist, else downloads
    python3 -m minibp.prepare cifar10                  # downloads the official "python version" archive
    python3 -m minibp.prepare cifar100 --archive cifar-100-python.tar.gz   # an archive you already have
    python3 -m minibp.prepare cifar10 --out data/      # where the .h5 files go (default: data/)
    python3 -m minibp.prepare folder shapes --out data/shapes.h5             # shapes/train/CLASS/*.png, val/, test/
    python3 -m minibp.prepare folder shapes --out data/shapes.h5 --size 32x32   # every image resized to 32x32
    python3 -m minibp.prepare folder shapes --size 32x32 --resize crop   # keeping the aspect: cut (or pad: black)

A folder of your images (io/images.py) is in the common layout: DIR/train/CLASS/*.png|jpg|tif, one folder a
class, and DIR/val and DIR/test alike where you have them (without test/, a tenth of train/ is held out as the
test split, and it says so). Pillow decodes them (the images extra), upright and at 8 bits a
channel whatever their mode (16-bit images scaled, not clipped); they have one size, or --size HxW resizes them
all, by --resize squash (the default: stretched), crop or pad, which it says first, with how many it resized
after; the data file records the mode, and predict resizes a run's images by it. Hidden folders are left out
(and counted), folders that are links read. A file Pillow cannot read is named in one line, as are images at a
--size the memory does not take, before any is decoded. Train on the file with --data-file.

(In a checkout, python datasets/prepare.py is the same command.) Each file is written by
minibp.io.data.write, the one writer of the format (docs/data.md): groups train/ and test/ with `images`
(N, H, W, C) uint8 and `labels` (N,) int64, each with its SHA-256, the number of classes and their
names, and attributes naming the source and its checksum. Archives are checked against the official
checksums before anything is read from them (CIFAR's are pickles: nothing is unpickled from a file that
does not match); the HDF5 file is written to a temporary name and renamed, so an interrupted or failed
conversion (a full disk) never leaves a half-written file behind and keeps the one an earlier conversion
wrote, even where a library swallowed the Ctrl-C (integrity.noticed_interrupts); downloads too. A temporary
file that a killed conversion left is removed by the next one. A failure is one line on stderr: exit status 2
for a bad archive, input file, option or --out, 1 for a download or a write that failed; Ctrl-C, whenever it
comes (before the file is published: the old one kept; after: the new one whole), says what it left and exits
130.
"""
import argparse
import gzip
import pickle
import sys
import tarfile
import urllib.request
from pathlib import Path

try:  # most of a second (NumPy, h5py, CuPy): Ctrl-C meanwhile is one line and 130, as at any later moment
    import h5py
    import numpy as np

    from .io import data
    from .io import images as image_files
    from .integrity import atomic_file, file_digest, noticed_interrupts, sha256_bytes
except KeyboardInterrupt:
    print("interrupted while python3 -m minibp.prepare started: nothing was written", file=sys.stderr)
    sys.exit(130)

CIFAR = {
    "cifar10": dict(url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                    md5="c58f30108f718f92721af3b95e74349a", folder="cifar-10-batches-py",
                    train=[f"data_batch_{i}" for i in range(1, 6)], test=["test_batch"],
                    meta="batches.meta", names_key=b"label_names", labels_key=b"labels"),
    "cifar100": dict(url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                     md5="eb9058c3a382ffc7106e4002c42a8d85", folder="cifar-100-python",
                     train=["train"], test=["test"], meta="meta", names_key=b"fine_label_names",
                     labels_key=b"fine_labels"),
}
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian package dataset-fashion-mnist
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
# sha256 of each decompressed IDX file: the data itself, however it was gzipped (Debian recompresses)
FASHION_MNIST = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot"]


class DataError(ValueError):
    """An archive or file that is missing, corrupt, truncated or not the expected one, or an --out that is not
    a folder: a bad input or option (exit status 2). A download or a write that fails is an OSError (1)."""


def download(url, destination):
    """Fetch url to destination atomically, printing progress."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {url}", flush=True)
    progress = False
    try:
        with atomic_file(destination) as tmp, urllib.request.urlopen(url, timeout=60) as response, \
                open(tmp, "wb") as out:
            total, done = int(response.headers.get("Content-Length") or 0), 0
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
                done += len(block)
                if total:
                    print(f"\r  {done / 2**20:.1f} / {total / 2**20:.1f} MiB", end="", flush=True)
                    progress = True
    except OSError as e:
        raise OSError(f"could not download {url}: {e}") from None
    finally:  # however it ended (an error, Ctrl-C), what is said next starts on a line of its own
        if progress:
            print(flush=True)
    return destination


def _write(out, source, splits, **options):
    """data.write of {split: (images, labels)} to out, with the options (classes, name, class_names, attrs);
    what it refuses is a DataError naming the source the arrays came from."""
    try:
        return data.write(out, train=splits["train"], test=splits["test"], **options)
    except ValueError as e:
        raise DataError(f"{source}: {e}") from None


# ----------------------------------------------------------------------------- CIFAR

def convert_cifar(name, archive, out, *, expected_md5=None):
    """Convert an official CIFAR 'python version' archive into out (HDF5). expected_md5 defaults to the
    official checksum; pass another only for an archive you built yourself (the tests do)."""
    spec = CIFAR[name]
    archive = Path(archive)
    if not archive.is_file():
        raise DataError(f"no archive at {archive}")
    expected_md5 = expected_md5 or spec["md5"]
    md5 = file_digest(archive, "md5")
    if md5 != expected_md5:
        raise DataError(f"{archive} has md5 {md5}, not {expected_md5}: the download is corrupt, truncated or not "
                        f"the official {name} archive. Delete it and run this script again.")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            def member(stem):
                try:
                    handle = tar.extractfile(f"{spec['folder']}/{stem}")
                except KeyError:
                    raise DataError(f"{archive} has no member {spec['folder']}/{stem}: not a {name} archive") from None
                return pickle.load(handle, encoding="bytes")  # safe: the archive matched its checksum

            names = [n.decode() for n in member(spec["meta"])[spec["names_key"]]]
            splits = {}
            for split in ("train", "test"):
                parts = [member(stem) for stem in spec[split]]
                rows = np.concatenate([np.asarray(p[b"data"], np.uint8) for p in parts])
                labels = np.concatenate([np.asarray(p[spec["labels_key"]], np.int64) for p in parts])
                if rows.ndim != 2 or rows.shape[1] != 3072:
                    raise DataError(f"{archive}: {split} data of shape {rows.shape} is not CIFAR's (N, 3072)")
                # rows are 1024 red, 1024 green, 1024 blue values of a 32x32 image: to NHWC
                splits[split] = (rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels)
    except (tarfile.TarError, EOFError, OSError, pickle.UnpicklingError, KeyError) as e:
        raise DataError(f"{archive} is corrupt or truncated ({type(e).__name__}: {e})") from None
    return _write(out, archive, splits, classes=len(names), name=name, class_names=names,
                 attrs=dict(source=spec["url"], archive_md5=md5))


# ----------------------------------------------------------------------------- Fashion-MNIST

def read_idx(path, *, expected_sha256=None):
    """The array in a (gzipped) IDX file, its magic and shape checked, and the sha256 of its bytes."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path} is corrupt or truncated ({type(e).__name__}: {e})") from None
    if len(raw) < 8 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) != header + int(np.prod(shape)):
        raise DataError(f"{path} holds {len(raw) - header} bytes of data where its header promises shape {shape}: "
                        "truncated or corrupt")
    sha256 = sha256_bytes(raw)
    if expected_sha256 is not None and sha256 != expected_sha256:
        raise DataError(f"{path} has content sha256 {sha256}, not the official {expected_sha256}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape), sha256


def convert_fashion_mnist(source_dir, out, *, verify=True):
    """Convert the four IDX files in source_dir (gzipped or not) into out (HDF5)."""
    source_dir = Path(source_dir)
    arrays, digests = {}, {}
    for stem, sha256 in FASHION_MNIST.items():
        candidates = [source_dir / (stem + ".gz"), source_dir / stem]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise DataError(f"{source_dir} has no {stem}.gz (or {stem})")
        arrays[stem], digests[stem] = read_idx(path, expected_sha256=sha256 if verify else None)
    splits = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        # (N, 28, 28) grey images: one channel, NHWC
        splits[split] = (arrays[f"{prefix}-images-idx3-ubyte"][..., None], arrays[f"{prefix}-labels-idx1-ubyte"])
    return _write(out, source_dir, splits, classes=len(FASHION_MNIST_CLASSES), name="fashion-mnist",
                 class_names=FASHION_MNIST_CLASSES,
                 attrs=dict(source=str(source_dir), idx_sha256=np.array([f"{k} {v}" for k, v in digests.items()],
                                                                         dtype=h5py.string_dtype())))


# ----------------------------------------------------------------------------- command line

def out_folder(path):
    """The --out folder, made if it is not there; DataError if it is not a folder or cannot be made."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DataError(f"--out {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"--out {path}: cannot make the folder ({e.strerror})") from None
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m minibp.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=data.DATASETS + ("folder",),
                        help="a public data set, or folder: a folder of your images, DIR")
    parser.add_argument("folder", nargs="?", metavar="DIR", help="folder: the folder of images (DIR/train/CLASS/*.png)")
    parser.add_argument("--out", help="folder for <dataset>.h5 (default: data); folder: the .h5 file to write "
                                      "(default: data/<DIR's name>.h5)")
    parser.add_argument("--size", metavar="HxW", help="folder: resize every image to H x W pixels (default: keep "
                                                     "their size, which must be one)")
    parser.add_argument("--resize", choices=list(image_files.RESIZES), help="folder, with --size: how an image "
                        "of another size becomes H x W: squash (the default: stretched, the aspect ignored), crop "
                        "(scaled to cover, the centre cut out) or pad (scaled to fit, centred on black)")
    parser.add_argument("--archive", help="CIFAR: an official archive already on disk (else it is downloaded)")
    parser.add_argument("--source", help="Fashion-MNIST: a folder with the four IDX files (default: "
                                         f"{FASHION_MNIST_DIR} if present, else downloaded)")
    args = parser.parse_args(argv)
    if (args.dataset == "folder") != (args.folder is not None) or (args.size and args.dataset != "folder"):
        print("error: give a folder of images as `folder DIR`, and --size with it alone", file=sys.stderr)
        return 2
    if args.resize and not args.size:
        print("error: --resize needs --size HxW: it says how images of another size become that size",
              file=sys.stderr)
        return 2
    if args.dataset == "folder":
        out = Path(args.out or Path("data") / f"{Path(args.folder).resolve().name}.h5")
    else:
        out = Path(args.out or "data") / f"{args.dataset}.h5"
    before = _identity(out)
    try:
        with noticed_interrupts() as interrupted:  # a Ctrl-C that a library swallowed too, whenever it came
            status = _prepare(args, out)
            if interrupted():
                raise KeyboardInterrupt
        return status
    except KeyboardInterrupt:
        return _interrupted(out, before)


def _prepare(args, out):
    """main's work, once its arguments are read: the exit status."""
    try:
        if args.dataset == "folder":
            convert_folder(args.folder, out, size=args.size, resize=args.resize or image_files.RESIZE)
        else:
            _prepare_public(args, out)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a download or a write that failed
        print(f"error: {e}", file=sys.stderr)
        return 1
    with h5py.File(out, "r") as f:
        sizes = ", ".join(f"{split} {f[split]['images'].shape}" for split in data.SPLITS if split in f)
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f.attrs.get("class_names", [])]
    print(f"wrote {out}: {sizes}" + (f"; classes {', '.join(names)}" if args.dataset == "folder" else ""))
    return 0


def convert_folder(folder, out, *, size=None, resize=image_files.RESIZE):
    """A folder of images in the common layout (module docstring) into the data file out; size: 'HxW' or None;
    resize: squash, crop or pad (images.RESIZES). What is wrong with the folder, an image or --out is a DataError
    naming it."""
    try:
        size = None if size is None else image_files.parse_size(size)
        if Path(out).suffix != ".h5":
            raise ValueError(f"--out {out}: give the .h5 file to write")
        if Path(out).is_dir():
            raise ValueError(f"--out {out} is a folder: give the .h5 file to write")
        return data.write_folder(out, folder, size=size, resize=resize)
    except (FileNotFoundError, ValueError) as e:  # a missing folder, a bad image or --size
        raise DataError(str(e)) from None


def _prepare_public(args, out):
    """A public data set into out: downloaded where it is not on disk, checked, converted."""
    folder = Path(args.out or "data")
    out_folder(folder)  # before any download
    if args.dataset.startswith("cifar"):
        archive = args.archive or folder / Path(CIFAR[args.dataset]["url"]).name
        if not Path(archive).is_file():
            download(CIFAR[args.dataset]["url"], archive)
        convert_cifar(args.dataset, archive, out)
    else:
        source = Path(args.source) if args.source else FASHION_MNIST_DIR
        if not args.source and not source.is_dir():
            source = folder / "fashion-mnist-idx"
            for stem in FASHION_MNIST:
                if not (source / f"{stem}.gz").is_file():
                    download(FASHION_MNIST_URL + stem + ".gz", source / f"{stem}.gz")
        convert_fashion_mnist(source, out)


def _identity(path):
    """What tells one file at path from another (the one a conversion renames over it), or None."""
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns, status.st_size


def _interrupted(out, before):
    """Ctrl-C: one line on what is on disk, and the shell's status for SIGINT (128 + 2). Downloads and the
    HDF5 file are written to temporary names and renamed whole (atomic_file), so an interrupted one has
    left nothing behind; a download that finished before is kept, and used by the next run."""
    if _identity(out) != before:  # the rename had happened: the new file is there whole
        print(f"interrupted after {out} was written (whole)", file=sys.stderr)
    elif before is not None:
        print(f"interrupted: {out} was not replaced (the one there is as it was)", file=sys.stderr)
    else:
        print(f"interrupted: {out} was not written", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
