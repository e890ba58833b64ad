"""edgec runtime: replays a compiled manifest's static schedule on one or more devices."""

import logging

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION"]

logger = logging.getLogger(__name__)
logger.addHandler(logging.NullHandler())  # a library stays quiet unless the application configures logging

MANIFEST_FORMAT = "edgec.manifest"
MANIFEST_VERSION = 1
