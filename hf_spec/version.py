"""hf-spec's version (the package's ``hf_spec.__version__``), in a module of its own so that code below the
package root (model cards, remote code) reads it without importing the root."""

__version__ = "0.1.0"
