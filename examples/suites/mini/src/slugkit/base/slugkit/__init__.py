"""Readable URL slugs from titles."""

from slugkit.slug import slugify, unique_slug

__all__ = ["slugify", "unique_slug"]
__version__ = "1.1.0"
