"""A worked solution, or a closing's conclusion, that shows only when the learner asks for it (issue 30: nothing given away).

`show_solution` (course_utils.exercises) displays a `SolutionReveal`: a "Show the worked solution" button,
and nothing else until it is pressed. The solution is computed on the press, so it is in no output, no
widget state and no static copy before that: Run All, the committed notebook, GitHub and nbviewer show
the button's static copy, which says how to ask. The explicit call `show_solution(name, base, reveal=True)`
returns the solution itself (course_utils.chapter.exercises.Shown).

`AnswerReveal` does the same for the notebooks' "What we measured": the Markdown above it asks the question,
and the closing_NN text shows on "Show what we measured".
"""

from __future__ import annotations

import ipywidgets as widgets
from collections.abc import Callable

from course_utils.chapter.quiz.static_copy import StaticCopy

BUTTON = "Show the worked solution"


class _Reveal(StaticCopy, widgets.VBox):
    """A button, and below it `shown` (a widget), empty until the button is pressed; the press calls `_show()`
    and hides the button. Subclasses say what is shown and how (text(), markdown(): the static copy)."""

    def __init__(self, label: str, tooltip: str, css: str, shown):
        self.label, self.shown = label, shown
        self.button = widgets.Button(description=label, tooltip=tooltip)
        self.button.add_class(f"{css}-button")
        shown.add_class(css)
        self.button.on_click(lambda _: self.reveal())
        super().__init__([self.button, shown])

    def reveal(self) -> None:
        """What the button does: show what it hides, and hide the button."""
        self._show()
        self.button.layout.display = "none"

    def _show(self) -> None:
        raise NotImplementedError


class SolutionReveal(_Reveal):
    """A button that shows a worked solution (HTML from `solution_html()`, computed on the press) below it."""

    def __init__(self, notebook: str, solution_html: Callable[[], str], base_name: str = "base"):
        self.notebook, self._solution_html, self.base_name = notebook, solution_html, base_name
        self.solution = widgets.HTML("")
        super().__init__(BUTTON, "Try the exercise first: this shows the answer", "course-solution", self.solution)

    @property
    def revealed(self) -> bool:
        return bool(self.solution.value)

    def _show(self) -> None:
        self.solution.value = self._solution_html().replace("<details>", "<details open>", 1)

    def _how_to_ask(self) -> str:
        return (f'show_solution("{self.notebook}", {self.base_name}, reveal=True)')

    def text(self) -> str:
        return (f'Worked solution: hidden until you ask. Try the exercise first; then run this cell in Jupyter or '
                f'Colab and press "{BUTTON}", or run {self._how_to_ask()}.')

    def markdown(self) -> str:
        return (f'*Worked solution: hidden until you ask.* Try the exercise first; then run this cell in Jupyter '
                f'or Colab and press **{BUTTON}**, or run `{self._how_to_ask()}`.')


class AnswerReveal(_Reveal):
    """A notebook's "What we measured": a conclusion that shows only when the learner asks for it, after the
    Markdown above has asked the question. `answer()` (a closing_NN call) is computed on the press and printed below
    the button (Output.append_stdout), so Run All, the committed notebook and its static copy hold the question's
    prompt to answer first, not the answer."""

    def __init__(self, answer: Callable[[], str], button: str = "Show what we measured"):
        self._answer = answer
        self.output = widgets.Output()
        super().__init__(button, "Answer the question above first", "course-answer", self.output)

    @property
    def revealed(self) -> bool:
        return bool(self.output.outputs)

    def _show(self) -> None:
        self.output.append_stdout(self._answer().rstrip("\n") + "\n")

    def text(self) -> str:
        return (f'{self.label}: hidden until you ask. Answer the question above first; then run this cell in Jupyter '
                f'or Colab and press "{self.label}".')

    def markdown(self) -> str:
        return (f'*{self.label}: hidden until you ask.* Answer the question above first; then run this cell in '
                f'Jupyter or Colab and press **{self.label}**.')
