"""minibp's version, written once: the package's __version__, setup.cfg's (version = attr:), and the producer an
export names in its files."""
VERSION = "0.1.0"
