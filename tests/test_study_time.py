"""Every notebook under 30 minutes for a learner, by the teaching review's count (course_utils/chapter/study_time.py:
prose at 200 words a minute, 2 s per output line, the default path's time on a free T4 from the shipped T4
check, 1 minute per quiz question, 3 minutes per exercise), computed from the committed notebook.

Notebooks 07 and 08 are over it until they are split (issue 30: 07 into the complete recipe and what comes
after training, 08 into its four changes and Unsloth, the roof and the tries): their tests are strict xfails,
so that the split's commit has to take the marks away.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils.chapter.study_time import LIMIT_MIN, output_lines, prose_words, quiz_questions, study_time

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SPLIT_TO_DO = {
    "07_complete_recipe": "over 30 min until split (issue 30): the chapter's script and what comes after training "
                          "in one notebook; the checklist, the memory table and the planner's picks in another",
    "08_beyond_the_recipe": "over 30 min until split (issue 30): the four changes beyond the recipe in one "
                            "notebook; Unsloth, the FLOP roof, the tries and the chapter quiz in another",
}


def _param(path: Path):
    reason = SPLIT_TO_DO.get(path.stem)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.parametrize("path", [_param(p) for p in NOTEBOOKS])
def test_a_notebook_takes_under_30_minutes(path):
    count = study_time(path)
    print(count)
    assert count.minutes <= LIMIT_MIN, str(count)


def test_every_part_of_the_count_is_there():
    for path in NOTEBOOKS:
        count = study_time(path)
        assert count.words > 300 and count.output_lines > 50 and count.questions >= 5, str(count)
        assert count.exercises == 1, str(count)
        assert (count.t4_run_s > 0) == (path.stem != "09_more_than_one_gpu"), str(count)  # 09 has no T4 record
    chapter = study_time(ROOT / "notebooks" / "08_beyond_the_recipe.ipynb")
    assert chapter.questions > 10  # its own quiz and the chapter quiz


def test_the_counting_rules():
    assert prose_words("**Try it**: a [link](https://x.y/z?q=1) and 1,200<!--{{ n() }}--> records\n\n| a | b |\n|---|---|") == 9  # Try it a link and 1,200 records a b
    cell = {"outputs": [{"output_type": "stream", "name": "stdout", "text": ["one\n", "two\n"]},
                        {"output_type": "display_data", "data": {"image/png": "...", "text/plain": ["<Figure size 1x1>"]}},
                        {"output_type": "execute_result", "data": {"text/html": ["<table>"], "text/plain": ["a\nb\nc"]}}]}
    assert output_lines(cell) == 5
    assert quiz_questions('show_chapter_quiz(n=4)\nshow_quiz("00_where_memory_goes")') == 4 + 7
