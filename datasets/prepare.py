"""The checkout's command for minibp.prepare (python -m minibp.prepare is the same, from any install):
download public data sets and convert them to the HDF5 files minibp trains from.

    python datasets/prepare.py fashion-mnist            # python datasets/prepare.py --help says more

This is a script, not a package: `datasets` on sys.path is often the Hugging Face package, so nothing
imports this folder by name.
"""
import sys

from minibp.prepare import main

if __name__ == "__main__":
    sys.exit(main())
