"""A worked solution, or a closing's conclusion, that shows only when the learner asks for it (issue 30: nothing given away).

`show_solution` (course_utils.exercises) displays a `SolutionReveal`: a "Show the worked solution" button,
and nothing else until it is pressed. The solution is computed on the press, so it is in no output, no
widget state and no static copy before that: Run All, the committed notebook, GitHub and nbviewer show
the button's static copy, which says how to ask. The explicit call `show_solution(name, base, reveal=True)`
returns the solution itself (course_utils.chapter.exercises.Shown).

`AnswerReveal` does the same for notebooks 00-06's "What we measured": the Markdown above it asks the question,
and the closing_NN text shows on "Show what we measured".
"""

from __future__ import annotations

import ipywidgets as widgets
from collections.abc import Callable

from course_utils.chapter.quiz.static_copy import StaticCopy

BUTTON = "Show the worked solution"


class SolutionReveal(StaticCopy, widgets.VBox):
    """A button that shows a worked solution (HTML from `solution_html()`, computed on the press) below it."""

    def __init__(self, notebook: str, solution_html: Callable[[], str], base_name: str = "base"):
        self.notebook, self._solution_html, self.base_name = notebook, solution_html, base_name
        self.button = widgets.Button(description=BUTTON, tooltip="Try the exercise first: this shows the answer")
        self.button.add_class("course-solution-button")
        self.solution = widgets.HTML("")
        self.solution.add_class("course-solution")
        self.button.on_click(lambda _: self.reveal())
        super().__init__([self.button, self.solution])

    @property
    def revealed(self) -> bool:
        return bool(self.solution.value)

    def reveal(self) -> None:
        """What the button does: show the solution, and hide the button."""
        self.solution.value = self._solution_html().replace("<details>", "<details open>", 1)
        self.button.layout.display = "none"

    def _how_to_ask(self) -> str:
        return (f'show_solution("{self.notebook}", {self.base_name}, reveal=True)')

    def text(self) -> str:
        return (f'Worked solution: hidden until you ask. Try the exercise first; then run this cell in Jupyter or '
                f'Colab and press "{BUTTON}", or run {self._how_to_ask()}.')

    def markdown(self) -> str:
        return (f'*Worked solution: hidden until you ask.* Try the exercise first; then run this cell in Jupyter '
                f'or Colab and press **{BUTTON}**, or run `{self._how_to_ask()}`.')


class AnswerReveal(StaticCopy, widgets.VBox):
    """Notebooks 00-06's "What we measured": a conclusion that shows only when the learner asks for it, after the
    Markdown above has asked the question. `answer()` (a closing_NN call) is computed on the press and printed below
    the button (Output.append_stdout), so Run All, the committed notebook and its static copy hold the question's
    prompt to answer first, not the answer."""

    def __init__(self, answer: Callable[[], str], button: str = "Show what we measured"):
        self._answer, self.label = answer, button
        self.button = widgets.Button(description=button, tooltip="Answer the question above first")
        self.button.add_class("course-answer-button")
        self.output = widgets.Output()
        self.output.add_class("course-answer")
        self.button.on_click(lambda _: self.reveal())
        super().__init__([self.button, self.output])

    @property
    def revealed(self) -> bool:
        return bool(self.output.outputs)

    def reveal(self) -> None:
        """What the button does: print the answer below it, and hide the button."""
        self.output.append_stdout(self._answer().rstrip("\n") + "\n")
        self.button.layout.display = "none"

    def text(self) -> str:
        return (f'{self.label}: hidden until you ask. Answer the question above first; then run this cell in Jupyter '
                f'or Colab and press "{self.label}".')

    def markdown(self) -> str:
        return (f'*{self.label}: hidden until you ask.* Answer the question above first; then run this cell in '
                f'Jupyter or Colab and press **{self.label}**.')
