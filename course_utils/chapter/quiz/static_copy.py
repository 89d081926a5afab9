"""Widgets that carry a static copy of themselves, for the places that cannot run widgets.

GitHub, nbviewer and a notebook opened without its kernel draw no ipywidgets: a widget's output there
is empty. The quiz and the checklist widget therefore display one bundle with three entries:

- ``application/vnd.jupyter.widget-view+json``: the live widget, which JupyterLab 4, Colab
  (ipywidgets 7.7) and VS Code prefer whenever their widget manager knows the model;
- ``text/markdown`` and ``text/plain``: what the widget shows, without what must stay hidden (a quiz's
  answers), which static renderers and terminals use; the text in lines of at most 100 characters.

``scripts/notebooks/write_notebooks.py clean`` removes the first entry before a commit and keeps the other two.
"""

from __future__ import annotations

import ipywidgets as widgets
import re
from collections.abc import Callable

from course_utils.show.tables import wrap

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def md_escape(text: str) -> str:
    """Text for Markdown: characters that would format are escaped outside `code` spans."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        parts[i] = re.sub(r"([\\*_~<>\[\]])", r"\\\1", parts[i])
    return "`".join(parts)


class StaticCopy:
    """Mixin for an ipywidgets widget (put it first among the bases): `text()` and `markdown()` give its
    static copy, which goes into the widget's display bundle and is its repr.

    The bundle is built here rather than by ipywidgets: 7.x (Colab's) has no ``Widget._repr_mimebundle_``,
    only ``_ipython_display_``, which IPython prefers; both 7 and 8 front ends read this widget-view
    message (version_major 2).
    """

    def text(self) -> str:
        """The static copy as plain text."""
        raise NotImplementedError

    def markdown(self) -> str:
        """The static copy as Markdown."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return wrap(self.text())

    def _repr_mimebundle_(self, **kwargs) -> dict:
        """The widget view plus its static copy (the text in lines of at most 100 characters; Markdown is
        reflowed by whatever renders it)."""
        return {WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": self.model_id},
                "text/plain": wrap(self.text()), "text/markdown": self.markdown()}

    def _ipython_display_(self) -> None:
        """Display the bundle once (also what a cell's last expression does)."""
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)
        if hasattr(self, "_handle_displayed"):  # ipywidgets 7: its own display fires on_displayed callbacks
            self._handle_displayed()


class CopiedVBox(StaticCopy, widgets.VBox):
    """A VBox whose static copy is what two functions return when it is displayed (its state then)."""

    def __init__(self, children, text: Callable[[], str], markdown: Callable[[], str], **kwargs):
        self._text, self._markdown = text, markdown
        super().__init__(children, **kwargs)

    def text(self) -> str:
        return self._text()

    def markdown(self) -> str:
        return self._markdown()
