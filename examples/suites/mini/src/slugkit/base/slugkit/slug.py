"""Turning titles into slugs."""

import re

_APOSTROPHES = re.compile(r"['\u2019]")
_NOT_ALLOWED = re.compile(r"[^a-z0-9]+")


def slugify(text, separator="-", max_length=None, lowercase=True):
    """A slug for ``text``: runs of anything but letters and digits become one ``separator``.

    ``max_length`` limits the slug's length; apostrophes are dropped (``don't`` -> ``dont``).
    With ``lowercase=False`` the letters keep their case.
    """
    if max_length is not None and max_length < 1:
        raise ValueError("max_length must be at least 1")
    text = _APOSTROPHES.sub("", text)
    if lowercase:
        text = text.lower()
        slug = _NOT_ALLOWED.sub(separator, text)
    else:
        slug = re.sub(r"[^A-Za-z0-9]+", separator, text)
    slug = slug.strip(separator)
    if max_length is not None:
        slug = slug[:max_length]
    return slug


def unique_slug(text, existing, **options):
    """A slug for ``text`` that is not in ``existing``: ``-2``, ``-3``, ... appended as needed."""
    base = slugify(text, **options)
    separator = options.get("separator", "-")
    candidate = base
    number = 2
    while candidate in existing:
        candidate = f"{base}{separator}{number}"
        number += 1
    return candidate
