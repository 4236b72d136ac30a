"""A griffe extension for the API reference: the docstrings cross-reference in reStructuredText roles
(``:func:`convert```), which Markdown would print as they are; each becomes a code span of the name."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):`~?([^`]+)`")


class RstRoles(griffe.Extension):
    """Rewrite ``:role:`name``` as ```name``` in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)
