"""The package version, in one place (imported without importing the package's API)."""

__version__ = "0.1.0"
