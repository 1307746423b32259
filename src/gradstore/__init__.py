"""gradstore: a content-addressed gradient store on IPFS."""

__version__ = "0.1.0"
