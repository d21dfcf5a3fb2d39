"""The test suite, a package: shared helpers are imported as ``from tests.helpers import ...``."""
