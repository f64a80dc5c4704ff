"""The bounds every chat template renders under, and the error for going past one.

A GGUF's template is code the model file brings; these keep one render from freezing the
server, eating its memory or outliving its request. Sizes are counted as characters of text
plus 8 for each entry of a list or dict (a rough byte count), repeats counted every time.
"""

from __future__ import annotations

from edge_infer.errors import ChatTemplateError, InvalidRequest

MAX_SECONDS = 3.0  # wall time of one render, checked at every loop step, call, filter and operator
MAX_OUTPUT = 8 * 2**20  # characters one render may write (macros and {% set %} blocks included)
MAX_VALUE = 8 * 2**20  # size of any one value a template makes (a string, a list, a dict)
MAX_MARKED = 4 * MAX_OUTPUT  # request text held apart in one encode, with what a template derives from it
MAX_INT_BITS = 8192  # an integer a template computes with ** or *
MAX_WIDTH = 100_000  # a width or count argument (center, indent, batch, ...): Jinja's range() limit
MAX_SOURCE = 2**20  # characters of the template itself


class ChatTemplateLimit(ChatTemplateError, InvalidRequest):
    """A chat template went past one of its bounds (time, output, a value's size, an integer's
    size, nesting); the message names the bound. A request that makes its template do so is a
    400; a template that does so on a sample conversation at load refuses the model."""
